"""The drain cycle against a real PostgreSQL: outcomes, retries, leases, fences, limits."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer import Job, run_once
from drainer.db import ClaimPipeline, Queries
from drainer.drain.clock import BatchClock
from drainer.job import Retry
from drainer.producer import JobSpec, enqueue, enqueue_many
from drainer.registry import Registry
from drainer.settings import Settings
from tests.conftest import make_settings


def jobs_table(s: Settings) -> sql.Identifier:
    return sql.Identifier(s.schema_name, s.table)


def fetch(conn: psycopg.Connection[Any], s: Settings, job_id: int) -> dict[str, Any]:
    cur = conn.execute(sql.SQL(
        "SELECT status, attempts, max_attempts, run_at - now() AS retry_in, locked_until, "
        "last_error, finished_at FROM {} WHERE id = %s").format(jobs_table(s)), [job_id])
    row = cur.fetchone()
    assert row is not None and cur.description is not None
    return dict(zip([c.name for c in cur.description], row, strict=True))


def test_failure_is_retried_with_backoff_then_failed(migrated: Settings, registry: Registry,
                                                      conn: psycopg.Connection[Any]) -> None:
    @registry.task("smtp")
    def send(job: Job) -> None:
        raise ConnectionError("SMTP 451: try again later")

    job_id = enqueue(conn, "smtp", {"to": "x"}, max_attempts=2, schema=migrated.schema_name)
    assert job_id is not None
    report = run_once(migrated, registry=registry)
    assert (report.claimed, report.retried, report.failed) == (1, 1, 0)
    row = fetch(conn, migrated, job_id)
    assert (row["status"], row["attempts"], row["locked_until"]) == ("queued", 1, None)
    # the article: first failure waits 20 s (10 s * 2^1)
    assert timedelta(seconds=18) < row["retry_in"] <= timedelta(seconds=20)
    assert row["last_error"].startswith("ConnectionError: SMTP 451: try again later")
    assert "Traceback" in row["last_error"] and "in send" in row["last_error"]
    assert report.next_due_at is not None and report.remaining_due == 0

    conn.execute(sql.SQL("UPDATE {} SET run_at = now()").format(jobs_table(migrated)))
    report = run_once(migrated, registry=registry)
    assert (report.claimed, report.retried, report.failed) == (1, 0, 1)
    row = fetch(conn, migrated, job_id)
    assert (row["status"], row["attempts"]) == ("failed", 2)
    assert row["finished_at"] is not None


def test_backoff_doubles_and_is_capped(migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    q = Queries(conn, migrated.schema_name, migrated.table)
    ids = [enqueue(conn, "b", {}, max_attempts=50, schema=migrated.schema_name)
           for _ in range(3)]
    conn.execute(sql.SQL("UPDATE {} SET status = 'running', attempts = v.a FROM "
                         "(VALUES (%s::bigint, 2), (%s::bigint, 3), (%s::bigint, 30)) v(id, a) "
                         "WHERE {}.id = v.id").format(jobs_table(migrated), jobs_table(migrated)),
                 ids)
    # fenced on the claim's token: these rows were never claimed, fence 0
    rows = q.fail_many(ids, [0, 0, 0], ["e", "e", "e"], [None, None, None], 10.0, 3600.0)
    assert {r[1] for r in rows} == {"queued"}
    waits = [fetch(conn, migrated, i)["retry_in"].total_seconds() for i in ids]  # type: ignore[arg-type]
    assert 38 < waits[0] <= 40 and 78 < waits[1] <= 80 and 3590 < waits[2] <= 3600


def test_reaper_requeues_and_fails_at_max_attempts(migrated: Settings, registry: Registry,
                                                   conn: psycopg.Connection[Any]) -> None:
    ran: list[int] = []

    @registry.task("r")
    def handler(job: Job) -> None:
        ran.append(job.id)

    a = enqueue(conn, "r", {}, max_attempts=3, schema=migrated.schema_name)
    b = enqueue(conn, "r", {}, max_attempts=1, schema=migrated.schema_name)
    # both claimed (and started: charged) by a worker that died: leases expired
    conn.execute(sql.SQL("UPDATE {} SET status = 'running', attempts = 1, charged = true, "
                         "locked_until = now() - interval '1 second'").format(
                             jobs_table(migrated)))
    report = run_once(migrated, registry=registry)
    assert report.reaped == 2
    assert ran == [a]
    assert fetch(conn, migrated, a)["status"] == "done"
    assert fetch(conn, migrated, a)["attempts"] == 2
    row_b = fetch(conn, migrated, b)  # type: ignore[arg-type]
    assert (row_b["status"], row_b["last_error"]) == ("failed", "lease expired")


def test_heartbeat_keeps_a_job_past_its_lease(migrated: Settings, registry: Registry,
                                              conn: psycopg.Connection[Any]) -> None:
    settings = migrated.model_copy(update={"lease": 1.0})
    seen_leases: list[datetime] = []

    @registry.task("long")
    def handler(job: Job) -> None:
        for _ in range(6):
            time.sleep(0.5)
            row = conn.execute(sql.SQL("SELECT locked_until FROM {} WHERE id = %s").format(
                jobs_table(settings)), [job.id]).fetchone()
            assert row is not None
            seen_leases.append(row[0])
        assert not job.cancelled.is_set()

    job_id = enqueue(conn, "long", {}, schema=settings.schema_name)
    assert job_id is not None
    report = run_once(settings, registry=registry)
    assert (report.succeeded, report.lost) == (1, 0)
    assert max(seen_leases) > min(seen_leases) + timedelta(seconds=1)
    assert fetch(conn, settings, job_id)["attempts"] == 1


def test_extend_reports_a_lost_lease(migrated: Settings, registry: Registry,
                                     conn: psycopg.Connection[Any]) -> None:
    result: dict[str, Any] = {}

    @registry.task("x")
    def handler(job: Job) -> None:
        result["first"] = job.extend(60)
        # someone else took the job: the reaper returned it and another worker claimed it
        conn.execute(sql.SQL("UPDATE {} SET attempts = attempts + 1, fence = fence + 1 "
                             "WHERE id = %s").format(
            jobs_table(migrated)), [job.id])
        result["second"] = job.extend(60)
        result["cancelled"] = job.cancelled.is_set()

    job_id = enqueue(conn, "x", {}, schema=migrated.schema_name)
    assert job_id is not None
    report = run_once(migrated, registry=registry)
    assert result == {"first": True, "second": False, "cancelled": True}
    assert report.lost == 1 and report.succeeded == 0
    row = fetch(conn, migrated, job_id)
    assert (row["status"], row["attempts"]) == ("running", 2)  # the new owner's


def test_slow_worker_completion_writes_nothing(migrated: Settings, registry: Registry,
                                               conn: psycopg.Connection[Any]) -> None:
    """The article's UPDATE 0: a late completion after the job was reaped and re-claimed."""

    @registry.task("slow")
    def handler(job: Job) -> None:
        # while we work, our lease expires, the job is reaped and claimed again
        conn.execute(sql.SQL("UPDATE {} SET locked_until = now() + interval '5 min', "
                             "attempts = attempts + 1, fence = fence + 1 WHERE id = %s").format(
                                 jobs_table(migrated)), [job.id])

    job_id = enqueue(conn, "slow", {}, schema=migrated.schema_name)
    assert job_id is not None
    report = run_once(migrated, registry=registry)
    assert (report.succeeded, report.lost) == (0, 1)
    row = fetch(conn, migrated, job_id)
    assert (row["status"], row["attempts"]) == ("running", 2)
    # the new owner (attempt 2) completes it
    q = Queries(conn, migrated.schema_name, migrated.table)
    assert q.complete_many([job_id], [2]) == {job_id}  # its fence: the second claim
    assert fetch(conn, migrated, job_id)["status"] == "done"


