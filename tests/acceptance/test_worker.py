"""``drainer worker`` as a real subprocess: NOTIFY latency, lost notifications, SIGTERM."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.migrate import install_notify_trigger, migrate
from drainer.settings import Settings
from tests.acceptance._proc import DrainerProcess
from tests.conftest import run_cli


def _sessions(conn: psycopg.Connection[Any], name: str) -> int:
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                       [name]).fetchone()
    assert row is not None
    return int(row[0])


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _enqueue(pg_url: str, schema: str, queue: str, payload: str = "{}") -> tuple[int, datetime]:
    """Insert a job as a producer does (plain SQL, own transaction); id and commit time."""
    with psycopg.connect(pg_url) as producer:
        row = producer.execute(sql.SQL("INSERT INTO {} (queue, payload) VALUES (%s, %s) "
                                       "RETURNING id").format(sql.Identifier(schema, "jobs")),
                               [queue, payload]).fetchone()
        producer.commit()
        committed = producer.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None and committed is not None
    return int(row[0]), committed[0]


def _job(conn: psycopg.Connection[Any], schema: str, job_id: int) -> tuple[str, datetime | None]:
    row = conn.execute(sql.SQL("SELECT status, finished_at FROM {} WHERE id = %s")
                       .format(sql.Identifier(schema, "jobs")), [job_id]).fetchone()
    assert row is not None
    return row[0], row[1]


def _start(pg_url: str, schema: str, conn: psycopg.Connection[Any], *args: str,
           **env: str) -> DrainerProcess:
    app = f"wk_{schema}"
    proc = DrainerProcess(["worker", *args], pg_url=pg_url, schema=schema,
                          DRAINER_APP="sample_jobs", DRAINER_APPLICATION_NAME=app, **env)
    proc.wait_log("listening on channel")
    # idle: the LISTEN session only, the start-up drain's connection closed
    _wait_for(lambda: _sessions(conn, app) == 0 and _sessions(conn, app + "-listen") == 1,
              10, "the worker to be idle")
    return proc


@pytest.fixture
def notify_trigger(migrated: Settings, conn: psycopg.Connection[Any]) -> Settings:
    install_notify_trigger(conn, migrated.schema_name, migrated.table)
    return migrated


@pytest.fixture
def cleanup() -> Iterator[list[DrainerProcess]]:
    procs: list[DrainerProcess] = []
    yield procs
    for p in procs:
        p.kill()


def test_notify_picks_a_job_up_within_a_second(notify_trigger: Settings, pg_url: str,
                                               conn: psycopg.Connection[Any],
                                               cleanup: list[DrainerProcess]) -> None:
    schema = notify_trigger.schema_name
    # polls 30 s apart: a pickup within 1 s can only come from the notification
    proc = _start(pg_url, schema, conn, "--min-poll-interval", "30", "--max-poll-interval",
                  "60", "--idle-timeout", "300")
    cleanup.append(proc)
    # waiting sends nothing: the LISTEN session's last state change does not move
    listen_name = f"wk_{schema}-listen"
    sql_state = "SELECT state, state_change FROM pg_stat_activity WHERE application_name = %s"
    before = conn.execute(sql_state, [listen_name]).fetchall()
    time.sleep(1.5)
    assert conn.execute(sql_state, [listen_name]).fetchall() == before
    assert before[0][0] == "idle"
    latencies = []
    for _ in range(3):
        job_id, committed = _enqueue(pg_url, schema, "noop")
        _wait_for(lambda job_id=job_id: _job(conn, schema, job_id)[0] == "done", 5,
                  "the job to be done")
        finished = _job(conn, schema, job_id)[1]
        assert finished is not None
        latencies.append((finished - committed).total_seconds())
        time.sleep(0.2)
    assert max(latencies) < 1.0, latencies
    assert proc.terminate() == 0
    stats = json.loads(proc.stdout)
    assert stats["notified_wakes"] >= 3 and stats["poll_wakes"] == 0
    assert stats["succeeded"] == 3
    err = proc.stderr()
    assert "keeps the database compute awake" in err
    assert "needs a direct connection" in err and "transaction-mode pooler" in err
    assert "shorter than the compute's idle timeout (300s)" in err
    assert _sessions(conn, f"wk_{schema}-listen") == 0


def test_lost_listen_connection_still_picks_the_job_up(notify_trigger: Settings, pg_url: str,
                                                       conn: psycopg.Connection[Any],
                                                       cleanup: list[DrainerProcess]) -> None:
    schema = notify_trigger.schema_name
    listen_name = f"wk_{schema}-listen"
    proc = _start(pg_url, schema, conn, "--min-poll-interval", "30", "--max-poll-interval",
                  "60")
    cleanup.append(proc)
    # as a suspend would: the worker's LISTEN connection goes away (only our own backend)
    killed = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE application_name = %s", [listen_name]).fetchall()
    assert killed == [(True,)]
    job_id, _ = _enqueue(pg_url, schema, "noop")
    _wait_for(lambda: _job(conn, schema, job_id)[0] == "done", 10, "the job to be done")
    proc.wait_log("LISTEN connection lost")
    # it LISTENs again: the next job comes through a notification, within a second
    _wait_for(lambda: _sessions(conn, listen_name) == 1, 10, "the worker to LISTEN again")
    job2, committed = _enqueue(pg_url, schema, "noop")
    _wait_for(lambda: _job(conn, schema, job2)[0] == "done", 5, "the second job")
    finished = _job(conn, schema, job2)[1]
    assert finished is not None and (finished - committed).total_seconds() < 1.0
    assert proc.terminate() == 0
    stats = json.loads(proc.stdout)
    assert stats["reconnects"] == 1 and stats["succeeded"] == 2


def test_without_notifications_the_fallback_poll_backs_off_and_resets(
        pg_url: str, schema: str, own_database_url: str, cleanup: list[DrainerProcess]
        ) -> None:
    # a database of its own: NOTIFY channels are per database, and other tests' inserts
    # (with the trigger) notify the same channel name; here no notification may come at all
    db_url = own_database_url
    with psycopg.connect(db_url, autocommit=True) as conn:
        migrate(conn, schema, "jobs")  # no NOTIFY trigger: every notification is "lost"
        proc = _start(db_url, schema, conn, "--min-poll-interval", "0.2",
                      "--max-poll-interval", "0.8", DRAINER_LOG_LEVEL="DEBUG")
        cleanup.append(proc)

        def wakes_now() -> list[tuple[datetime, str, datetime]]:
            """Each wake: when its drain ended (its "woke on" line), why, and when it began
            (less the drain's own duration_s, which is what grows under load)."""
            found: list[tuple[datetime, str, datetime]] = []
            took = 0.0
            for r in list(proc.logs):
                if r.get("msg") == "drain finished":
                    took = float(r["duration_s"])
                elif str(r.get("msg", "")).startswith("woke on "):
                    at = datetime.fromisoformat(r["ts"].replace("Z", "+00:00"))
                    found.append((at, r["wake"], at - timedelta(seconds=took)))
            return found

        # the start wake and three empty polls (0.4, 0.8, 0.8 s apart: the cap reached)
        _wait_for(lambda: len(wakes_now()) >= 4, 15, "three empty polls")
        job_id, committed = _enqueue(db_url, schema, "noop")
        _wait_for(lambda: _job(conn, schema, job_id)[0] == "done", 3, "a poll to find the job")
        finished = _job(conn, schema, job_id)[1]
        assert finished is not None and (finished - committed).total_seconds() < 1.0  # <= max
        # the poll that found the job and two after it (back to the minimum, doubling again)
        _wait_for(lambda: sum(1 for at, _, _ in wakes_now() if at >= committed) >= 3, 5,
                  "two polls after the one that found the job")
        assert proc.terminate() == 0
    wakes = wakes_now()
    assert [w for _, w, _ in wakes[:3]] == ["start", "poll", "poll"], wakes
    # the wait between one drain's end and the next one's start: the poll interval
    gaps = [(b_began - a).total_seconds() for (a, _, _), (_, _, b_began) in pairwise(wakes)]
    # empty: 0.4, 0.8, 0.8 ... (doubling from 0.2, capped at 0.8); from one drain's end to
    # the next one's start, the slack is for the wake-up and the log lines only
    assert 0.35 <= gaps[0] <= 0.65 and 0.75 <= gaps[1] <= 1.05, gaps
    found = next(i for i, (_, w, _) in enumerate(wakes) if w == "poll" and
                 wakes[i][0] >= committed.astimezone(wakes[i][0].tzinfo))
    after = gaps[found:]
    assert after and 0.15 <= after[0] <= 0.45, (found, gaps)  # work found: back to 0.2
    assert max(gaps) <= 1.05, gaps
    assert json.loads(proc.stdout)["succeeded"] == 1


def test_sigterm_lets_the_running_job_finish(notify_trigger: Settings, pg_url: str,
                                             conn: psycopg.Connection[Any],
                                             cleanup: list[DrainerProcess]) -> None:
    schema = notify_trigger.schema_name
    conn.execute(sql.SQL("CREATE TABLE {} (job_id bigint, attempt int, pid int, note text)")
                 .format(sql.Identifier(schema, "executions")))
    proc = _start(pg_url, schema, conn, "--max-poll-interval", "60")
    cleanup.append(proc)
    job_id, _ = _enqueue(pg_url, schema, "sleepy", '{"sleep": 1}')
    # claimed ('running') is not started: wait for the handler's own record of its start
    executions = sql.Identifier(schema, "executions")

    def started() -> bool:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE job_id = %s AND "
                                   "note = 'start'").format(executions), [job_id]).fetchone()
        return row is not None and row[0] > 0

    _wait_for(started, 5, "the job to start")
    assert proc.terminate() == 0
    assert _job(conn, schema, job_id)[0] == "done"
    assert json.loads(proc.stdout)["succeeded"] == 1
    assert _sessions(conn, f"wk_{schema}") + _sessions(conn, f"wk_{schema}-listen") == 0


