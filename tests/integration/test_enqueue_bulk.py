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