def test_transaction_mode_commits_with_completion(migrated: Settings, registry: Registry,
                                                  conn: psycopg.Connection[Any]) -> None:
    ledger = sql.Identifier(migrated.schema_name, "ledger")
    conn.execute(sql.SQL("CREATE TABLE {} (job_id bigint, amount int)").format(ledger))

    @registry.task("tx", transaction=True)
    def handler(job: Job) -> None:
        assert job.conn is not None
        job.conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(ledger),
                         [job.id, job.payload["amount"]])
        if job.payload["amount"] < 0:
            raise ValueError("negative amount")

    good = enqueue(conn, "tx", {"amount": 5}, schema=migrated.schema_name)
    bad = enqueue(conn, "tx", {"amount": -1}, schema=migrated.schema_name)
    report = run_once(migrated, registry=registry)
    assert (report.claimed, report.succeeded, report.retried) == (2, 1, 1)
    rows = conn.execute(sql.SQL("SELECT job_id FROM {}").format(ledger)).fetchall()
    assert rows == [(good,)]  # the failing handler's write rolled back
    assert fetch(conn, migrated, good)["status"] == "done"  # type: ignore[arg-type]
    bad_row = fetch(conn, migrated, bad)  # type: ignore[arg-type]
    assert bad_row["status"] == "queued" and "negative amount" in bad_row["last_error"]