@pytest.mark.parametrize(("args", "needle"), [
    (["--min-poll-interval", "0"], "--min-poll-interval must be positive"),
    (["--max-poll-interval", "soon"], "--max-poll-interval: not a duration"),
    (["--min-poll-interval", "10", "--max-poll-interval", "5"], "must not be longer"),
])
def test_bad_poll_intervals_exit_2(args: list[str], needle: str, pg_url: str,
                                   schema: str) -> None:
    r = run_cli(["worker", *args], pg_url=pg_url, schema=schema, DRAINER_APP="sample_jobs",
                timeout=30)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_delayed_job_is_run_when_it_comes_due(notify_trigger: Settings, pg_url: str,
                                                conn: psycopg.Connection[Any],
                                                cleanup: list[DrainerProcess]) -> None:
    schema = notify_trigger.schema_name
    proc = _start(pg_url, schema, conn, "--min-poll-interval", "30", "--max-poll-interval",
                  "60")
    cleanup.append(proc)
    with psycopg.connect(pg_url, autocommit=True) as producer:
        row = producer.execute(sql.SQL(
            "INSERT INTO {} (queue, payload, run_at) VALUES "
            "('noop', '{{}}', now() + interval '1.5 seconds') RETURNING id, run_at")
            .format(sql.Identifier(schema, "jobs"))).fetchone()
    assert row is not None
    job_id, run_at = row
    _wait_for(lambda: _job(conn, schema, job_id)[0] == "done", 6, "the delayed job")
    finished = _job(conn, schema, job_id)[1]
    assert finished is not None
    assert 0 <= (finished - run_at).total_seconds() < 1.0  # not early, not at the 30 s poll
    assert proc.terminate() == 0


def test_missing_schema_exits_4(pg_url: str, schema: str) -> None:
    r = run_cli(["worker"], pg_url=pg_url, schema=schema, DRAINER_APP="sample_jobs",
                timeout=30)
    assert r.returncode == 4, r.stderr
    assert "drainer migrate" in r.stderr and "Traceback" not in r.stderr
