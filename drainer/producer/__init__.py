"""Put jobs in the table, inside the caller's transaction.

Each function's statements are written once, as the steps of a generator
(:mod:`drainer.producer._steps`), and run by a sync or an async driver: ``enqueue`` and
``enqueue_async`` send the same INSERT, ``enqueue_many`` and ``enqueue_many_async`` the same
COPY (:mod:`drainer.producer._bulk`).
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable, Mapping
from datetime import datetime
from typing import Any, overload

import psycopg
from psycopg.types.json import Jsonb

from drainer.job import DEFAULT_MAX_ATTEMPTS
from drainer.producer._bulk import plan
from drainer.producer._spec import (
    EnqueueResult,
    JobSpec,
    check,
    check_run_at,
    statement,
    trace_context,
)
from drainer.producer._steps import Execute, Steps, atomic, run, run_async
from drainer.settings import DEFAULT_SCHEMA, DEFAULT_TABLE

__all__ = ["EnqueueResult", "JobSpec", "check_run_at", "enqueue",
           "enqueue_async", "enqueue_many", "enqueue_many_async"]


def _one(queue: str, payload: Any, run_at: datetime | None, priority: int, max_attempts: int,
         dedup_key: str | None, schema: str, table: str) -> Steps[int | None]:
    """The INSERT of one job, checked before it is sent; its id, None for a duplicate."""
    check(queue, max_attempts)
    check_run_at(run_at)
    row = yield Execute(statement("enqueue", schema, table), {
        "queue": queue, "payload": Jsonb(payload), "run_at": run_at, "priority": priority,
        "max_attempts": max_attempts, "dedup_key": dedup_key,
        "trace_context": trace_context()}, fetch=True)
    return None if row is None else int(row[0])


@overload
def enqueue(
    conn: psycopg.Connection[Any], queue: str, payload: Any, *, run_at: datetime | None = ...,
    priority: int = ..., max_attempts: int = ..., dedup_key: str | None = ...,
    schema: str = ..., table: str = ...,
) -> int | None: ...


@overload
def enqueue(
    conn: psycopg.AsyncConnection[Any], queue: str, payload: Any, *,
    run_at: datetime | None = ..., priority: int = ..., max_attempts: int = ...,
    dedup_key: str | None = ..., schema: str = ..., table: str = ...,
) -> Coroutine[Any, Any, int | None]: ...


def enqueue(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    queue: str,
    payload: Any,
    *,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    dedup_key: str | None = None,
    schema: str = DEFAULT_SCHEMA,
    table: str = DEFAULT_TABLE,
) -> int | Coroutine[Any, Any, int | None] | None:
    """Insert one job and return its id, or None when ``dedup_key`` is already queued/running.

    Runs on ``conn`` as it is: inside the caller's open transaction the job commits or
    rolls back with the caller's data (the point of a table queue). With a
    ``psycopg.AsyncConnection`` it returns the awaitable of :func:`enqueue_async`, as
    psycopg's own methods do: ``await enqueue(aconn, ...)``.
    """
    if isinstance(conn, psycopg.AsyncConnection):
        return enqueue_async(conn, queue, payload, run_at=run_at, priority=priority,
                             max_attempts=max_attempts, dedup_key=dedup_key, schema=schema,
                             table=table)
    return run(conn.cursor(), _one(queue, payload, run_at, priority, max_attempts, dedup_key,
                                   schema, table))


async def enqueue_async(
    conn: psycopg.AsyncConnection[Any],
    queue: str,
    payload: Any,
    *,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    dedup_key: str | None = None,
    schema: str = DEFAULT_SCHEMA,
    table: str = DEFAULT_TABLE,
) -> int | None:
    """:func:`enqueue` on a ``psycopg.AsyncConnection``: the same statement, awaited."""
    return await run_async(conn.cursor(), _one(queue, payload, run_at, priority, max_attempts,
                                               dedup_key, schema, table))


@overload
def enqueue_many(
    conn: psycopg.Connection[Any], jobs: Iterable[JobSpec | Mapping[str, Any]], *,
    schema: str = ..., table: str = ...,
) -> EnqueueResult: ...


@overload
def enqueue_many(
    conn: psycopg.Connection[Any], jobs: Iterable[Any], *, queue: str | None,
    run_at: datetime | None = ..., priority: int = ..., max_attempts: int = ...,
    dedup_key: str | None = ..., schema: str = ..., table: str = ...,
) -> EnqueueResult: ...


@overload
def enqueue_many(
    conn: psycopg.AsyncConnection[Any], jobs: Iterable[JobSpec | Mapping[str, Any]], *,
    schema: str = ..., table: str = ...,
) -> Coroutine[Any, Any, EnqueueResult]: ...


@overload
def enqueue_many(
    conn: psycopg.AsyncConnection[Any], jobs: Iterable[Any], *, queue: str | None,
    run_at: datetime | None = ..., priority: int = ..., max_attempts: int = ...,
    dedup_key: str | None = ..., schema: str = ..., table: str = ...,
) -> Coroutine[Any, Any, EnqueueResult]: ...


def enqueue_many(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    jobs: Iterable[Any],
    *,
    queue: str | None = None,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    dedup_key: str | None = None,
    schema: str = DEFAULT_SCHEMA,
    table: str = DEFAULT_TABLE,
) -> EnqueueResult | Coroutine[Any, Any, EnqueueResult]:
    """Insert many jobs through COPY, in the caller's transaction.

    ``jobs`` holds JobSpecs (or mappings of their fields); with ``queue=``, it holds
    payloads instead, one job each on that queue, all with the same ``run_at``,
    ``priority``, ``max_attempts`` and ``dedup_key`` (the options of :func:`enqueue`).

    Jobs without a dedup_key go straight into the table; when any job has one, the
    batch is staged in a temporary table (dropped at commit) and inserted with
    ON CONFLICT DO NOTHING, so duplicates are skipped and counted. With a
    ``psycopg.AsyncConnection`` it returns the awaitable of :func:`enqueue_many_async`.
    """
    if isinstance(conn, psycopg.AsyncConnection):
        return enqueue_many_async(conn, jobs, queue=queue, run_at=run_at, priority=priority,
                                  max_attempts=max_attempts, dedup_key=dedup_key,
                                  schema=schema, table=table)
    cur = conn.cursor()
    steps = plan(cur, jobs, queue, run_at, priority, max_attempts, dedup_key, schema, table)
    if steps is None:
        return EnqueueResult(0, 0)
    with atomic(conn):
        return run(cur, steps)


async def enqueue_many_async(
    conn: psycopg.AsyncConnection[Any],
    jobs: Iterable[Any],
    *,
    queue: str | None = None,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    dedup_key: str | None = None,
    schema: str = DEFAULT_SCHEMA,
    table: str = DEFAULT_TABLE,
) -> EnqueueResult:
    """:func:`enqueue_many` on a ``psycopg.AsyncConnection``: the same statements and COPY
    text, awaited."""
    cur = conn.cursor()
    steps = plan(cur, jobs, queue, run_at, priority, max_attempts, dedup_key, schema, table)
    if steps is None:
        return EnqueueResult(0, 0)
    async with atomic(conn):
        return await run_async(cur, steps)
