"""What a drain costs the database: statements and connections, and the end-of-run work."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer import db, run_once
from drainer import drain as drain_cycle
from drainer.drain import start
from drainer.drain.leases import Heartbeat
from drainer.registry import Registry
from drainer.settings import Settings
from tests.conftest import make_settings


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[Any, Path]]:
    """Every connection drainer opens, with a libpq protocol trace of what it sent."""
    opened: list[tuple[Any, Path]] = []
    real = db.connect

    def connect(settings: Settings, **kw: Any) -> psycopg.Connection[Any]:
        conn = real(settings, **kw)
        path = tmp_path / f"trace{len(opened)}.txt"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT)
        conn.pgconn.trace(fd)
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        opened.append((conn, path))
        return conn

    monkeypatch.setattr(db, "connect", connect)
    return opened


def _round_trips(path: Path) -> int:
    # one ReadyForQuery from the server for each statement (autocommit, no pipeline), or for
    # each Sync (pipeline mode): the round trips
    return sum(1 for line in path.read_text().splitlines()
               if line.startswith("B") and "ReadyForQuery" in line)


def _sent(path: Path) -> list[str]:
    """The messages sent that run statements: Execute (extended protocol) or Query (simple
    protocol, which may hold several), the latter with its text."""
    out = []
    for line in ("\n" + path.read_text()).split("\nF\t")[1:]:
        kind = line.split("\t")[1] if "\t" in line else ""
        if kind.startswith("Execute") or kind.startswith("Query"):
            out.append(line)
    return out


@pytest.mark.parametrize("queues", [1, 50, 300])
def test_empty_queue_costs_two_statements_on_one_connection(
        migrated: Settings, registry: Registry, traced: list[tuple[Any, Path]],
        queues: int) -> None:
    for i in range(queues):
        registry.task(f"idle{i}")(lambda job: None)
    report = run_once(migrated, registry=registry)
    assert report.claimed == 0 and report.remaining_due == 0
    assert len(traced) == 1
    conn, path = traced[0]
    assert conn.closed
    # run_start (schema check + reap + which queues are due: none, so no claim) and
    # finish_run (archive + table health + queue summary), sent together: one round trip
    # (it was 2; before that 4: schema check, reap, claim, finish_run, with one queue and
    # 3 + one claim per queue with more)
    [query] = _sent(path)
    assert query.split("\t")[1].startswith("Query")
    # run_start sets drainer.start; claim_first and finish_run, behind it, read it
    assert "-- name" not in query and query.count("drainer.start") == 3
    assert _round_trips(path) == 1


@pytest.mark.parametrize("queues", [1, 300])
def test_empty_queue_does_little_while_the_session_is_open(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any],
        monkeypatch: pytest.MonkeyPatch, drains: list[Any], queues: int) -> None:
    """The session of an empty run is billed from connect to close: nothing is due, so no
    drain loop nor heartbeat thread is built, and no named statement is rendered while it
    is open (the one Query sent was built before connecting). With a due job the loop is
    built and drains it."""
    for i in range(queues):
        registry.task(f"idle{i}")(lambda job: None)
    beats: list[Heartbeat] = []
    real_start = Heartbeat.start
    monkeypatch.setattr(Heartbeat, "start", lambda self: (beats.append(self),
                                                           real_start(self))[1])
    rendered: list[dict[str, str]] = []

    class Recorded(drain_cycle.Reconnecting):  # the run's statements (see drain/link.py)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            rendered.append(self._sql)

    monkeypatch.setattr(drain_cycle, "Reconnecting", Recorded)
    report = run_once(migrated, registry=registry)
    assert report.claimed == 0 and report.next_due_at is None
    assert drains == [] and beats == []
    # the Query of the two (run_start, finish_run) was built before connecting
    assert rendered == [{}]
    conn.execute(sql.SQL("INSERT INTO {} (queue) VALUES ('idle0')").format(
        sql.Identifier(migrated.schema_name, "jobs")))
    report = run_once(migrated, registry=registry)
    assert report.succeeded == 1 and len(drains) == 1 and len(beats) == 1


def test_finish_run_archives_old_jobs_in_batches(pg_url: str, migrated: Settings,
                                                 conn: psycopg.Connection[Any],
                                                 registry: Registry) -> None:
    registry.task("a")(lambda job: None)
    table = sql.Identifier(migrated.schema_name, "jobs")
    conn.execute(sql.SQL(
        "INSERT INTO {} (queue, status, finished_at) "
        "SELECT 'a', s, now() - a * interval '1 day' FROM (VALUES "
        "('done', 8, 7), ('done', 1, 2), ('failed', 8, 3), ('failed', 40, 4)) "
        "AS v(s, a, n), generate_series(1, n)").format(table))
    conn.execute(sql.SQL("INSERT INTO {} (queue, run_at) VALUES ('a', now() + interval '1h')")
                 .format(table))
    settings = make_settings(pg_url, migrated.schema_name, archive_batch_size=3)
    report = run_once(settings, registry=registry)
    # done older than 7 days (7 rows, 3 a batch) and failed older than 30 days (4 rows)
    assert report.archived == 11
    left = conn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY 1 ORDER BY 1")
                        .format(table)).fetchall()
    assert left == [("done", 2), ("failed", 3), ("queued", 1)]
    assert report.remaining_due == 0 and report.next_due_at is not None


def test_finish_run_deletes_one_batch_of_each_finished_status(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    """One DELETE takes the three batches: up to batch_size done, failed and cancelled jobs
    each, counted as done and as failed (cancelled with failed); newer ones stay."""
    conn.execute(sql.SQL(
        "INSERT INTO {} (queue, status, finished_at) "
        "SELECT 'a', s, now() - a * interval '1 day' FROM (VALUES "
        "('done', 10, 3), ('done', 1, 1), ('failed', 40, 3), ('failed', 10, 1), "
        "('cancelled', 40, 3), ('cancelled', 10, 1)) AS v(s, a, n), generate_series(1, n)")
        .format(_jobs(migrated)))
    q = db.Queries(conn, migrated.schema_name, migrated.table)
    fin = q.finish_run(["a"], 7 * 86400.0, 30 * 86400.0, 2)
    assert (fin["archived_done"], fin["archived_failed"]) == (2, 4)
    left = conn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY 1 ORDER BY 1")
                        .format(_jobs(migrated))).fetchall()
    assert left == [("cancelled", 2), ("done", 2), ("failed", 2)]


def test_archive_mode_move_keeps_the_separate_statements(pg_url: str, migrated: Settings,
                                                        conn: psycopg.Connection[Any],
                                                        registry: Registry) -> None:
    registry.task("a")(lambda job: None)
    table = sql.Identifier(migrated.schema_name, "jobs")
    conn.execute(sql.SQL("INSERT INTO {} (queue, status, finished_at) "
                         "SELECT 'a', 'done', now() - interval '9 days' "
                         "FROM generate_series(1, 5)").format(table))
    settings = make_settings(pg_url, migrated.schema_name, archive_mode="move")
    report = run_once(settings, registry=registry)
    assert report.archived == 5
    moved = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
        sql.Identifier(migrated.schema_name, "jobs_archive"))).fetchone()
    assert moved == (5,)




def _vacuum_count(conn: psycopg.Connection[Any], schema: str) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute("SELECT vacuum_count FROM pg_stat_user_tables WHERE schemaname = %s "
                       "AND relname = 'jobs'", [schema]).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize(("every", "expected"), [(0, 0), (60, 2)])
def test_long_drains_vacuum_between_batches(pg_url: str, migrated: Settings,
                                            conn: psycopg.Connection[Any], registry: Registry,
                                            every: int, expected: int) -> None:
    # handlers of 3 ms: batches of 10 already run for 8 claims' round trips, so claims stay
    # at --batch-size (no-op jobs grow them to the work: one claim past 60 jobs)
    registry.task("v")(lambda job: time.sleep(0.003))
    table = sql.Identifier(migrated.schema_name, "jobs")
    conn.execute(sql.SQL("INSERT INTO {} (queue) SELECT 'v' FROM generate_series(1, 200)")
                 .format(table))
    before = _vacuum_count(conn, migrated.schema_name)
    settings = make_settings(pg_url, migrated.schema_name, vacuum_every=every,
                             vacuum_threshold=0)
    report = run_once(settings, registry=registry)
    assert report.succeeded == 200 and report.lost == 0
    # due once 60 jobs are written, done after the next flush: at 70 and 140 finished jobs
    assert _vacuum_count(conn, migrated.schema_name) - before == expected


def _jobs(s: Settings) -> sql.Identifier:
    return sql.Identifier(s.schema_name, "jobs")


def test_finish_run_behind_run_start_does_nothing_when_a_job_is_due(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    """finish_run sent behind run_start (if_idle) archives and counts only when run_start
    found nothing to claim; with a due job it reads nothing, deletes nothing, returns no
    row, and the run's end sends it again."""
    conn.execute(sql.SQL(
        "INSERT INTO {} (queue, status, finished_at) "
        "SELECT 'a', 'done', now() - interval '30 days' FROM generate_series(1, 4)")
        .format(_jobs(migrated)))
    q = db.Queries(conn, migrated.schema_name, migrated.table)
    finish = {"archive_after": 86400.0, "failed_retention": 86400.0, "batch_size": 100,
              "served": ["a"]}
    latest = drain_cycle.latest_version()
    conn.execute(sql.SQL("INSERT INTO {} (queue) VALUES ('a')").format(_jobs(migrated)))
    plan = start.Plan(migrated.schema_name, migrated.table, ["a"], latest, [None], finish)
    plan = dataclasses.replace(plan, text=start.render(plan))
    found = start.send(q, plan)
    assert found.version == latest and found.due == ["a"] and found.fin is None
    assert conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE status = 'done'")
                        .format(_jobs(migrated))).fetchone() == (4,)
    conn.execute(sql.SQL("DELETE FROM {} WHERE status = 'queued'").format(_jobs(migrated)))
    found = start.send(q, plan)
    assert found.due == [] and found.fin is not None
    assert found.fin["archived_done"] == 4 and found.fin["remaining_due"] == 0
    # alone (the end of a run that drained), finish_run runs whatever run_start said
    assert q.finish_run(["a"], 86400.0, 86400.0, 100)["archived_done"] == 0