def test_async_handlers(migrated: Settings, registry: Registry,
                        conn: psycopg.Connection[Any]) -> None:
    done: list[int] = []

    @registry.task("a")
    async def handler(job: Job) -> None:
        await asyncio.sleep(0.001)
        done.append(job.id)

    @registry.task("a_slow", timeout=0.2)
    async def slow(job: Job) -> None:
        await asyncio.sleep(5)

    enqueue_many(conn, [JobSpec("a", {}) for _ in range(20)] + [JobSpec("a_slow", {})],
                 schema=migrated.schema_name)
    started = time.monotonic()
    report = run_once(migrated.model_copy(update={"concurrency": 4}), registry=registry)
    assert len(done) == 20 and report.succeeded == 20 and report.retried == 1
    assert time.monotonic() - started < 4
    err = conn.execute(sql.SQL("SELECT last_error FROM {} WHERE queue = 'a_slow'").format(
        jobs_table(migrated))).fetchone()
    assert err is not None and "TimeoutError" in err[0]


def test_sync_timeout_abandons_a_hung_handler(migrated: Settings, registry: Registry,
                                              conn: psycopg.Connection[Any]) -> None:
    release = threading.Event()

    @registry.task("hang", timeout=0.3)
    def hang(job: Job) -> None:
        release.wait(10)

    @registry.task("fine")
    def fine(job: Job) -> None:
        pass

    enqueue_many(conn, [JobSpec("hang", {}), *[JobSpec("fine", {}) for _ in range(5)]],
                 schema=migrated.schema_name)
    report = run_once(migrated, registry=registry)
    release.set()
    assert (report.succeeded, report.retried) == (5, 1)
    err = conn.execute(sql.SQL("SELECT last_error FROM {} WHERE queue = 'hang'").format(
        jobs_table(migrated))).fetchone()
    assert err is not None and "timeout of 0.3s" in err[0]


def test_other_queues_are_untouched(migrated: Settings, registry: Registry,
                                    conn: psycopg.Connection[Any]) -> None:
    @registry.task("mine")
    def handler(job: Job) -> None:
        pass

    other = enqueue(conn, "theirs", {}, schema=migrated.schema_name)
    enqueue(conn, "mine", {}, schema=migrated.schema_name)
    conn.execute(sql.SQL("INSERT INTO {} (queue, payload, status, attempts, locked_until) "
                         "VALUES ('theirs', '{{}}', 'running', 1, now() - interval '1 h')")
                 .format(jobs_table(migrated)))
    report = run_once(migrated, registry=registry)
    assert (report.claimed, report.reaped) == (1, 0)
    row = fetch(conn, migrated, other)  # type: ignore[arg-type]
    assert (row["status"], row["attempts"]) == ("queued", 0)
    left = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE queue = 'theirs' AND "
                                "status = 'running'").format(jobs_table(migrated))).fetchone()
    assert left == (1,)


def test_queue_subset_and_unknown_queue(migrated: Settings, registry: Registry) -> None:
    from drainer.errors import ConfigError

    @registry.task("a")
    def a(job: Job) -> None:
        pass

    with pytest.raises(ConfigError, match="no handler for queue 'zzz'"):
        run_once(migrated.model_copy(update={"queues": ["zzz"]}), registry=registry)
    with pytest.raises(ConfigError, match="no handlers registered"):
        run_once(migrated, registry=Registry())


def test_priority_then_run_at(migrated: Settings, registry: Registry,
                              conn: psycopg.Connection[Any]) -> None:
    order: list[str] = []

    @registry.task("p")
    def handler(job: Job) -> None:
        order.append(job.payload["name"])

    past = datetime.now(timezone.utc) - timedelta(minutes=5)
    enqueue(conn, "p", {"name": "low-old"}, run_at=past, schema=migrated.schema_name)
    enqueue(conn, "p", {"name": "high"}, priority=10, schema=migrated.schema_name)
    enqueue(conn, "p", {"name": "low-new"}, schema=migrated.schema_name)
    run_once(migrated.model_copy(update={"batch_size": 1}), registry=registry)
    assert order == ["high", "low-old", "low-new"]


