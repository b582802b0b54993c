"""Versioned, idempotent migrations of the jobs table, recorded in the database."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

from drainer.db import Queries, identifiers, regclass_literal
from drainer.errors import SchemaError

logger = logging.getLogger(__name__)

#: A migration's file, sql/migrations/NNNN_name.sql. The versions are ordered, not counted:
#: there is no 0005 (no commit ever held a migration of that number; it was skipped before
#: the first release). None may be added in a gap: migrate() applies only the versions above
#: the table's own, so a table already past the gap would never get it. A new migration
#: takes the number after the latest and changes sql/schema.sql with it
#: (tests/integration/test_schema_file.py compares the two).
_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str


def migrations() -> list[Migration]:
    """The migrations shipped with drainer, in order (version 0 is the bookkeeping)."""
    out = []
    for entry in resources.files("drainer").joinpath("sql/migrations").iterdir():
        m = _FILE.match(entry.name)
        if m:
            out.append(Migration(int(m["version"]), m["name"], entry.read_text("utf-8")))
    return sorted(out, key=lambda m: m.version)


def latest_version() -> int:
    return migrations()[-1].version


@dataclass
class MigrateResult:
    schema: str
    table: str
    from_version: int | None
    to_version: int
    applied: list[str] = field(default_factory=list)
    adopted: bool = False
    notify_trigger: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema, "table": self.table, "from_version": self.from_version,
            "to_version": self.to_version, "applied": self.applied, "adopted": self.adopted,
            "notify_trigger": self.notify_trigger,
        }


def _lock_key(schema: str, table: str) -> str:
    return f"drainer.migrate:{schema}.{table}"


def migrate(conn: psycopg.Connection[Any], schema: str, table: str) -> MigrateResult:
    """Bring ``schema.table`` to the latest version. Running it twice changes nothing.

    Each migration runs in its own transaction, under an advisory lock so that two
    ``drainer migrate`` started at once apply each step once.
    """
    ids = identifiers(schema, table)
    all_migrations = migrations()
    bookkeeping, steps = all_migrations[0], all_migrations[1:]
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [_lock_key(schema, table)])
        existed = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", [regclass_literal(schema, table)]
        ).fetchone()
        conn.execute(sql.SQL(bookkeeping.text).format(**ids))
    queries = Queries(conn, schema, table)
    current = queries.schema_version()
    result = MigrateResult(schema, table, current, current or 0)
    for step in steps:
        if current is not None and step.version <= current:
            continue
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                         [_lock_key(schema, table)])
            done = conn.execute(
                sql.SQL("SELECT 1 FROM {} WHERE table_name = %s AND version = %s").format(
                    ids["migrations"]), [table, step.version]).fetchone()
            if done:
                continue
            logger.info("applying migration %04d_%s to %s.%s", step.version, step.name,
                        schema, table)
            conn.execute(sql.SQL(step.text).format(**ids))
            conn.execute(
                sql.SQL("INSERT INTO {} (table_name, version, name) VALUES (%s, %s, %s)")
                .format(ids["migrations"]), [table, step.version, step.name])
        result.applied.append(f"{step.version:04d}_{step.name}")
        result.to_version = step.version
    result.adopted = bool(existed and existed[0]) and current is None and bool(result.applied)
    return result


#: The longest queue name the notify trigger sends as its payload (NOTIFY refuses payloads of
#: 8000 bytes and more); a longer name sends '' ("look at every queue"), which
#: ``drainer worker`` takes as a hint for all its queues.
NOTIFY_PAYLOAD_MAX_BYTES = 7000


def install_notify_trigger(conn: psycopg.Connection[Any], schema: str, table: str,
                           channel: str = "drainer") -> None:
    """The AFTER INSERT trigger of 'Postgres as a job queue': ``pg_notify(channel,
    queue)``, a hint only.

    Idempotent and safe to run concurrently: the install is one transaction under
    migrate's advisory lock. The payload is bounded (:data:`NOTIFY_PAYLOAD_MAX_BYTES`), so
    no queue name makes an INSERT fail.
    """
    ids = identifiers(schema, table)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [_lock_key(schema, table)])
        conn.execute(sql.SQL(
            "CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
            "BEGIN\n  PERFORM pg_notify({channel}, CASE WHEN octet_length(NEW.queue) <= "
            "{limit} THEN NEW.queue ELSE '' END);\n  RETURN NULL;\nEND;\n$$"
        ).format(fn=ids["notify_fn"], channel=sql.Literal(channel),
                 limit=sql.Literal(NOTIFY_PAYLOAD_MAX_BYTES)))
        conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {trg} ON {jobs}").format(
            trg=ids["notify_trigger"], jobs=ids["jobs"]))
        conn.execute(sql.SQL(
            "CREATE TRIGGER {trg} AFTER INSERT ON {jobs} "
            "FOR EACH ROW EXECUTE FUNCTION {fn}()"
        ).format(trg=ids["notify_trigger"], jobs=ids["jobs"], fn=ids["notify_fn"]))


def check_schema(queries: Queries) -> int:
    """Raise SchemaError (exit 4) unless the table is migrated to the latest version."""
    return check_version(queries, queries.schema_version())


def check_version(queries: Queries, version: int | None, latest: int | None = None) -> int:
    """check_schema for a version already read (as by the drain's first statement);
    ``latest``: latest_version(), when the caller has read it already."""
    latest = latest_version() if latest is None else latest
    target = f"{queries.schema}.{queries.table}"
    if version is None:
        raise SchemaError(
            f"jobs table {target} is not set up: run `drainer migrate` first"
        )
    if version < latest:
        raise SchemaError(
            f"jobs table {target} is at schema version {version}, drainer needs {latest}: "
            "run `drainer migrate`"
        )
    if version > latest:
        raise SchemaError(
            f"jobs table {target} is at schema version {version}, newer than this drainer "
            f"({latest}): upgrade drainer"
        )
    return version