def test_an_empty_run_with_a_paused_due_queue_counts_only_the_drained_queues(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any],
        traced: list[tuple[Any, Path]]) -> None:
    """What finish_run counted behind run_start included the paused queue's jobs: the run
    asks again at its end, for the queues it drained."""
    from drainer.ops import pause

    registry.task("a")(lambda job: None)
    registry.task("b")(lambda job: None)
    conn.execute(sql.SQL("INSERT INTO {} (queue) VALUES ('a'), ('a')").format(_jobs(migrated)))
    pause(migrated, ["a"])
    report = run_once(migrated, registry=registry)
    assert report.paused == ["a"] and report.queues == ["b"]
    assert report.claimed == 0 and report.remaining_due == 0
    assert len(traced) == 2  # pause's connection, then the run's
    assert _round_trips(traced[-1][1]) == 2


def test_the_start_query_built_before_connecting_quotes_odd_queue_names(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any]) -> None:
    """The first Query, rendered before connecting with psycopg's sql.Literal, quotes queue
    names with quotes, backslashes and braces: read back exactly (due, claimed, counted)."""
    names = ["it's", 'say "hi"', "back\\slash", "{brace}", "comma,sep"]
    ran: list[str] = []
    for name in names:
        registry.task(name)(lambda job: ran.append(job.queue))
    report = run_once(migrated, registry=registry)
    assert report.claimed == 0 and report.remaining_due == 0 and report.unserved_due == {}
    for name in names:
        conn.execute(sql.SQL("INSERT INTO {} (queue) VALUES (%s)").format(_jobs(migrated)),
                     [name])
    conn.execute(sql.SQL("INSERT INTO {} (queue, run_at) VALUES (%s, now() + interval '1h')")
                 .format(_jobs(migrated)), [names[0]])
    report = run_once(migrated, registry=registry)
    assert sorted(ran) == sorted(names) and report.succeeded == len(names)
    report = run_once(migrated, registry=registry)  # empty again: one later job
    assert report.claimed == 0 and report.remaining_due == 0
    assert report.next_due_at is not None


