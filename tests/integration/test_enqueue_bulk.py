"""enqueue_many's COPY paths write the same rows whichever columns they send."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings


def _rows(conn: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    return conn.execute(sql.SQL(
        "SELECT queue, payload, run_at, priority, max_attempts, dedup_key, status "
        "FROM {} ORDER BY id").format(sql.Identifier(schema, "jobs"))).fetchall()


def test_jobs_due_now_get_the_transaction_time(migrated: Settings,
                                               conn: psycopg.Connection[Any]) -> None:
    with conn.transaction():
        now = conn.execute("SELECT now()").fetchone()
        result = enqueue_many(conn, [JobSpec("a", {"i": 1}, priority=3, max_attempts=2),
                                     {"queue": "b", "payload": [1, "x\ty\\z\n"]}],
                              schema=migrated.schema_name)
    assert result.enqueued == 2 and result.skipped_duplicates == 0
    assert now is not None
    assert _rows(conn, migrated.schema_name) == [
        ("a", {"i": 1}, now[0], 3, 2, None, "queued"),
        ("b", [1, "x\ty\\z\n"], now[0], 0, 5, None, "queued"),
    ]


def test_explicit_run_at_and_dedup_keys_keep_their_paths(migrated: Settings,
                                                         conn: psycopg.Connection[Any]) -> None:
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    enqueue_many(conn, [JobSpec("a", 1, run_at=later), JobSpec("a", 2)],
                 schema=migrated.schema_name)
    result = enqueue_many(conn, [JobSpec("a", 3, dedup_key="k"), JobSpec("a", 4, dedup_key="k")],
                          schema=migrated.schema_name)
    assert result.enqueued == 1 and result.skipped_duplicates == 1
    rows = _rows(conn, migrated.schema_name)
    assert [r[1] for r in rows] == [1, 2, 3]
    assert rows[0][2] == later and all(r[2] is not None for r in rows)


def test_a_bad_job_fails_the_whole_batch_before_writing(migrated: Settings,
                                                        conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        enqueue_many(conn, [JobSpec("a", 1), JobSpec("a", 2, max_attempts=0)],
                     schema=migrated.schema_name)
    with pytest.raises(ValueError, match="queue"):
        enqueue_many(conn, [JobSpec("", 1)], schema=migrated.schema_name)
    assert _rows(conn, migrated.schema_name) == []


def _stream(n: int, *tail: JobSpec | dict[str, Any]) -> Any:
    """A generator of ``n`` jobs due now (more than one COPY chunk), then ``tail``."""
    yield from (JobSpec("s", {"i": i}) for i in range(n))
    yield from tail


def test_a_generator_is_written_as_it_is_read(migrated: Settings,
                                             conn: psycopg.Connection[Any]) -> None:
    # due now, then a job at a time and one with a dedup key: the COPY of the first ones
    # ends there and the rest go by their own path, in the same transaction, in order
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    result = enqueue_many(conn, _stream(600, JobSpec("t", 1, run_at=later), JobSpec("t", 2),
                                        {"queue": "k", "payload": 3, "dedup_key": "d"},
                                        JobSpec("k", 4, dedup_key="d")),
                          schema=migrated.schema_name)
    assert result.enqueued == 603 and result.skipped_duplicates == 1
    rows = _rows(conn, migrated.schema_name)
    assert [r[1] for r in rows] == [{"i": i} for i in range(600)] + [1, 2, 3]
    assert rows[600][2] == later
    untimed = {r[2] for i, r in enumerate(rows) if i != 600}
    assert len(untimed) == 1  # one transaction: every job due now got its now()


@pytest.mark.parametrize("bad, match", [
    (JobSpec("s", 1, max_attempts=0), "max_attempts"),
    ({"queue": "", "payload": 1}, "queue"),
    (JobSpec("s", 1, run_at=datetime(1969, 12, 31, tzinfo=timezone.utc)), "run_at"),
    ({"queue": "s", "payload": 1, "priorty": 2}, "priorty"),
])
def test_a_bad_job_late_in_a_generator_writes_nothing(
        migrated: Settings, conn: psycopg.Connection[Any], bad: Any, match: str) -> None:
    # rows were sent before the bad job was read: the COPY is aborted, the transaction
    # enqueue_many opened rolls back, the error is the one that names the job
    with pytest.raises((ValueError, TypeError), match=match):
        enqueue_many(conn, _stream(1000, bad), schema=migrated.schema_name)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert _rows(conn, migrated.schema_name) == []


def test_a_generator_that_raises_writes_nothing(migrated: Settings,
                                               conn: psycopg.Connection[Any]) -> None:
    def jobs() -> Any:
        yield from _stream(1000)
        raise RuntimeError("the caller's source failed")

    with pytest.raises(RuntimeError, match="source failed"):
        enqueue_many(conn, jobs(), schema=migrated.schema_name)
    assert _rows(conn, migrated.schema_name) == []


def test_in_the_callers_transaction_a_bad_job_sends_nothing(migrated: Settings,
                                                           pg_url: str) -> None:
    # there the whole batch is checked first: the caller's transaction stays usable
    with psycopg.connect(pg_url) as conn:
        conn.execute("SELECT 1")
        with pytest.raises(ValueError, match="max_attempts"):
            enqueue_many(conn, _stream(1000, JobSpec("s", 1, max_attempts=0)),
                         schema=migrated.schema_name)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert enqueue_many(conn, _stream(3), schema=migrated.schema_name).enqueued == 3
        conn.commit()
        assert len(_rows(conn, migrated.schema_name)) == 3


def test_the_copy_is_open_while_the_generator_is_read(migrated: Settings,
                                                     conn: psycopg.Connection[Any]) -> None:
    # building the jobs overlaps with the server inserting those already sent
    seen: list[psycopg.pq.TransactionStatus] = []

    def jobs() -> Any:
        for i in range(1000):
            if i % 300 == 0:
                seen.append(conn.info.transaction_status)
            yield JobSpec("s", i)

    assert enqueue_many(conn, jobs(), schema=migrated.schema_name).enqueued == 1000
    assert seen[0] == psycopg.pq.TransactionStatus.IDLE  # the first job is read first
    assert set(seen[1:]) == {psycopg.pq.TransactionStatus.ACTIVE}  # then during the COPY
