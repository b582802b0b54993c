"""enqueue_many's COPY paths write the same rows whichever columns they send."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.errors import JobRejected
from drainer.producer import EnqueueResult, JobSpec, enqueue_many
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


# -- payloads on one queue: enqueue_many(conn, payloads, queue=...) ----------------------------

_AWKWARD = [{"i": 0, "s": "x\ty\\z\n"}, [1, "\\"], "caf\u00e9", None, 2**70, {}]


def test_payloads_on_one_queue_are_the_rows_of_their_jobspecs(migrated: Settings,
                                                              conn: psycopg.Connection[Any]
                                                              ) -> None:
    schema = migrated.schema_name
    payloads = _AWKWARD + [{"n": i} for i in range(600)]  # more than one COPY chunk
    with conn.transaction():
        got = enqueue_many(conn, payloads, queue="a\tq", priority=-3, max_attempts=2,
                           schema=schema)
    with conn.transaction():
        enqueue_many(conn, [JobSpec("a\tq", p, priority=-3, max_attempts=2) for p in payloads],
                     schema=schema)
    assert got == EnqueueResult(len(payloads), 0)
    rows = _rows(conn, schema)
    assert [r[:2] + r[3:] for r in rows] == [
        ("a\tq", p, -3, 2, None, "queued") for p in payloads * 2]


def test_payloads_with_other_options_take_the_jobspec_paths(migrated: Settings,
                                                            conn: psycopg.Connection[Any]
                                                            ) -> None:
    schema = migrated.schema_name
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    assert enqueue_many(conn, iter([1, 2]), queue="t", run_at=later,
                        schema=schema) == EnqueueResult(2, 0)
    assert enqueue_many(conn, [3, 4], queue="k", dedup_key="d",
                        schema=schema) == EnqueueResult(1, 1)
    assert enqueue_many(conn, [5], queue="b", priority=True, schema=schema).enqueued == 1
    assert enqueue_many(conn, [], queue="e", schema=schema) == EnqueueResult(0, 0)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    rows = _rows(conn, schema)
    assert [(r[0], r[1], r[2] == later, r[3], r[5]) for r in rows] == [
        ("t", 1, True, 0, None), ("t", 2, True, 0, None), ("k", 3, False, 0, "d"),
        ("b", 5, False, 1, None)]
    with pytest.raises(JobRejected, match="NUL"):
        enqueue_many(conn, [6], queue="n\x00ul", schema=schema)
    assert len(_rows(conn, schema)) == 4


@pytest.mark.parametrize("options, match", [
    ({"queue": ""}, "queue"), ({"queue": "q", "max_attempts": 0}, "max_attempts"),
    ({"queue": "q", "run_at": datetime(1969, 12, 31, tzinfo=timezone.utc)}, "run_at"),
    ({"priority": 2}, "go with queue="),
])
def test_bad_payload_options_send_nothing(migrated: Settings, pg_url: str,
                                          options: dict[str, Any], match: str) -> None:
    with psycopg.connect(pg_url) as conn:
        conn.execute("SELECT 1")
        with pytest.raises((ValueError, TypeError), match=match):
            enqueue_many(conn, _payloads(1000), schema=migrated.schema_name, **options)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.execute("SELECT 1")  # the caller's transaction is still usable
    assert _rows_at(pg_url, migrated.schema_name) == []


def _payloads(n: int, *tail: Any) -> Any:
    yield from ({"i": i} for i in range(n))
    yield from tail


def test_a_bad_payload_late_writes_nothing(migrated: Settings,
                                           conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        enqueue_many(conn, _payloads(1000, {1, 2}), queue="q", schema=migrated.schema_name)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert _rows(conn, migrated.schema_name) == []


def test_payloads_are_written_while_they_are_read(migrated: Settings,
                                                 conn: psycopg.Connection[Any]) -> None:
    seen: list[psycopg.pq.TransactionStatus] = []

    def payloads() -> Any:
        for i in range(1000):
            if i % 300 == 0:
                seen.append(conn.info.transaction_status)
            yield i

    assert enqueue_many(conn, payloads(), queue="s",
                        schema=migrated.schema_name) == EnqueueResult(1000, 0)
    assert seen[0] == psycopg.pq.TransactionStatus.IDLE
    assert set(seen[1:]) == {psycopg.pq.TransactionStatus.ACTIVE}


def _rows_at(pg_url: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_url) as conn:
        return _rows(conn, schema)