@pytest.mark.parametrize(("queues", "jobs"), [(1, 1), (1, 5), (300, 1), (300, 5)])
def test_a_wake_with_a_few_jobs_costs_two_round_trips(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any],
        traced: list[tuple[Any, Path]], queues: int, jobs: int) -> None:
    """The common serverless wake: a handful of jobs (fewer than a batch). run_start goes
    with the first claim (and finish_run, which does nothing then), and the completions
    with the end of the run (archive, table health, what is left): two round trips after
    connecting, at 1 and 300 queues (it was 4: run_start, the claim, the completions with
    an empty claim, finish_run)."""
    ran: list[int] = []
    for i in range(queues):
        registry.task(f"q{i}")(lambda job: ran.append(job.id))
    last = f"q{queues - 1}"
    conn.execute(sql.SQL("INSERT INTO {} (queue, status, finished_at) "
                         "SELECT %s, 'done', now() - interval '30 days' "
                         "FROM generate_series(1, 3)").format(_jobs(migrated)), [last])
    conn.execute(sql.SQL("INSERT INTO {} (queue, priority) SELECT %s, g "
                         "FROM generate_series(1, %s) g").format(_jobs(migrated)),
                 [last, jobs])
    conn.execute(sql.SQL("INSERT INTO {} (queue, run_at) VALUES (%s, now() + interval '1h')")
                 .format(_jobs(migrated)), [last])
    report = run_once(migrated, registry=registry)
    assert report.succeeded == jobs and report.lost == 0 and len(ran) == jobs
    assert ran == sorted(ran, reverse=True)  # priority order
    assert report.archived == 3 and report.remaining_due == 0
    assert report.next_due_at is not None
    conn_, path = traced[0]
    assert len(traced) == 1 and conn_.closed  # (the heartbeat connects only if needed)
    assert _round_trips(path) == 2, [m.split("\t")[1][:60] for m in _sent(path)]
    left = conn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY 1 ORDER BY 1")
                        .format(_jobs(migrated))).fetchall()
    assert left == [("done", jobs), ("queued", 1)]


