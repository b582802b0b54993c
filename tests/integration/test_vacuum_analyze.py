"""The end-of-run VACUUM analyzes the table only when autovacuum would."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import sql

from drainer.db import Queries
from drainer.maintenance import vacuum
from drainer.settings import Settings


def _analyze_count(conn: psycopg.Connection[Any], schema: str) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute("SELECT vacuum_count + autovacuum_count, analyze_count "
                       "FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'jobs'",
                       [schema]).fetchone()
    assert row is not None
    return int(row[1])


def _churn(conn: psycopg.Connection[Any], schema: str, history: int, drained: int) -> None:
    """``history`` done rows, analyzed; then ``drained`` jobs through queued -> done."""
    table = sql.Identifier(schema, "jobs")
    conn.execute(sql.SQL("INSERT INTO {} (queue, status, finished_at) SELECT 'h', 'done', now() "
                         "FROM generate_series(1, %s)").format(table), [history])
    time.sleep(1.1)  # let the insert reach the statistics before ANALYZE resets the count
    conn.execute("SELECT 1")
    conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(table))
    conn.execute(sql.SQL("INSERT INTO {} (queue) SELECT 'q' FROM generate_series(1, %s)"
                         ).format(table), [drained])
    conn.execute(sql.SQL("UPDATE {} SET status = 'running' WHERE queue = 'q'").format(table))
    conn.execute(sql.SQL("UPDATE {} SET status = 'done', finished_at = now() WHERE queue = 'q'"
                         ).format(table))
    time.sleep(1.1)  # this backend's table counters reach the statistics at most each second
    conn.execute("SELECT 1")


def test_a_small_table_is_analyzed(migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    _churn(conn, migrated.schema_name, 100, 2_000)
    q = Queries(conn, migrated.schema_name, migrated.table)
    before = _analyze_count(conn, migrated.schema_name)
    health = q.table_health()
    assert health["n_mod_since_analyze"] >= 2_000 and vacuum.wants_analyze(health)
    result = vacuum.run_once(q, 1_000, health=health)
    assert result.vacuumed and result.analyzed
    assert _analyze_count(conn, migrated.schema_name) == before + 1


def test_a_drain_next_to_a_long_history_keeps_the_statistics(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    _churn(conn, migrated.schema_name, 100_000, 2_000)
    q = Queries(conn, migrated.schema_name, migrated.table)
    before = _analyze_count(conn, migrated.schema_name)
    health = q.table_health()
    assert health["reltuples"] >= 100_000 and not vacuum.wants_analyze(health)
    result = vacuum.run_once(q, 1_000, health=health)
    assert result.vacuumed and not result.analyzed
    assert _analyze_count(conn, migrated.schema_name) == before


def test_unknown_statistics_mean_analyze() -> None:
    assert vacuum.wants_analyze({})
    assert vacuum.wants_analyze({"n_mod_since_analyze": 0, "reltuples": -1})
    assert not vacuum.wants_analyze({"n_mod_since_analyze": 50, "reltuples": 0})
    assert vacuum.wants_analyze({"n_mod_since_analyze": 151, "reltuples": 1_000})
    assert not vacuum.wants_analyze({"n_mod_since_analyze": 150, "reltuples": 1_000})
