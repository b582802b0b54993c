"""The statements of ``sql/fleet.sql`` by name, composed for one control schema."""

from __future__ import annotations

import functools

from psycopg import sql

from drainer.db.statements import load_queries

#: The control table's name in its schema (the schema is ``--schema``, as the jobs table's).
TABLE = "fleet_tenants"


#: fleet.sql's statements, loaded as queries.sql's are (named blocks, fragments).
STATEMENTS = load_queries(file="fleet.sql")


def regclass(schema: str) -> str:
    """The control table as a quoted ``schema.table`` text, to cast to regclass as a value."""
    return '"{}"."{}"'.format(schema.replace('"', '""'), TABLE)


@functools.lru_cache(maxsize=64)
def statement(name: str, schema: str) -> sql.Composed:
    """Statement ``name`` with its identifiers quoted for the control table in ``schema``."""
    return sql.SQL(STATEMENTS[name]).format(schema=sql.Identifier(schema),
                                            tenants=sql.Identifier(schema, TABLE),
                                            due_idx=sql.Identifier(f"{TABLE}_due_idx"))
