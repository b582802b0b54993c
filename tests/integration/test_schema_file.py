"""drainer/sql/schema.sql is the schema the migrations leave: applied to a fresh schema, its
catalog is the migrated one's, object for object."""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib import resources
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.db import identifiers
from drainer.migrate import migrate

#: not "jobs": an identifier schema.sql wrote out instead of its hole shows as a difference
TABLE = "work_items"

#: What makes up a schema, each as rows of text with the schema's name taken out: its
#: relations (tables, indexes, sequences) with their storage options, privileges and
#: comments; columns in order with type, default, NOT NULL, identity and collation;
#: constraints; index definitions; triggers; sequences; functions.
CATALOG = {
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.reloptions::text, c.relacl::text,
               obj_description(c.oid, 'pg_class')
        FROM pg_class c WHERE c.relnamespace = %(ns)s::regnamespace ORDER BY 1""",
    "columns": """
        SELECT c.relname, row_number() OVER (PARTITION BY c.relname ORDER BY a.attnum),
               a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated,
               co.collname, col_description(c.oid, a.attnum)
        FROM pg_class c
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
        LEFT JOIN pg_collation co ON co.oid = a.attcollation
        WHERE c.relnamespace = %(ns)s::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
        ORDER BY 1, 2""",
    "constraints": """
        SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid), k.condeferrable
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
        WHERE c.relnamespace = %(ns)s::regnamespace ORDER BY 1, 2""",
    "indexes": """
        SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid), i.indisprimary,
               i.indisunique
        FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
        WHERE c.relnamespace = %(ns)s::regnamespace ORDER BY 1""",
    "triggers": """
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid), t.tgenabled
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = %(ns)s::regnamespace AND NOT t.tgisinternal ORDER BY 1, 2""",
    "sequences": """
        SELECT c.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement,
               s.seqmax, s.seqmin, s.seqcache, s.seqcycle
        FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
        WHERE c.relnamespace = %(ns)s::regnamespace ORDER BY 1""",
    "functions": """
        SELECT p.proname, pg_get_functiondef(p.oid)
        FROM pg_proc p WHERE p.pronamespace = %(ns)s::regnamespace ORDER BY 1""",
}


def catalog(conn: psycopg.Connection[Any], schema: str) -> dict[str, list[tuple[str, ...]]]:
    """The schema's objects (:data:`CATALOG`), its own name replaced by ``<schema>``."""
    name = re.compile(rf'(?<![\w"]){re.escape(schema)}(?![\w"])|"{re.escape(schema)}"')

    def text(value: Any) -> str:
        return name.sub("<schema>", str(value))

    return {part: [tuple(text(v) for v in row) for row in conn.execute(query, {"ns": schema})]
            for part, query in CATALOG.items()}


def schema_sql() -> str:
    return resources.files("drainer").joinpath("sql/schema.sql").read_text("utf-8")


@pytest.fixture
def two_schemas(schema: str, pg_url: str) -> Iterator[tuple[str, str]]:
    """The test's schema for the migrations, and one more for schema.sql (dropped after)."""
    other = f"{schema}_file"
    yield schema, other
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(other)))


def test_the_migrations_make_exactly_schema_sql(
        conn: psycopg.Connection[Any], two_schemas: tuple[str, str]) -> None:
    migrated, from_file = two_schemas
    migrate(conn, migrated, TABLE)
    conn.execute(sql.SQL(schema_sql()).format(**identifiers(from_file, TABLE)))
    want, got = catalog(conn, migrated), catalog(conn, from_file)
    assert want["columns"] and want["indexes"] and want["constraints"]
    for part in CATALOG:
        assert got[part] == want[part], part


def test_what_a_migration_adds_and_schema_sql_lacks_is_a_difference(
        conn: psycopg.Connection[Any], two_schemas: tuple[str, str]) -> None:
    """The comparison sees each change a migration could make after schema.sql was
    written: a column, a default, an index, a constraint, a storage option, a trigger."""
    migrated, from_file = two_schemas
    migrate(conn, migrated, TABLE)
    conn.execute(sql.SQL(schema_sql()).format(**identifiers(from_file, TABLE)))
    assert catalog(conn, migrated) == catalog(conn, from_file)
    jobs = sql.Identifier(migrated, TABLE)
    fn = sql.Identifier(migrated, "later_fn")
    for part, *changes in [
        ("columns", "ALTER TABLE {jobs} ADD COLUMN later text"),
        ("columns", "ALTER TABLE {jobs} ALTER COLUMN priority SET DEFAULT 1"),
        ("columns", "ALTER TABLE {jobs} ALTER COLUMN run_id SET NOT NULL"),
        ("indexes", "CREATE INDEX later_idx ON {jobs} (created_at)"),
        ("constraints", "ALTER TABLE {jobs} ADD CHECK (attempts >= 0)"),
        ("relations", "ALTER TABLE {jobs} SET (autovacuum_vacuum_threshold = 10)"),
        ("triggers",
         "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$",
         "CREATE TRIGGER later AFTER INSERT ON {jobs} FOR EACH ROW EXECUTE FUNCTION {fn}()"),
    ]:
        with conn.transaction(force_rollback=True):
            for change in changes:
                conn.execute(sql.SQL(change).format(jobs=jobs, fn=fn))
            assert catalog(conn, migrated)[part] != catalog(conn, from_file)[part], changes
        assert catalog(conn, migrated) == catalog(conn, from_file)