def _claimed_by_sql(path: Path) -> list[str]:
    """The statements sent, by their first words (to say which claim went out)."""
    return [m.split("\t")[1][:40] for m in _sent(path)]


def test_the_first_claim_with_run_start_skips_a_paused_queue(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any],
        traced: list[tuple[Any, Path]]) -> None:
    from drainer.ops import pause

    ran: list[str] = []
    registry.task("a")(lambda job: ran.append("a"))
    registry.task("b")(lambda job: ran.append("b"))
    conn.execute(sql.SQL("INSERT INTO {} (queue) VALUES ('a'), ('b'), ('b')")
                 .format(_jobs(migrated)))
    pause(migrated, ["a"])
    report = run_once(migrated, registry=registry)
    assert ran == ["b", "b"] and report.paused == ["a"]
    # the paused queue's job is not counted as left: run_start's finish_run did nothing,
    # the one behind the completions counted the drained queue only
    assert report.remaining_due == 0
    assert _round_trips(traced[-1][1]) == 2  # (traced[0]: pause's connection)


@pytest.mark.parametrize("how", ["task", "operator"])
def test_a_limited_first_queue_is_claimed_by_the_loop(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any],
        how: str) -> None:
    """A max_running queue (the task's, or an operator's `drainer limit`, read only by the
    statement) is not claimed behind run_start: its claim takes the queue's lock."""
    from drainer.ops import limit

    running: list[int] = []
    registry.task("a", max_running=1 if how == "task" else None)(
        lambda job: running.append(conn.execute(sql.SQL(
            "SELECT count(*) FROM {} WHERE status = 'running'").format(_jobs(migrated)))
            .fetchone()[0]))  # type: ignore[index]
    if how == "operator":
        limit(migrated, ["a"], max_running=1)
    conn.execute(sql.SQL("INSERT INTO {} (queue) SELECT 'a' FROM generate_series(1, 3)")
                 .format(_jobs(migrated)))
    report = run_once(make_settings(migrated.database_url, migrated.schema_name,
                                    concurrency=4), registry=registry)
    assert report.succeeded == 3 and running == [1, 1, 1]


