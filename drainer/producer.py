"""Put jobs in the table, inside the caller's transaction."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from drainer.db import QUERIES, identifiers
from drainer.settings import DEFAULT_MAX_ATTEMPTS, DEFAULT_SCHEMA, DEFAULT_TABLE


@dataclass(frozen=True, init=False)
class JobSpec:
    """One job to enqueue in bulk."""

    queue: str
    payload: Any
    run_at: datetime | None = None
    priority: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    dedup_key: str | None = None

    def __init__(self, queue: str, payload: Any, run_at: datetime | None = None,
                 priority: int = 0, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                 dedup_key: str | None = None) -> None:
        # What the generated frozen __init__ does, without looking up
        # object.__setattr__ once a field: bulk producers build one JobSpec per job.
        _set = object.__setattr__
        _set(self, "queue", queue)
        _set(self, "payload", payload)
        _set(self, "run_at", run_at)
        _set(self, "priority", priority)
        _set(self, "max_attempts", max_attempts)
        _set(self, "dedup_key", dedup_key)


@dataclass(frozen=True)
class EnqueueResult:
    enqueued: int
    skipped_duplicates: int


def _q(name: str, schema: str, table: str) -> sql.Composed:
    return sql.SQL(QUERIES[name]).format(**identifiers(schema, table))


def _check(queue: str, max_attempts: int) -> None:
    if not queue:
        raise ValueError("queue must be a non-empty string")
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")


def enqueue(
    conn: psycopg.Connection[Any],
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
    """Insert one job and return its id, or None when ``dedup_key`` is already queued/running.

    Runs on ``conn`` as it is: inside the caller's open transaction the job commits or
    rolls back with the caller's data (the point of a table queue).
    """
    _check(queue, max_attempts)
    row = conn.execute(_q("enqueue", schema, table), {
        "queue": queue, "payload": Jsonb(payload), "run_at": run_at, "priority": priority,
        "max_attempts": max_attempts, "dedup_key": dedup_key,
    }).fetchone()
    return None if row is None else int(row[0])


def _spec(job: JobSpec | Mapping[str, Any]) -> JobSpec:
    if isinstance(job, JobSpec):
        return job
    return JobSpec(**job)


def _atomic(conn: psycopg.Connection[Any]) -> AbstractContextManager[Any]:
    """A transaction on an autocommit connection; else the caller's, as it is.

    (``conn.transaction()`` on an idle non-autocommit connection would start a
    transaction and commit it: the jobs would no longer roll back with the caller.)
    """
    return conn.transaction() if conn.autocommit else nullcontext()


def enqueue_many(
    conn: psycopg.Connection[Any],
    jobs: Iterable[JobSpec | Mapping[str, Any]],
    *,
    schema: str = DEFAULT_SCHEMA,
    table: str = DEFAULT_TABLE,
) -> EnqueueResult:
    """Insert many jobs through COPY, in the caller's transaction.

    Jobs without a dedup_key go straight into the table; when any job has one, the
    batch is staged in a temporary table (dropped at commit) and inserted with
    ON CONFLICT DO NOTHING, so duplicates are skipped and counted.
    """
    specs = [j if type(j) is JobSpec else _spec(j) for j in jobs]
    # One pass before anything is written: the first bad job fails the batch, and the
    # pass notes which COPY the batch needs.
    timed = keyed = False
    for s in specs:
        if not s.queue or s.max_attempts < 1:
            _check(s.queue, s.max_attempts)  # raises the ValueError that names the problem
        if s.run_at is not None:
            timed = True
        if s.dedup_key is not None:
            keyed = True
    if not specs:
        return EnqueueResult(0, 0)
    if not timed and not keyed:
        # The common bulk case: run_at is left out of the COPY, so the column default
        # (now(), the transaction's start, as SELECT now() would give) fills it, and
        # dedup_key stays NULL: four columns a row instead of six, no extra round trip.
        with _atomic(conn), conn.cursor().copy(
                _q("enqueue_copy_now", schema, table)) as copy:
            copy.set_types(["text", "jsonb", "int4", "int4"])
            write = copy.write_row
            for s in specs:
                write((s.queue, Jsonb(s.payload), s.priority, s.max_attempts))
        return EnqueueResult(len(specs), 0)
    rows = [
        (s.queue, Jsonb(s.payload), s.run_at, s.priority, s.max_attempts, s.dedup_key)
        for s in specs
    ]
    types = ["text", "jsonb", "timestamptz", "int4", "int4", "text"]
    with _atomic(conn):
        cur = conn.cursor()
        if not keyed:
            if any(s.run_at is None for s in specs):
                # COPY does not apply column defaults to NULLs: fill run_at with now().
                now = cur.execute("SELECT now()").fetchone()
                assert now is not None
                rows = [r if r[2] is not None else (r[0], r[1], now[0], *r[3:]) for r in rows]
            with cur.copy(_q("enqueue_copy", schema, table)) as copy:
                copy.set_types(types)
                for r in rows:
                    copy.write_row(r)
            return EnqueueResult(len(rows), 0)
        cur.execute(QUERIES["enqueue_stage"])
        with cur.copy(QUERIES["enqueue_stage_copy"]) as copy:
            copy.set_types(["int8", *types])
            for i, r in enumerate(rows):
                copy.write_row((i, *r))
        cur.execute(_q("enqueue_stage_insert", schema, table))
        inserted = cur.rowcount
        cur.execute("DROP TABLE drainer_enqueue_stage")
    return EnqueueResult(inserted, len(rows) - inserted)

