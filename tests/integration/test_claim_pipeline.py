"""ClaimPipeline: completion + claim statements in flight on one connection, read in order."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer import Job, run_once
from drainer.db import ClaimPipeline, Queries
from drainer.producer import JobSpec, enqueue_many
from drainer.registry import Registry
from drainer.settings import Settings


def _statuses(conn: psycopg.Connection[Any], schema: str) -> dict[str, int]:
    rows = conn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY 1").format(
        sql.Identifier(schema, "jobs"))).fetchall()
    return {r[0]: r[1] for r in rows}


@pytest.mark.parametrize("prepared", [True, False])
def test_statements_in_flight_are_read_in_order_and_each_commits(
        migrated: Settings, conn: psycopg.Connection[Any], pg_url: str, prepared: bool) -> None:
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("a", {"i": i, "text": "é\t\\ \"q\""}) for i in range(7)],
                 schema=schema)
    with psycopg.connect(pg_url, autocommit=True) as work:
        if not prepared:
            work.prepare_threshold = None
        q = Queries(work, schema, "jobs")
        pipe = ClaimPipeline(q)
        pipe.send([], [], "a", 3, 60)
        pipe.send([], [], "a", 3, 60)
        assert pipe.in_flight == 2
        w1, first = pipe.receive()
        # the first claim committed on its own, whether or not the second has run yet
        assert _statuses(conn, schema)["running"] in (3, 6)
        pipe.send([r.id for r in first], [r.attempts for r in first], "a", 3, 60)
        w2, second = pipe.receive()
        w3, third = pipe.receive()
        assert pipe.in_flight == 0
        assert (w1, w2) == (set(), set()) and w3 == {r.id for r in first}
        assert [len(first), len(second), len(third)] == [3, 3, 1]
        ids = [r.id for r in first + second + third]
        assert ids == sorted(ids) and len(set(ids)) == 7
        assert first[0].payload == {"i": 0, "text": "é\t\\ \"q\""}
        assert all(r.queue == "a" and r.attempts == 1 and r.locked_until > r.run_at
                   for r in first + second + third)
        # the connection is free again for ordinary statements
        plans = work.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                             "WHERE name LIKE 'drainer_complete%'").fetchall()
        # prepared: the generic plan every time (no re-planning), and no setting left behind
        assert plans == ([(3, 0)] if prepared else [])
        # the statement asking for it is prepared too: neither is parsed again each time
        names = work.execute("SELECT count(*) FROM pg_prepared_statements "
                             "WHERE name LIKE 'drainer_%'").fetchone()
        assert names == ((2,) if prepared else (0,))
        assert work.execute("SHOW plan_cache_mode").fetchone() == ("auto",)
    assert _statuses(conn, schema) == {"done": 3, "running": 4}


def test_an_error_fails_only_its_statement(migrated: Settings, conn: psycopg.Connection[Any],
                                           pg_url: str) -> None:
    """A statement that fails rolls back alone; the one behind it (after its Sync) runs."""
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("a", {}) for _ in range(4)], schema=schema)
    with psycopg.connect(pg_url, autocommit=True) as work:
        q = Queries(work, schema, "jobs")
        pipe = ClaimPipeline(q)
        pipe.send([], [], "a", 2, 60)
        pipe.send([], [], "a", -1, 60)  # LIMIT must not be negative: an error
        pipe.send([], [], "a", 2, 60)
        _, first = pipe.receive()
        with pytest.raises(psycopg.errors.InvalidRowCountInLimitClause):
            pipe.receive()
        _, third = pipe.receive()
        assert len(first) == 2 and len(third) == 2
        assert work.execute("SELECT 1").fetchone() == (1,)
    assert _statuses(conn, schema) == {"running": 4}


def test_a_large_claim_coming_back_does_not_block_a_large_completion_going_out(
        migrated: Settings, conn: psycopg.Connection[Any], pg_url: str) -> None:
    """In libpq's pipeline mode a client that only writes while the server writes back
    deadlocks: the server stops reading while its output is not read, and both ends wait
    with full buffers. Here a claim of 1,024 rows (8 MiB) is on its way back while a
    completion with 8 MiB of results goes out, over client socket buffers of 64 KiB (the
    server's own take at most 4 MiB on Linux): sending must read."""
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("a", {"pad": "x" * 8192}) for _ in range(128 + 1024)],
                 schema=schema)
    result = '"' + "r" * 65536 + '"'
    done: list[tuple[set[int], list[Any], list[Any]] | BaseException] = []
    with psycopg.connect(pg_url, autocommit=True) as work:
        with socket.fromfd(work.pgconn.socket, socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        pipe = ClaimPipeline(Queries(work, schema, "jobs"))
        pipe.send([], [], "a", 128, 60)
        _, first = pipe.receive()

        def drain() -> None:
            try:
                pipe.send([], [], "a", 1024, 60)
                pipe.send([r.id for r in first], [r.fence or 0 for r in first], "a", 0, 60,
                          results=[result] * len(first))
                _, second = pipe.receive()
                written, third = pipe.receive()
                done.append((written, second, third))
            except BaseException as exc:  # raised again in the test's thread
                done.append(exc)

        worker = threading.Thread(target=drain, daemon=True)
        worker.start()
        worker.join(30)
        if worker.is_alive():  # end the session, so that the blocked thread ends too
            conn.execute("SELECT pg_terminate_backend(%s)", (work.info.backend_pid,))
            worker.join(10)
            pytest.fail("the pipeline blocked: sending did not read the claim coming back")
    if isinstance(done[0], BaseException):
        raise done[0]
    written, second, third = done[0]
    assert (len(first), len(second), third) == (128, 1024, [])
    assert written == {r.id for r in first}
    assert _statuses(conn, schema) == {"done": 128, "running": 1024}
    assert conn.execute(sql.SQL("SELECT min(length(result #>> '{{}}')) FROM {} WHERE status = "
                                "'done'").format(sql.Identifier(schema, "jobs"))
                        ).fetchone() == (65536,)


def test_close_reads_what_is_left(migrated: Settings, conn: psycopg.Connection[Any],
                                  pg_url: str) -> None:
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("a", {}) for _ in range(3)], schema=schema)
    with psycopg.connect(pg_url, autocommit=True) as work:
        pipe = ClaimPipeline(Queries(work, schema, "jobs"))
        pipe.send([], [], "a", 2, 60)
        pipe.send([], [], "a", 2, 60)
        left = pipe.close()
        assert [len(r[1]) for r in left if isinstance(r, tuple)] == [2, 1]
        assert work.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_drains_alike_at_every_depth(migrated: Settings, registry: Registry,
                                     conn: psycopg.Connection[Any], depth: int) -> None:
    """Every job runs once and is written, failures included, over several queues."""
    ran: list[int] = []

    @registry.task("a")
    def a(job: Job) -> None:
        ran.append(job.id)
        if job.payload["i"] % 17 == 0:
            raise ValueError("every 17th fails")

    @registry.task("b")
    def b(job: Job) -> None:
        ran.append(job.id)

    enqueue_many(conn, [JobSpec("a" if i % 3 else "b", {"i": i}) for i in range(257)],
                 schema=migrated.schema_name)
    settings = migrated.model_copy(update={"pipeline_depth": depth})
    report = run_once(settings, registry=registry)
    failed = sum(1 for i in range(257) if i % 3 and i % 17 == 0)
    assert (report.claimed, report.succeeded, report.retried, report.lost) == (
        257, 257 - failed, failed, 0)
    assert len(ran) == len(set(ran)) == 257
    assert _statuses(conn, migrated.schema_name) == {"done": 257 - failed, "queued": failed}