def test_limits_stop_claiming_and_report_what_is_left(migrated: Settings, registry: Registry,
                                                      conn: psycopg.Connection[Any]) -> None:
    @registry.task("l")
    def handler(job: Job) -> None:
        time.sleep(0.01)

    enqueue_many(conn, [JobSpec("l", {}) for _ in range(100)], schema=migrated.schema_name)
    report = run_once(migrated.model_copy(update={"max_jobs": 15}), registry=registry)
    assert (report.claimed, report.succeeded, report.deadline_hit) == (15, 15, True)
    assert report.stopped_by == "max_jobs" and report.remaining_due == 85
    report = run_once(migrated.model_copy(update={"max_runtime": 0.2}), registry=registry)
    assert report.deadline_hit and report.stopped_by == "max_runtime"
    assert 0 < report.succeeded < 85 and report.remaining_due == 85 - report.succeeded


def test_stop_releases_claimed_jobs_that_did_not_start(migrated: Settings, registry: Registry,
                                                       conn: psycopg.Connection[Any]) -> None:
    stop = threading.Event()

    @registry.task("s")
    def handler(job: Job) -> None:
        stop.set()  # SIGTERM arrives while the first job of the batch runs

    enqueue_many(conn, [JobSpec("s", {}) for _ in range(10)], schema=migrated.schema_name)
    report = run_once(migrated, registry=registry, stop=stop)
    assert (report.claimed, report.succeeded, report.released) == (10, 1, 9)
    assert report.stopped_by == "signal"
    rows = conn.execute(sql.SQL("SELECT status, attempts, locked_until IS NULL, count(*) "
                                "FROM {} GROUP BY 1, 2, 3 ORDER BY 1").format(
                                    jobs_table(migrated))).fetchall()
    assert rows == [("done", 1, True, 1), ("queued", 0, True, 9)]


def test_archive_deletes_only_old_done_rows_in_batches(migrated: Settings, registry: Registry,
                                                       conn: psycopg.Connection[Any]) -> None:
    @registry.task("arch")
    def handler(job: Job) -> None:
        pass

    t = jobs_table(migrated)
    conn.execute(sql.SQL(
        "INSERT INTO {} (queue, payload, status, finished_at) SELECT 'arch', '{{}}', s, "
        "now() - d FROM (VALUES ('done', interval '8 days'), ('done', interval '1 day'), "
        "('failed', interval '8 days'), ('failed', interval '40 days')) v(s, d), "
        "generate_series(1, 7)").format(t))
    report = run_once(migrated.model_copy(update={"archive_batch_size": 3}), registry=registry)
    assert report.archived == 14  # 7 old done + 7 failed older than 30 days
    rows = conn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY 1 ORDER BY 1")
                        .format(t)).fetchall()
    assert rows == [("done", 7), ("failed", 7)]


@pytest.mark.parametrize("mode", ["delete", "move"])
def test_cancelled_jobs_are_archived_after_the_failed_retention(
        mode: str, migrated: Settings, registry: Registry,
        conn: psycopg.Connection[Any]) -> None:
    @registry.task("arch")
    def handler(job: Job) -> None:
        pass

    t = jobs_table(migrated)
    conn.execute(sql.SQL(
        "INSERT INTO {} (queue, payload, status, last_error, finished_at) SELECT 'arch', "
        "'{{}}', 'cancelled', 'cancelled', now() - d FROM (VALUES (interval '40 days'), "
        "(interval '8 days')) v(d), generate_series(1, 4)").format(t))
    report = run_once(migrated.model_copy(update={"archive_mode": mode,
                                                  "archive_batch_size": 3}),
                      registry=registry)
    assert report.archived == 4  # the 4 cancelled 40 days ago (failed retention: 30 days)
    rows = conn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY 1").format(t))
    assert rows.fetchall() == [("cancelled", 4)]


def test_archive_move(migrated: Settings, registry: Registry,
                      conn: psycopg.Connection[Any]) -> None:
    @registry.task("arch")
    def handler(job: Job) -> None:
        pass

    conn.execute(sql.SQL("INSERT INTO {} (queue, payload, status, finished_at) "
                         "SELECT 'arch', '{{}}', 'done', now() - interval '9 days' "
                         "FROM generate_series(1, 5)").format(jobs_table(migrated)))
    report = run_once(migrated.model_copy(update={"archive_mode": "move"}), registry=registry)
    assert report.archived == 5
    moved = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
        sql.Identifier(migrated.schema_name, "jobs_archive"))).fetchone()
    assert moved == (5,)


