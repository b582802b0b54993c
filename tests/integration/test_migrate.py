"""Migrations: versioned, idempotent, recorded; adopts the article's table."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.db import Queries
from drainer.errors import SchemaError
from drainer.migrate import check_schema, latest_version, migrate, migrations
from tests.article import ARTICLE_CREATE_TABLE

ARTICLE_DDL = ARTICLE_CREATE_TABLE.replace("{t}", "{jobs}") + """;
CREATE INDEX jobs_ready_idx ON {jobs} (queue, run_at) WHERE status = 'queued';
INSERT INTO {jobs} (payload)
SELECT jsonb_build_object('email_id', g) FROM generate_series(1, 10) AS g;
UPDATE {jobs} SET status = 'done' WHERE id <= 3;
"""


def _columns(conn: psycopg.Connection[Any], schema: str, table: str) -> set[str]:
    rows = conn.execute("SELECT column_name FROM information_schema.columns "
                        "WHERE table_schema = %s AND table_name = %s", [schema, table])
    return {r[0] for r in rows}


def test_fresh_database_and_idempotent(conn: psycopg.Connection[Any], schema: str) -> None:
    first = migrate(conn, schema, "jobs")
    assert first.from_version is None
    assert first.to_version == latest_version()
    assert first.applied
    snapshot = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s ORDER BY 1",
        [schema]).fetchall()
    second = migrate(conn, schema, "jobs")
    assert second.applied == []
    assert second.from_version == second.to_version == latest_version()
    assert conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s ORDER BY 1",
        [schema]).fetchall() == snapshot
    recorded = conn.execute(sql.SQL("SELECT version, name FROM {} WHERE table_name = 'jobs'")
                            .format(sql.Identifier(schema, "drainer_migrations"))).fetchall()
    assert [r[0] for r in recorded] == [m.version for m in migrations()[1:]]
    assert {"id", "queue", "payload", "status", "run_at", "attempts", "max_attempts",
            "locked_until", "last_error", "created_at", "priority", "dedup_key",
            "finished_at"} <= _columns(conn, schema, "jobs")
    options = conn.execute("SELECT reloptions FROM pg_class WHERE oid = %s::regclass",
                           [f'"{schema}"."jobs"']).fetchone()
    assert options is not None
    assert "autovacuum_vacuum_scale_factor=0.01" in options[0]
    assert "autovacuum_vacuum_cost_delay=0" in options[0]


def test_partial_claim_index(conn: psycopg.Connection[Any], schema: str) -> None:
    migrate(conn, schema, "jobs")
    row = conn.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = %s AND "
                       "indexname = 'jobs_claim_idx'", [schema]).fetchone()
    assert row is not None
    assert "(queue, priority DESC, run_at, id)" in row[0]
    assert "WHERE (status = 'queued'::text)" in row[0]


def test_adopts_article_table(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conn.execute(sql.SQL(ARTICLE_DDL).format(jobs=sql.Identifier(schema, "jobs")))
    result = migrate(conn, schema, "jobs")
    assert result.adopted
    assert {"priority", "dedup_key", "finished_at"} <= _columns(conn, schema, "jobs")
    rows = conn.execute(sql.SQL("SELECT status, count(*), count(finished_at) FROM {} "
                                "GROUP BY 1 ORDER BY 1")
                        .format(sql.Identifier(schema, "jobs"))).fetchall()
    assert rows == [("done", 3, 3), ("queued", 7, 0)]
    # the article's index is superseded by the claim index
    names = {r[0] for r in conn.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s", [schema])}
    assert "jobs_ready_idx" not in names and "jobs_claim_idx" in names
    # a plain INSERT in the article's style still works
    conn.execute(sql.SQL("INSERT INTO {} (payload) VALUES ('{{}}')").format(
        sql.Identifier(schema, "jobs")))


def test_check_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    q = Queries(conn, schema, "jobs")
    with pytest.raises(SchemaError, match="drainer migrate"):
        check_schema(q)
    migrate(conn, schema, "jobs")
    assert check_schema(q) == latest_version()


def test_hostile_names_are_names(conn: psycopg.Connection[Any], schema: str) -> None:
    weird_table = 'jobs"; DROP TABLE x; --'
    migrate(conn, schema, weird_table)
    found = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s AND "
                         "tablename = %s", [schema, weird_table]).fetchone()
    assert found == (1,)


def _migrate_to(conn: psycopg.Connection[Any], schema: str, version: int) -> None:
    """The table as the migrations up to ``version`` left it (an older drainer's)."""
    from drainer.db import identifiers

    ids = identifiers(schema, "jobs")
    for step in migrations():
        if step.version > version:
            break
        conn.execute(sql.SQL(step.text).format(**ids))  # type: ignore[arg-type]
        if step.version:
            conn.execute(sql.SQL("INSERT INTO {} (table_name, version, name) VALUES "
                                 "(%s, %s, %s)").format(ids["migrations"]),
                         ["jobs", step.version, step.name])


def test_jobs_cancelled_before_the_cancelled_status_take_it(
        conn: psycopg.Connection[Any], schema: str) -> None:
    _migrate_to(conn, schema, 7)
    jobs = sql.Identifier(schema, "jobs")
    conn.execute(sql.SQL("INSERT INTO {} (queue, status, last_error, finished_at) VALUES "
                         "('a', 'failed', 'cancelled', now()), ('a', 'failed', 'boom', now()),"
                         " ('a', 'queued', NULL, NULL)").format(jobs))
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(sql.SQL("UPDATE {} SET status = 'cancelled' WHERE id < 0 OR "
                             "last_error = 'boom'").format(jobs))
    assert migrate(conn, schema, "jobs").to_version == latest_version()
    rows = conn.execute(sql.SQL("SELECT status, last_error FROM {} ORDER BY id").format(jobs))
    assert rows.fetchall() == [("cancelled", "cancelled"), ("failed", "boom"),
                               ("queued", None)]
    assert "recurring_schedule" in _columns(conn, schema, "jobs")
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(sql.SQL("UPDATE {} SET status = 'gone'").format(jobs))


def test_an_adopted_table_whose_status_check_has_its_own_name_takes_cancelled(
        conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conn.execute(sql.SQL(ARTICLE_DDL).format(jobs=sql.Identifier(schema, "jobs")))
    conn.execute(sql.SQL("ALTER TABLE {} RENAME CONSTRAINT jobs_status_check TO "
                         "our_status_rule").format(sql.Identifier(schema, "jobs")))
    migrate(conn, schema, "jobs")
    checks = conn.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass "
                          "AND contype = 'c' AND pg_get_constraintdef(oid) LIKE '%%status%%'",
                          [f'"{schema}"."jobs"']).fetchall()
    assert checks == [("jobs_status_check",)]
    conn.execute(sql.SQL("UPDATE {} SET status = 'cancelled' WHERE id = 1").format(
        sql.Identifier(schema, "jobs")))


def test_occurrences_lose_their_dedup_key_and_max_attempts_is_at_least_one(
        conn: psycopg.Connection[Any], schema: str) -> None:
    _migrate_to(conn, schema, 8)
    jobs = sql.Identifier(schema, "jobs")
    conn.execute(sql.SQL(
        "INSERT INTO {} (queue, dedup_key, recurring_key, scheduled_for, max_attempts) VALUES "
        "('a', 'recurring:a:2026-12-01T10:00:00Z', 'a', '2026-12-01T10:00:00Z', 5),"
        " ('b', 'recurring:a:2026-12-01T11:00:00Z', NULL, NULL, -5),"
        " ('b', 'mine', NULL, NULL, 0)").format(jobs))
    assert migrate(conn, schema, "jobs").to_version == latest_version()
    rows = conn.execute(sql.SQL("SELECT dedup_key, max_attempts FROM {} ORDER BY id")
                        .format(jobs)).fetchall()
    # a producer's key stays the producer's, whatever its text
    assert rows == [(None, 5), ("recurring:a:2026-12-01T11:00:00Z", 1), ("mine", 1)]
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(sql.SQL("INSERT INTO {} (queue, max_attempts) VALUES ('b', -5)")
                     .format(jobs))