def test_max_jobs_holds_with_claims_in_flight(migrated: Settings, registry: Registry,
                                             conn: psycopg.Connection[Any]) -> None:
    registry.task("a")(lambda job: None)
    enqueue_many(conn, [JobSpec("a", {}) for _ in range(100)], schema=migrated.schema_name)
    settings = migrated.model_copy(update={"max_jobs": 43, "pipeline_depth": 4})
    report = run_once(settings, registry=registry)
    assert (report.claimed, report.succeeded) == (43, 43)
    assert _statuses(conn, migrated.schema_name) == {"done": 43, "queued": 57}


def test_claimed_ahead_jobs_keep_their_lease(migrated: Settings, registry: Registry,
                                             conn: psycopg.Connection[Any]) -> None:
    """Jobs claimed while an earlier batch runs are waiting, not running: the heartbeat
    extends their leases too, so a slow job does not let its successors' leases lapse."""
    slow = threading.Event()
    seen_expired: list[int] = []

    @registry.task("a", lease=1.0)
    def a(job: Job) -> None:
        if job.payload["i"] == 25:  # fast batches first (pipelining starts), then a slow one
            slow.set()
            time.sleep(2.5)
        if job.deadline is not None and job.deadline.timestamp() < time.time():
            seen_expired.append(job.id)

    enqueue_many(conn, [JobSpec("a", {"i": i}) for i in range(60)], schema=migrated.schema_name)
    report = run_once(migrated, registry=registry)
    assert slow.is_set()
    assert (report.claimed, report.succeeded, report.lost) == (60, 60, 0)
    assert seen_expired == []
