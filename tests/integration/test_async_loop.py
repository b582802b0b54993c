"""Async handlers on one long-lived event loop per drain: shared clients, tasks in flight,
timeouts, stop, and claims sized to the free handler slots."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
from psycopg import sql

from drainer import Job, run_once
from drainer.producer import JobSpec, enqueue_many
from drainer.registry import Registry
from drainer.settings import Settings


def _status(conn: psycopg.Connection[Any], s: Settings) -> dict[str, int]:
    rows = conn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY 1").format(
        sql.Identifier(s.schema_name, s.table))).fetchall()
    return {str(k): int(v) for k, v in rows}


def test_one_event_loop_serves_every_job_and_shares_objects(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any]) -> None:
    # made once, outside any job, as a module-level httpx.AsyncClient would be: it binds
    # to the first loop that uses it, so it only works if every job runs on that loop
    lock: asyncio.Lock | None = None
    loops: set[int] = set()
    in_flight = 0
    most = 0

    @registry.task("shared")
    async def handler(job: Job) -> None:
        nonlocal lock, in_flight, most
        loops.add(id(asyncio.get_running_loop()))
        if lock is None:
            lock = asyncio.Lock()
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.05)
        async with lock:  # an asyncio.Lock used from another loop raises RuntimeError
            await asyncio.sleep(0)
        in_flight -= 1

    enqueue_many(conn, [JobSpec("shared", {}) for _ in range(120)],
                 schema=migrated.schema_name)
    started = time.monotonic()
    report = run_once(migrated.model_copy(update={"concurrency": 40}), registry=registry)
    elapsed = time.monotonic() - started
    assert report.succeeded == 120 and report.retried == 0 and report.failed == 0
    assert len(loops) == 1
    # --concurrency is tasks in flight: 40 at once, never more
    assert 20 <= most <= 40
    assert elapsed < 3  # 3 waves of 50 ms, not 120 x 50 ms
    assert _status(conn, migrated) == {"done": 120}


def test_async_timeout_cancels_the_task_and_others_go_on(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any]) -> None:
    cancelled = threading.Event()

    @registry.task("hang", timeout=0.2)
    async def hang(job: Job) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    @registry.task("quick")
    async def quick(job: Job) -> None:
        await asyncio.sleep(0.01)

    enqueue_many(conn, [JobSpec("hang", {})] + [JobSpec("quick", {}) for _ in range(30)],
                 schema=migrated.schema_name)
    started = time.monotonic()
    report = run_once(migrated.model_copy(update={"concurrency": 8}), registry=registry)
    assert time.monotonic() - started < 5
    assert report.succeeded == 30 and report.retried == 1
    assert cancelled.wait(2)
    err = conn.execute(sql.SQL("SELECT last_error FROM {} WHERE queue = 'hang'").format(
        sql.Identifier(migrated.schema_name, migrated.table))).fetchone()
    assert err is not None and "TimeoutError" in err[0]


def test_stop_releases_unstarted_async_jobs_and_lets_running_finish(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any]) -> None:
    stop = threading.Event()
    started_jobs = 0

    @registry.task("s")
    async def handler(job: Job) -> None:
        nonlocal started_jobs
        started_jobs += 1
        if started_jobs == 4:
            stop.set()
        await asyncio.sleep(0.2)

    enqueue_many(conn, [JobSpec("s", {}) for _ in range(50)], schema=migrated.schema_name)
    report = run_once(migrated.model_copy(update={"concurrency": 4, "grace": 5}),
                      registry=registry, stop=stop)
    # the running ones finish within the grace period; nothing is lost or left locked
    assert report.lost == 0
    status = _status(conn, migrated)
    assert status.get("done", 0) == report.succeeded >= 4
    assert status.get("done", 0) + status.get("queued", 0) == 50
    running = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE status = 'running'").format(
        sql.Identifier(migrated.schema_name, migrated.table))).fetchone()
    assert running == (0,)


def test_sync_claims_follow_the_free_handler_slots(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any]) -> None:
    # batch_size 10 would keep at most 10 of 100 threads busy a round trip
    most = 0
    in_flight = 0
    lock = threading.Lock()

    @registry.task("t")
    def handler(job: Job) -> None:
        nonlocal most, in_flight
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        time.sleep(0.1)
        with lock:
            in_flight -= 1

    enqueue_many(conn, [JobSpec("t", {}) for _ in range(300)], schema=migrated.schema_name)
    started = time.monotonic()
    report = run_once(migrated.model_copy(update={"concurrency": 100}), registry=registry)
    assert report.succeeded == 300
    assert most >= 80
    assert time.monotonic() - started < 6


def test_run_start_reaps_and_the_reaped_job_is_claimed_in_the_same_run(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any]) -> None:
    # the first statement reaps and finds due queues from one snapshot: a job it puts back
    # to queued must still count as due, or the run would end without claiming it
    done: list[str] = []
    for name in ("a", "b", "c"):
        registry.task(name)(lambda job: done.append(job.queue))
    table = sql.Identifier(migrated.schema_name, migrated.table)
    conn.execute(sql.SQL("INSERT INTO {} (queue, status, attempts, locked_until) VALUES "
                         "('b', 'running', 1, now() - interval '1 minute')").format(table))
    report = run_once(migrated, registry=registry)
    assert report.reaped == 1 and report.succeeded == 1 and done == ["b"]
    assert _status(conn, migrated) == {"done": 1}
