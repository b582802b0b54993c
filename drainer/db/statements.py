"""drainer's named statements: ``sql/queries.sql`` loaded once, rendered per connection."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

_NAME_HEADER = re.compile(r"^-- name: (?P<name>[a-z_]+)\s*$", re.M)

def load_queries() -> dict[str, str]:
    """The statements of ``sql/queries.sql`` by name (text with ``{identifier}`` holes)."""
    text = resources.files("drainer").joinpath("sql/queries.sql").read_text("utf-8")
    parts = _NAME_HEADER.split(text)
    out: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.startswith("--")]
        out[name] = "\n".join(lines).strip().rstrip(";")
    return out


QUERIES = load_queries()


def identifiers(schema: str, table: str) -> dict[str, sql.Composable]:
    """The identifiers that fill the ``{holes}`` of drainer's SQL, always quoted."""
    return {
        "schema": sql.Identifier(schema),
        "jobs": sql.Identifier(schema, table),
        "archive": sql.Identifier(schema, f"{table}_archive"),
        "migrations": sql.Identifier(schema, "drainer_migrations"),
        "claim_idx": sql.Identifier(f"{table}_claim_idx"),
        "lease_idx": sql.Identifier(f"{table}_lease_idx"),
        "finished_idx": sql.Identifier(f"{table}_finished_idx"),
        "dedup_idx": sql.Identifier(f"{table}_dedup_idx"),
        "run_at_check": sql.Identifier(f"{table}_run_at_check"),
        "recurring_idx": sql.Identifier(f"{table}_recurring_idx"),
        "recurring_queued_idx": sql.Identifier(f"{table}_recurring_queued_idx"),
        "article_idx": sql.Identifier(schema, f"{table}_ready_idx"),
        "notify_fn": sql.Identifier(schema, f"{table}_notify"),
        "notify_trigger": sql.Identifier(f"{table}_notify"),
        "control": sql.Identifier(schema, f"{table}_queues"),
    }


def regclass_literal(schema: str, table: str) -> str:
    """A quoted ``schema.table`` string to cast to regclass as a *parameter*."""
    return '"{}"."{}"'.format(schema.replace('"', '""'), table.replace('"', '""'))


class Rendered(dict[str, str]):
    """The named statements of one connection, each rendered (its identifiers quoted) when
    it is first used: an empty run sends 2 of the 55, and rendering them all took about a
    millisecond while the session was open (and billed)."""

    def __init__(self, conn: psycopg.Connection[Any], ids: dict[str, sql.Composable]) -> None:
        super().__init__()
        self.conn = conn
        self.ids = ids

    def __missing__(self, name: str) -> str:
        text = sql.SQL(QUERIES[name]).format(**self.ids).as_string(self.conn)
        self[name] = text
        return text

