"""The article's EXPLAIN (COSTS OFF): Limit > LockRows > Index Scan on the claim index."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from drainer.db import Queries
from drainer.settings import Settings


def _plan(conn: psycopg.Connection[Any], q: Queries, queue: str) -> str:
    rows = conn.execute("EXPLAIN (COSTS OFF) " + q.text("claim_batch"),
                        {"queue": queue, "batch_size": 10, "lease": 300.0, "start_now": 10,
                         "run_id": None}).fetchall()
    return "\n".join(r[0] for r in rows)


def _fill(conn: psycopg.Connection[Any], schema: str, queued: int, done: int,
          queues: int = 1) -> None:
    jobs = sql.Identifier(schema, "jobs")
    conn.execute(sql.SQL(
        "INSERT INTO {} (queue, payload, status, finished_at) "
        "SELECT 'q' || (g %% %s), '{{}}', 'done', now() FROM generate_series(1, %s) g"
    ).format(jobs), [queues, done])
    conn.execute(sql.SQL(
        "INSERT INTO {} (queue, payload, priority, run_at) "
        "SELECT 'q' || (g %% %s), '{{}}', g %% 3, now() - interval '1 minute' "
        "FROM generate_series(1, %s) g"
    ).format(jobs), [queues, queued])
    conn.execute(sql.SQL("ANALYZE {}").format(jobs))


def _assert_index_scan(plan: str) -> None:
    # the claim's InitPlans (the queue and the LIMIT: see claim_next) are the Limit's
    # children too: each a Result, printed before the LockRows
    raw = [ln.strip() for ln in plan.splitlines()]
    lines = [ln for i, ln in enumerate(raw) if not ln.startswith("InitPlan")
             and not (i and raw[i - 1].startswith("InitPlan") and ln == "->  Result")]
    limit = next(i for i, ln in enumerate(lines) if ln.endswith("Limit"))
    assert lines[limit + 1].endswith("LockRows"), plan
    assert "Index Scan using jobs_claim_idx" in lines[limit + 2], plan
    assert "Sort" not in plan and "Seq Scan" not in plan, plan


def test_claim_plan_single_queue(migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    _fill(conn, migrated.schema_name, queued=5_000, done=20_000, queues=1)
    q = Queries(conn, migrated.schema_name, "jobs")
    _assert_index_scan(_plan(conn, q, "q0"))


def test_claim_plan_each_of_several_queues(migrated: Settings,
                                           conn: psycopg.Connection[Any]) -> None:
    _fill(conn, migrated.schema_name, queued=20_000, done=5_000, queues=5)
    q = Queries(conn, migrated.schema_name, "jobs")
    for i in range(5):
        _assert_index_scan(_plan(conn, q, f"q{i}"))
