"""The statements of ``sql/fleet.sql`` by name, composed for one control schema."""

from __future__ import annotations

import functools
import re
from importlib import resources

from psycopg import sql

_NAME_HEADER = re.compile(r"^-- name: (?P<name>[a-z_]+)\s*$", re.M)

#: The control table's name in its schema (the schema is ``--schema``, as the jobs table's).
TABLE = "fleet_tenants"


def load(file: str = "fleet.sql") -> dict[str, str]:
    """The named blocks of ``drainer/sql/<file>`` (``-- name: x`` headers, as queries.sql):
    each block's text without its comment lines and trailing semicolon."""
    text = resources.files("drainer").joinpath(f"sql/{file}").read_text("utf-8")
    parts = _NAME_HEADER.split(text)
    out: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        out[name] = "\n".join(lines).strip().rstrip(";")
    return out


STATEMENTS = load()


def regclass(schema: str) -> str:
    """The control table as a quoted ``schema.table`` text, to cast to regclass as a value."""
    return '"{}"."{}"'.format(schema.replace('"', '""'), TABLE)


@functools.lru_cache(maxsize=64)
def statement(name: str, schema: str) -> sql.Composed:
    """Statement ``name`` with its identifiers quoted for the control table in ``schema``."""
    return sql.SQL(STATEMENTS[name]).format(schema=sql.Identifier(schema),
                                            tenants=sql.Identifier(schema, TABLE),
                                            due_idx=sql.Identifier(f"{TABLE}_due_idx"))