def test_an_outdated_table_claims_nothing_with_run_start(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any]) -> None:
    from drainer.errors import SchemaError

    registry.task("a")(lambda job: None)
    conn.execute(sql.SQL("INSERT INTO {} (queue) VALUES ('a')").format(_jobs(migrated)))
    conn.execute(sql.SQL("DELETE FROM {} WHERE version = (SELECT max(version) FROM {})")
                 .format(
        sql.Identifier(migrated.schema_name, "drainer_migrations"),
        sql.Identifier(migrated.schema_name, "drainer_migrations")))
    with pytest.raises(SchemaError, match="run `drainer migrate`"):
        run_once(migrated, registry=registry)
    assert conn.execute(sql.SQL("SELECT status, attempts, run_id FROM {}")
                        .format(_jobs(migrated))).fetchall() == [("queued", 0, None)]


def test_a_job_enqueued_while_the_few_run_keeps_the_run_going(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any],
        traced: list[tuple[Any, Path]]) -> None:
    """finish_run behind the completions runs only when nothing is due: a job enqueued
    (by another client) while the first ones ran is claimed and run, then the end."""
    ran: list[int] = []

    def handler(job: Any) -> None:
        ran.append(job.id)
        if len(ran) == 1:
            conn.execute(sql.SQL("INSERT INTO {} (queue) VALUES ('a')").format(
                _jobs(migrated)))

    registry.task("a")(handler)
    conn.execute(sql.SQL("INSERT INTO {} (queue) VALUES ('a')").format(_jobs(migrated)))
    report = run_once(migrated, registry=registry)
    assert len(ran) == 2 and report.succeeded == 2 and report.remaining_due == 0
    # run_start + claim; completions + finish_run (nothing done: a job due); claim; the
    # completions + finish_run again
    assert _round_trips(traced[0][1]) == 4, _claimed_by_sql(traced[0][1])


def test_the_first_claim_takes_what_run_start_reaped(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any],
        traced: list[tuple[Any, Path]]) -> None:
    """claim_first runs after run_start in the same transaction: a job whose lease expired
    (reaped back to queued, a suspect) is claimed by it, charged, and run."""
    registry.task("a")(lambda job: None)
    conn.execute(sql.SQL("INSERT INTO {} (queue, status, attempts, charged, locked_until, "
                         "fence) VALUES ('a', 'running', 1, true, now() - interval '1s', 1)")
                 .format(_jobs(migrated)))
    report = run_once(migrated, registry=registry)
    assert report.reaped == 1 and report.succeeded == 1 and report.lost == 0
    assert conn.execute(sql.SQL("SELECT status, attempts, fence FROM {}")
                        .format(_jobs(migrated))).fetchall() == [("done", 2, 2)]
    assert _round_trips(traced[0][1]) == 2


def test_the_first_claims_jobs_are_kept_by_the_heartbeat(
        pg_url: str, migrated: Settings, registry: Registry, conn: psycopg.Connection[Any],
        traced: list[tuple[Any, Path]]) -> None:
    """The jobs claimed with run_start are the heartbeat's from the claim on: a job that
    runs past its lease keeps it (and its outcome is written, fenced)."""
    import time as _time

    registry.task("slow", lease=1.0)(lambda job: _time.sleep(1.6))
    conn.execute(sql.SQL("INSERT INTO {} (queue) VALUES ('slow')").format(_jobs(migrated)))
    report = run_once(migrated, registry=registry)
    assert report.succeeded == 1 and report.lost == 0
    assert conn.execute(sql.SQL("SELECT status, attempts FROM {}")
                        .format(_jobs(migrated))).fetchall() == [("done", 1)]


