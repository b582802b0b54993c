"""Rows drainer cannot decode, written by plain SQL as a producer role may (a payload nested
deeper than Python's JSON decoder goes, a run_at beyond Python's datetime): the job fails
alone, or the table refuses the row; the rest drains and the ops commands still work."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.settings import Settings
from tests.conftest import run_cli
from tests.reliability._helpers import enqueue_jobs, jobs, run_once

Conn = psycopg.Connection[Any]

_TYPES = {"queue": "text", "payload": "jsonb", "run_at": "timestamptz", "max_attempts": "int"}


def insert_raw(conn: Conn, schema: str, rows: list[dict[str, Any]]) -> None:
    """Rows written by plain SQL, as the producer role may: no drainer code in between."""
    for r in rows:
        cols = list(r)
        conn.execute(sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            sql.Identifier(schema, "jobs"), sql.SQL(", ").join(map(sql.Identifier, cols)),
            sql.SQL(", ").join(sql.SQL("{}::{}").format(sql.Placeholder(), sql.SQL(t))
                               for t in (_TYPES[c] for c in cols))), [r[c] for c in cols])


@pytest.mark.parametrize("bad", [
    {"queue": "rec", "run_at": "-infinity"},
    {"queue": "rec", "payload": "[" * 5000 + "]" * 5000},
], ids=["run_at_-infinity", "payload_nested_5000"])
def test_an_undecodable_row_fails_alone_and_the_rest_drains(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path, bad: dict[str, Any]
) -> None:
    schema = migrated.schema_name
    enqueue_jobs(conn, schema, 9)
    try:
        insert_raw(conn, schema, [bad])
        refused = False
    except psycopg.errors.CheckViolation:
        refused = True  # the schema refusing the row keeps it out as well
    code, out, err = run_once(pg_url, schema, tmp_path, "--batch-size", "10", "--lease", "30")
    assert code == 0, f"run-once exit {code}: {err.strip().splitlines()[-1:]}"
    report = json.loads(out)
    assert report["succeeded"] == 9, report
    rows = jobs(conn, schema).values()
    assert sum(r["status"] == "done" for r in rows) == 9
    if not refused:
        (row,) = [r for r in rows if r["status"] != "done"]
        assert row["status"] == "failed" and row["last_error"], row
    for cmd in (["status", "--json"], ["jobs"]):
        p = run_cli(cmd, pg_url=pg_url, schema=schema)
        assert p.returncode == 0, (cmd, p.stderr)


def test_a_far_future_run_at_does_not_break_the_run_or_the_ops_commands(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    schema = migrated.schema_name
    enqueue_jobs(conn, schema, 3)
    # the schema may refuse the row: what follows must hold all the same
    with contextlib.suppress(psycopg.errors.CheckViolation):
        insert_raw(conn, schema, [{"queue": "rec", "run_at": "20000-01-01 00:00:00+00"}])
    code, out, err = run_once(pg_url, schema, tmp_path)
    assert code == 0, f"run-once exit {code}: {err.strip().splitlines()[-1:]}"
    assert json.loads(out)["succeeded"] == 3
    for cmd in (["status", "--json"], ["jobs"], ["jobs", "--status", "queued"]):
        p = run_cli(cmd, pg_url=pg_url, schema=schema)
        assert p.returncode == 0, (cmd, p.stderr.strip())
