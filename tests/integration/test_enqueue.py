"""Enqueue: in the caller's transaction, dedup keys, COPY, and plain SQL."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.errors import DrainerError, JobRejected
from drainer.producer import JobSpec, enqueue, enqueue_async, enqueue_many, enqueue_many_async
from drainer.settings import Settings


def _count(conn: psycopg.Connection[Any], schema: str, where: str = "true") -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE " + where).format(
        sql.Identifier(schema, "jobs"))).fetchone()
    assert row is not None
    return int(row[0])


def test_enqueue_joins_the_callers_transaction(migrated: Settings, pg_url: str,
                                               conn: psycopg.Connection[Any]) -> None:
    schema = migrated.schema_name
    with psycopg.connect(pg_url) as producer:  # not autocommit: a transaction is open
        enqueue(producer, "emails", {"to": "a"}, schema=schema)
        producer.rollback()
        assert _count(conn, schema) == 0
        job_id = enqueue(producer, "emails", {"to": "b"}, schema=schema)
        assert _count(conn, schema) == 0  # not visible before commit
        producer.commit()
    assert _count(conn, schema) == 1
    row = conn.execute(sql.SQL("SELECT id, status, attempts, max_attempts, priority FROM {}")
                       .format(sql.Identifier(schema, "jobs"))).fetchone()
    assert row == (job_id, "queued", 0, 5, 0)


def test_dedup_key(migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    schema = migrated.schema_name
    first = enqueue(conn, "emails", {}, dedup_key="k1", schema=schema)
    assert first is not None
    assert enqueue(conn, "emails", {}, dedup_key="k1", schema=schema) is None
    conn.execute(sql.SQL("UPDATE {} SET status = 'done'").format(
        sql.Identifier(schema, "jobs")))
    assert enqueue(conn, "emails", {}, dedup_key="k1", schema=schema) is not None


def test_enqueue_options(migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    schema = migrated.schema_name
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    enqueue(conn, "q", {"x": 1}, run_at=later, priority=7, max_attempts=2, schema=schema)
    row = conn.execute(sql.SQL("SELECT run_at, priority, max_attempts, payload FROM {}")
                       .format(sql.Identifier(schema, "jobs"))).fetchone()
    assert row is not None
    assert abs((row[0] - later).total_seconds()) < 0.001
    assert row[1:] == (7, 2, {"x": 1})


def test_enqueue_many_copy(migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    schema = migrated.schema_name
    result = enqueue_many(conn, [JobSpec("bulk", {"n": i}) for i in range(1000)],
                          schema=schema)
    assert (result.enqueued, result.skipped_duplicates) == (1000, 0)
    assert _count(conn, schema, "status = 'queued' AND run_at <= now()") == 1000


def test_enqueue_many_with_dedup(migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    schema = migrated.schema_name
    enqueue(conn, "bulk", {}, dedup_key="a", schema=schema)
    result = enqueue_many(conn, [
        {"queue": "bulk", "payload": {}, "dedup_key": "a"},
        {"queue": "bulk", "payload": {}, "dedup_key": "b"},
        {"queue": "bulk", "payload": {}, "dedup_key": "b"},
        {"queue": "bulk", "payload": {}},
    ], schema=schema)
    assert (result.enqueued, result.skipped_duplicates) == (2, 2)
    assert _count(conn, schema) == 3


def test_enqueue_many_rolls_back_with_caller(migrated: Settings, pg_url: str,
                                             conn: psycopg.Connection[Any]) -> None:
    with psycopg.connect(pg_url) as producer:
        enqueue_many(producer, [JobSpec("bulk", {}) for _ in range(10)],
                     schema=migrated.schema_name)
        producer.rollback()
    assert _count(conn, migrated.schema_name) == 0


def test_plain_sql_insert_is_a_valid_job(migrated: Settings,
                                         conn: psycopg.Connection[Any]) -> None:
    jobs = sql.Identifier(migrated.schema_name, "jobs")
    conn.execute(sql.SQL("INSERT INTO {} (queue, payload) VALUES ('emails', '{{\"a\": 1}}')")
                 .format(jobs))
    row = conn.execute(sql.SQL("SELECT status, attempts, max_attempts, priority, "
                               "run_at <= now() FROM {}").format(jobs)).fetchone()
    assert row == ("queued", 0, 5, 0, True)


_UNSTORABLE = [
    ({"queue": "q", "payload": {"a": "x\x00y"}}, "NUL"),
    ({"queue": "q", "payload": {"k\x00": 1}}, "NUL"),
    ({"queue": "q", "payload": {"a": "\ud800"}}, "surrogate"),
    ({"queue": "q", "payload": {"a": float("nan")}}, "NaN"),
    ({"queue": "q", "payload": [float("inf")]}, "Infinity"),
    ({"queue": "q\x00", "payload": {}}, "NUL"),
    ({"queue": "q\ud800", "payload": {}}, "surrogate"),
    ({"queue": "q", "payload": {}, "dedup_key": "k\x00"}, "NUL"),
    ({"queue": "q", "payload": {}, "priority": 2**40}, "out of range"),
]


@pytest.mark.parametrize(("job", "words"), _UNSTORABLE)
def test_what_the_table_cannot_store_is_one_clear_line(
        migrated: Settings, conn: psycopg.Connection[Any], pg_url: str,
        job: dict[str, Any], words: str) -> None:
    """enqueue and enqueue_many, sync and async: a JobRejected (a ValueError and a
    DrainerError) of one line naming the problem, not psycopg's raw error."""
    schema = migrated.schema_name
    spec = JobSpec(**job)
    options = {k: v for k, v in job.items() if k not in ("queue", "payload")}

    async def both_async() -> list[BaseException]:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as ac:
            found: list[BaseException] = []
            for call in (lambda: enqueue_async(ac, spec.queue, spec.payload, schema=schema,
                                               **options),
                         lambda: enqueue_many_async(ac, [spec], schema=schema)):
                try:
                    await call()
                except Exception as exc:
                    found.append(exc)
            return found

    raised: list[BaseException] = []
    for call in (lambda: enqueue(conn, spec.queue, spec.payload, schema=schema, **options),
                 lambda: enqueue_many(conn, [spec], schema=schema),
                 lambda: enqueue_many(conn, [spec.payload], queue=spec.queue, schema=schema,
                                      **options)):
        try:
            call()
        except Exception as exc:
            raised.append(exc)
    raised += asyncio.run(both_async())
    assert len(raised) == 5
    for exc in raised:
        assert isinstance(exc, JobRejected) and isinstance(exc, ValueError | DrainerError)
        assert words in str(exc) and "\n" not in str(exc), str(exc)
    count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
        sql.Identifier(schema, "jobs"))).fetchone()
    assert count == (0,)