def test_delete_on_complete(migrated: Settings, registry: Registry,
                            conn: psycopg.Connection[Any]) -> None:
    @registry.task("d")
    def handler(job: Job) -> None:
        pass

    enqueue_many(conn, [JobSpec("d", {}) for _ in range(25)], schema=migrated.schema_name)
    report = run_once(migrated.model_copy(update={"delete_on_complete": True}),
                      registry=registry)
    assert report.succeeded == 25
    left = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
        jobs_table(migrated))).fetchone()
    assert left == (0,)


def test_vacuum_when_dead_tuples_pass_the_threshold(migrated: Settings, registry: Registry,
                                                    conn: psycopg.Connection[Any]) -> None:
    @registry.task("v")
    def handler(job: Job) -> None:
        pass

    enqueue_many(conn, [JobSpec("v", {}) for _ in range(300)], schema=migrated.schema_name)
    settings = migrated.model_copy(update={"vacuum_threshold": 100, "batch_size": 50})
    run_once(settings, registry=registry)
    # statistics reach pg_stat_user_tables asynchronously: drain again until vacuumed
    deadline = time.monotonic() + 10
    vacuumed = False
    while not vacuumed and time.monotonic() < deadline:
        conn.execute("SELECT pg_stat_force_next_flush()")
        vacuumed = run_once(settings, registry=registry).vacuumed
        time.sleep(0.2)
    assert vacuumed
    row = conn.execute("SELECT last_vacuum FROM pg_stat_user_tables WHERE relid = "
                       "%s::regclass", [f'"{migrated.schema_name}"."jobs"']).fetchone()
    assert row is not None and row[0] is not None


def test_connections_at_most_two_and_none_after(pg_url: str, schema: str, registry: Registry,
                                                conn: psycopg.Connection[Any]) -> None:
    from drainer.migrate import migrate

    app = f"drainer-t-{uuid.uuid4().hex[:8]}"
    settings = make_settings(pg_url, schema, application_name=app, lease=0.6)
    migrate(conn, schema, "jobs")
    counts: list[int] = []

    def sessions() -> int:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name "
                           "LIKE %s", [app + "%"]).fetchone()
        assert row is not None
        return int(row[0])

    @registry.task("c")
    def handler(job: Job) -> None:
        # run past a third of the lease so the heartbeat connects; sample meanwhile
        until = time.monotonic() + 2
        while time.monotonic() < until:
            counts.append(sessions())
            if counts[-1] >= 2 and time.monotonic() > until - 1.5:
                break
            time.sleep(0.05)

    enqueue_many(conn, [JobSpec("c", {}) for _ in range(4)], schema=schema)
    report = run_once(settings.model_copy(update={"concurrency": 2}), registry=registry)
    assert report.succeeded == 4
    assert max(counts) == 2  # the work connection and the heartbeat's
    # both closed: the server forgets a backend a moment after the client hangs up
    until = time.monotonic() + 3
    while sessions() and time.monotonic() < until:
        time.sleep(0.05)
    assert sessions() == 0


def test_schema_missing_raises(pg_url: str, schema: str, registry: Registry) -> None:
    from drainer.errors import SchemaError

    @registry.task("m")
    def handler(job: Job) -> None:
        pass

    with pytest.raises(SchemaError, match="run `drainer migrate`"):
        run_once(make_settings(pg_url, schema), registry=registry)


def test_database_unreachable_raises(schema: str, registry: Registry) -> None:
    from drainer.errors import DatabaseUnavailable

    @registry.task("m")
    def handler(job: Job) -> None:
        pass

    settings = make_settings("postgresql://postgres@127.0.0.1:1/x", schema, connect_retries=1)
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable, match="after 2 attempts"):
        run_once(settings, registry=registry)
    assert time.monotonic() - started < 5