def test_delete_on_complete_goes_with_the_end_of_the_run(
        pg_url: str, migrated: Settings, registry: Registry, conn: psycopg.Connection[Any],
        traced: list[tuple[Any, Path]]) -> None:
    registry.task("a")(lambda job: None)
    conn.execute(sql.SQL("INSERT INTO {} (queue) SELECT 'a' FROM generate_series(1, 3)")
                 .format(_jobs(migrated)))
    settings = make_settings(pg_url, migrated.schema_name, delete_on_complete=True)
    report = run_once(settings, registry=registry)
    assert report.succeeded == 3 and report.remaining_due == 0
    assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(_jobs(migrated))
                        ).fetchone() == (0,)
    assert _round_trips(traced[0][1]) == 2


def test_a_deadlock_at_the_end_of_a_few_run_writes_the_successes_alone(
        pg_url: str, migrated: Settings, registry: Registry, conn: psycopg.Connection[Any],
        traced: list[tuple[Any, Path]], caplog: pytest.LogCaptureFixture) -> None:
    """The completions and finish_run in one statement roll back together when the
    archive's delete deadlocks (another drainer archiving): the successes are written
    alone, and the run's end archives afterwards. The deadlock is the server's own error
    (SQLSTATE 40P01), raised once by a trigger on the archive's first delete."""
    registry.task("a")(lambda job: None)
    jobs, schema = _jobs(migrated), sql.Identifier(migrated.schema_name)
    conn.execute(sql.SQL("INSERT INTO {} (queue, status, finished_at) "
                         "VALUES ('a', 'done', now() - interval '30 days')").format(jobs))
    conn.execute(sql.SQL("INSERT INTO {} (queue) VALUES ('a')").format(jobs))
    conn.execute(sql.SQL("CREATE SEQUENCE {}.once").format(schema))
    conn.execute(sql.SQL(
        "CREATE FUNCTION {}.deadlock_once() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF nextval({}) = 1 THEN RAISE EXCEPTION 'deadlock detected (test)' "
        "USING ERRCODE = '40P01'; END IF; RETURN OLD; END $$").format(
            schema, sql.Literal(f"{migrated.schema_name}.once")))
    conn.execute(sql.SQL("CREATE TRIGGER deadlock_once BEFORE DELETE ON {} FOR EACH ROW "
                         "EXECUTE FUNCTION {}.deadlock_once()").format(jobs, schema))
    with caplog.at_level("WARNING", logger="drainer"):
        report = run_once(migrated, registry=registry)
    assert "deadlocked, writing the completions again" in caplog.text
    assert report.succeeded == 1 and report.lost == 0 and report.archived == 1
    assert conn.execute(sql.SQL("SELECT status FROM {}").format(jobs)).fetchall() == [("done",)]
    # run_start + claim; completions + finish_run (rolled back); the completions alone; a
    # claim that finds nothing (the loop's own end); finish_run
    assert _round_trips(traced[0][1]) == 5


def _parsed(path: Path) -> int:
    """Parse messages sent (a statement parsed again: unnamed, or prepared anew)."""
    return sum(1 for line in ("\n" + path.read_text()).split("\nF\t")[1:]
               if "\t" in line and line.split("\t")[1].startswith("Parse"))


