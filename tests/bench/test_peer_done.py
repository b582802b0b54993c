"""The drain harnesses of chancy and DBOS stop their worker when their own table says the
queue is done (bench/peer_done.py): the query over tables shaped as theirs."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from bench.peer_done import TABLES, drained, progress

#: per peer: its table's queue and state columns, and rows (queue, state) of every kind
ROWS = {
    "chancy": [("bench", "succeeded")] * 3 + [("bench", "failed"), ("bench", "pending"),
              ("bench", "running"), ("bench", "retrying"), ("other", "pending")],
    "dbos": [("bench", "SUCCESS")] * 3 + [("bench", "ERROR"), ("bench", "ENQUEUED"),
             ("bench", "PENDING"), ("bench", "DELAYED"), ("other", "ENQUEUED")],
}


def _table(conn: psycopg.Connection[Any], schema: str, kind: str) -> sql.Composed:
    t = TABLES[kind]
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    table = sql.Identifier(schema, t.table)
    conn.execute(sql.SQL("CREATE TABLE {} ({} text, {} text)").format(
        table, sql.Identifier(t.queue_column), sql.Identifier(t.state_column)))
    return table


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_progress_counts_the_queues_succeeded_failed_and_unfinished_jobs(
        conn: psycopg.Connection[Any], schema: str, kind: str) -> None:
    table = _table(conn, schema, kind)
    with conn.cursor() as cur:
        cur.executemany(sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(table), ROWS[kind])
    assert progress(conn, kind, "bench", schema) == (3, 1, 3)
    assert progress(conn, kind, "other", schema) == (0, 0, 1)
    assert progress(conn, kind, "none", schema) == (0, 0, 0)


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_progress_of_a_drained_queue_has_nothing_unfinished(
        conn: psycopg.Connection[Any], schema: str, kind: str) -> None:
    table = _table(conn, schema, kind)
    final = [(q, s) for q, s in ROWS[kind] if s in TABLES[kind].final]
    with conn.cursor() as cur:
        cur.executemany(sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(table), final)
    counts = progress(conn, kind, "bench", schema)
    assert counts == (3, 1, 0)
    assert drained(counts, 4)


def test_drained_needs_every_job_finished_and_all_of_them_seen() -> None:
    assert drained((4, 0, 0), 4)
    assert drained((3, 1, 0), 4)  # a failed job is finished too (the check says it failed)
    assert not drained((3, 0, 1), 4)
    assert not drained((0, 0, 0), 4)  # nothing visible yet is not drained
    assert drained((0, 0, 0), 0)