def test_a_deadlocked_combined_statement_falls_back_to_two(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL rolls a deadlock victim back whole: its jobs are written and the next
    batch claimed again with separate statements, nothing lost or run twice."""
    ran: list[int] = []

    @registry.task("d")
    def handler(job: Job) -> None:
        ran.append(job.id)

    # enough jobs for several claims: they grow to hundreds of no-op jobs after the first
    n = 5000
    enqueue_many(conn, [JobSpec("d", {}) for _ in range(n)], schema=migrated.schema_name)
    real = Queries.complete_many_and_claim
    calls = {"n": 0}

    def deadlock_once(self: Queries, *args: Any, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise psycopg.errors.DeadlockDetected("deadlock detected (simulated)")
        return real(self, *args, **kw)

    monkeypatch.setattr(Queries, "complete_many_and_claim", deadlock_once)
    in_step = migrated.model_copy(update={"pipeline_depth": 1})  # one statement at a time
    report = run_once(in_step, registry=registry)
    assert calls["n"] >= 3
    assert (report.claimed, report.succeeded, report.lost) == (n, n, 0)
    assert sorted(ran) == sorted(set(ran)) and len(ran) == n


def test_a_deadlocked_pipelined_statement_is_written_again(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipelined completion + claim that the server rolls back (a real error with the
    deadlock SQLSTATE) neither loses its completions nor stops the statements behind it."""
    ran: list[int] = []

    @registry.task("d")
    def handler(job: Job) -> None:
        ran.append(job.id)

    schema = migrated.schema_name
    conn.execute(sql.SQL(
        "CREATE FUNCTION {}() RETURNS int LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION 'deadlock detected (simulated)' USING ERRCODE = '40P01'; END $$"
    ).format(sql.Identifier(schema, "fake_deadlock")))
    enqueue_many(conn, [JobSpec("d", {}) for _ in range(95)], schema=schema)
    real = ClaimPipeline.send
    calls = {"n": 0, "failed_with": 0}

    def deadlock_once(self: ClaimPipeline, ids: list[int], *args: Any) -> None:
        calls["n"] += 1
        # the first from the third on that carries successes (claims sent ahead back to
        # back carry none)
        if calls["n"] >= 3 and ids and not calls["failed_with"]:
            saved = self.text, self.names, self.statement
            self.text = sql.SQL("SELECT {}()").format(
                sql.Identifier(schema, "fake_deadlock")).as_string(conn)
            self.names, self.statement = [], None
            calls["failed_with"] = len(ids)
            try:
                real(self, ids, *args)
            finally:
                self.text, self.names, self.statement = saved
            return
        real(self, ids, *args)

    monkeypatch.setattr(ClaimPipeline, "send", deadlock_once)
    # claims of --batch-size whatever the machine's load: a loaded disk's slow commits can
    # look like a far database, and claims grown to it would carry other counts
    monkeypatch.setattr(BatchClock, "adapted", lambda self, batch_size, most: batch_size)
    report = run_once(migrated, registry=registry)
    # it carried successes (a batch's; two batches' when the handlers ran ahead of the send
    # on a loaded machine), all written again below
    assert calls["n"] >= 5 and calls["failed_with"] >= 10
    assert (report.claimed, report.succeeded, report.lost) == (95, 95, 0)
    assert sorted(ran) == sorted(set(ran)) and len(ran) == 95
    done = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE status = 'done'").format(
        sql.Identifier(schema, "jobs"))).fetchone()
    assert done == (95,)


def test_a_job_that_succeeds_keeps_no_error_of_an_earlier_attempt(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any]) -> None:
    """A done row's last_error is NULL: 'lease expired' or the previous attempt's error
    would read as the outcome of the run that succeeded."""
    tries: list[int] = []

    def flaky(job: Job) -> None:
        tries.append(job.attempt)
        if len(tries) == 1:
            raise RuntimeError("first try fails")

    registry.task("flaky", retry=Retry(base=0.01, cap=0.01))(flaky)
    registry.task("reaped")(lambda job: None)
    first = enqueue(conn, "flaky", {}, schema=migrated.schema_name)
    second = enqueue(conn, "reaped", {}, schema=migrated.schema_name)
    conn.execute(sql.SQL("UPDATE {} SET last_error = 'lease expired', attempts = 1 "
                         "WHERE id = %s").format(jobs_table(migrated)), [second])
    succeeded = run_once(migrated, registry=registry).succeeded
    time.sleep(0.05)
    succeeded += run_once(migrated, registry=registry).succeeded
    assert succeeded == 2 and tries == [1, 2]
    for job_id in (first, second):
        row = fetch(conn, migrated, job_id)
        assert (row["status"], row["last_error"]) == ("done", None)
