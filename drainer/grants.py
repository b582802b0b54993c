"""The least-privilege roles of deploy/sql/roles.sql as plain SQL: ``drainer migrate
--print-grants``, for SQL consoles where psql and its variables are not at hand."""

from __future__ import annotations

import logging

from psycopg import sql

logger = logging.getLogger(__name__)

DEFAULT_DRAINER_ROLE = "drainer"
DEFAULT_PRODUCER_ROLE = "drainer_producer"
#: Columns a producer may set: not status, attempts, locked_until... so it cannot insert a
#: job that is already claimed.
PRODUCER_INSERT_COLUMNS = ("queue", "payload", "run_at", "priority", "max_attempts",
                           "dedup_key", "trace_context")
#: Columns a producer may read: enqueue's ON CONFLICT (dedup_key) WHERE ... status ...
#: needs SELECT on the conflict target's columns, RETURNING id on id; `drainer enqueue`
#: reads queue (has the queue been seen?).
PRODUCER_SELECT_COLUMNS = ("id", "dedup_key", "status", "queue")

# Every statement, in the order deploy/sql/roles.sql runs them.
_CREATE_ROLE = sql.SQL(
    "DO $drainer$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {name}) "
    "THEN CREATE ROLE {role} LOGIN; END IF; END $drainer$"
)
_REVOKE_SCHEMA = sql.SQL("REVOKE ALL ON SCHEMA {schema} FROM {drainer}, {producer}")
_REVOKE_TABLES = sql.SQL(
    "REVOKE ALL ON {jobs}, {archive}, {migrations}, {control} FROM {drainer}, {producer}")
_DRAINER = (
    sql.SQL("GRANT USAGE ON SCHEMA {schema} TO {drainer}"),
    sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {jobs} TO {drainer}"),
    sql.SQL("GRANT SELECT, INSERT ON {archive} TO {drainer}"),
    sql.SQL("GRANT SELECT ON {migrations} TO {drainer}"),
    sql.SQL("GRANT SELECT, INSERT, UPDATE ON {control} TO {drainer}"),
)
_MAINTAIN = sql.SQL("GRANT MAINTAIN ON {jobs} TO {drainer}")
_PRODUCER = (
    sql.SQL("GRANT USAGE ON SCHEMA {schema} TO {producer}"),
    sql.SQL("GRANT INSERT ({insert_columns}) ON {jobs} TO {producer}"),
    sql.SQL("GRANT SELECT ({select_columns}) ON {jobs} TO {producer}"),
    sql.SQL("GRANT SELECT ON {migrations} TO {producer}"),
)


def grant_statements(schema: str, table: str, *, drainer_role: str = DEFAULT_DRAINER_ROLE,
                     producer_role: str = DEFAULT_PRODUCER_ROLE,
                     maintain: bool = False) -> list[sql.Composed]:
    """The statements that create (when missing) and grant the two roles, as roles.sql.

    ``maintain`` adds ``GRANT MAINTAIN`` (PostgreSQL 17+), which lets the drainer role
    VACUUM the table it does not own.
    """
    for role in (drainer_role, producer_role):
        if not role or "$drainer$" in role:
            raise ValueError(f"not a usable role name: {role!r}")
    ids = {
        "schema": sql.Identifier(schema),
        "jobs": sql.Identifier(schema, table),
        "archive": sql.Identifier(schema, f"{table}_archive"),
        "migrations": sql.Identifier(schema, "drainer_migrations"),
        "control": sql.Identifier(schema, f"{table}_queues"),
        "drainer": sql.Identifier(drainer_role),
        "producer": sql.Identifier(producer_role),
        "insert_columns": sql.SQL(", ").join(map(sql.Identifier, PRODUCER_INSERT_COLUMNS)),
        "select_columns": sql.SQL(", ").join(map(sql.Identifier, PRODUCER_SELECT_COLUMNS)),
    }
    out = [sql.Composed([sql.SQL("BEGIN")])]
    for role in (drainer_role, producer_role):
        out.append(_CREATE_ROLE.format(name=sql.Literal(role), role=sql.Identifier(role)))
    out += [_REVOKE_SCHEMA.format(**ids), _REVOKE_TABLES.format(**ids)]
    out += [s.format(**ids) for s in _DRAINER]
    if maintain:
        out.append(_MAINTAIN.format(**ids))
    out += [s.format(**ids) for s in _PRODUCER]
    out.append(sql.Composed([sql.SQL("COMMIT")]))
    return out


def render_grants(schema: str, table: str, *, drainer_role: str = DEFAULT_DRAINER_ROLE,
                  producer_role: str = DEFAULT_PRODUCER_ROLE, maintain: bool = False) -> str:
    """The statements of :func:`grant_statements` as a script, one statement a line."""
    statements = grant_statements(schema, table, drainer_role=drainer_role,
                                  producer_role=producer_role, maintain=maintain)
    header = "-- drainer's least-privilege roles (deploy/sql/roles.sql); run as the owner\n"
    return header + "".join(s.as_string(None) + ";\n" for s in statements)