@pytest.mark.parametrize("prepared", [True, False])
def test_a_drain_parses_its_statements_once(
        pg_url: str, migrated: Settings, registry: Registry, conn: psycopg.Connection[Any],
        traced: list[tuple[Any, Path]], prepared: bool) -> None:
    """Each statement of a drain of many claims is parsed once per session (the claim with
    its completions, and the setting that asks for its generic plan, were parsed again each
    time: a Parse a statement); with prepared statements off (a pooler) each is sent
    unnamed, so parsed each time, as the pooler requires."""
    # handlers of 0.5 ms: claims stay near --batch-size (no-op jobs grow them to a few
    # hundred, and a drain of 400 is then a handful of statements)
    registry.task("a")(lambda job: time.sleep(0.0005))
    conn.execute(sql.SQL("INSERT INTO {} (queue) SELECT 'a' FROM generate_series(1, 1500)")
                 .format(_jobs(migrated)))
    settings = make_settings(pg_url, migrated.schema_name, batch_size=10,
                             prepared_statements=prepared)
    report = run_once(settings, registry=registry)
    assert report.succeeded == 1500
    path = traced[0][1]
    statements = len(_sent(path))
    assert statements >= 50  # many claims, or the ratio below says little
    if prepared:
        assert _parsed(path) <= 0.1 * statements, (_parsed(path), statements)
    else:
        assert _parsed(path) >= 0.9 * statements, (_parsed(path), statements)


def test_drainer_sessions_do_not_jit_compile(pg_url: str, migrated: Settings) -> None:
    """JIT compiled the run's first Query and its end-of-run statement whenever the
    table's statistics costed them over jit_above_cost (40-900 ms a run for statements that
    touch a batch of rows): the session turns it off, with the timeouts."""
    with db.connect(migrated) as work:
        assert work.execute("SHOW jit").fetchone() == ("off",)
    plain = make_settings(pg_url, migrated.schema_name, session_options=False)
    with db.connect(plain) as work, psycopg.connect(pg_url) as other:
        assert work.execute("SHOW jit").fetchone() == other.execute("SHOW jit").fetchone()


def test_a_drain_whose_last_claim_comes_back_short_ends_with_its_successes(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any],
        traced: list[tuple[Any, Path]]) -> None:
    """The claims in flight came back short (the queue is dry): the successes still
    buffered go with the end of the run, one statement after the last pipelined one, not
    with a claim that finds nothing and a finish_run of its own."""
    registry.task("a")(lambda job: None)
    conn.execute(sql.SQL("INSERT INTO {} (queue) SELECT 'a' FROM generate_series(1, 3000)")
                 .format(_jobs(migrated)))
    report = run_once(migrated, registry=registry)
    assert report.succeeded == 3000 and report.archived == 0
    path = traced[0][1]
    sent = _sent(path)
    # the end: one Query (completions + finish_run) after the pipeline's Executes; before,
    # an Execute (the completions with a claim that found nothing), then finish_run's Query
    assert [m.split("\t")[1][:7] for m in sent[-2:]] == ["Execute", "Query"], sent[-2:]
    assert "finish_run" in sent[-1] or "archive" in sent[-1].lower(), sent[-1][:300]
    assert sum(1 for m in sent if m.split("\t")[1].startswith("Query")) == 2  # start, end


def test_the_end_of_run_vacuum_under_its_timeout_is_one_round_trip(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any],
        traced: list[tuple[Any, Path]]) -> None:
    """The VACUUM runs under the maintenance timeout, a session SET then RESET (VACUUM runs
    in no transaction block, nor in a Query of several statements): the three go out
    together, a Sync after each, and are read together: one round trip, not three."""
    registry.task("a")(lambda job: None)
    jobs = _jobs(migrated)
    conn.execute(sql.SQL("INSERT INTO {} (queue) SELECT 'a' FROM generate_series(1, 20)")
                 .format(jobs))
    conn.execute(sql.SQL("DELETE FROM {}").format(jobs))  # dead tuples
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")
    report = run_once(migrated.model_copy(update={"vacuum_threshold": 1}), registry=registry)
    assert report.vacuumed is True
    lines = traced[0][1].read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if "SET statement_timeout" in line)
    reset = next(i for i, line in enumerate(lines) if "RESET statement_timeout" in line)
    flight = lines[first:lines.index("F\t4\tSync", reset) + 1]
    assert [line.split("\t")[2] for line in flight].count("Sync") == 3
    assert any("VACUUM" in line for line in flight)
    assert not any(line.startswith("B") for line in flight)  # nothing read in between
