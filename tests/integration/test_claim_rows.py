"""Every kind of claim returns the claimed jobs whole: the row as the claim left it, trace
context included, whatever the queue's limits or the statement the claim travels in."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg import sql

from drainer.db import ClaimedRow, Queries
from drainer.queue_limits import Rate
from drainer.settings import Settings

KINDS = ("batch", "capped", "rated", "rated_capped", "combined", "first")


def _enqueue(conn: psycopg.Connection[Any], table: sql.Composable, queue: str) -> None:
    """Three jobs of ``queue``, each with its own payload, priority, run_at, max_attempts
    and producer trace context (as drainer's producers write it)."""
    for n in range(3):
        trace = {"traceparent": f"00-{n + 1:032x}-{n + 1:016x}-01", "tracestate": f"q={queue}"}
        conn.execute(sql.SQL(
            "INSERT INTO {} (queue, payload, priority, run_at, max_attempts, trace_context) "
            "VALUES (%s, %s, %s, now() - make_interval(secs => %s), %s, %s)").format(table),
            [queue, json.dumps({"queue": queue, "n": n}), n, 10 - n, 7 + n, json.dumps(trace)])


def _stored(conn: psycopg.Connection[Any], table: sql.Composable,
            ids: list[int]) -> list[ClaimedRow]:
    """The claimed jobs as the table holds them, in ClaimedRow's fields."""
    fields = sql.SQL(", ").join(map(sql.Identifier, ClaimedRow._fields))
    return [ClaimedRow(*r) for r in conn.execute(
        sql.SQL("SELECT {} FROM {} WHERE id = ANY(%s)").format(fields, table), [ids])]


def test_every_claim_kind_returns_the_whole_claimed_row(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    table = sql.Identifier(migrated.schema_name, migrated.table)
    for kind in KINDS:
        _enqueue(conn, table, kind)
    q = Queries(conn, migrated.schema_name, migrated.table)

    claimed: dict[str, list[ClaimedRow]] = {
        "batch": q.claim_batch("batch", 10, 300.0, run_id="r"),
        "capped": q.claim_batch_capped("capped", 10, 300.0, 5, run_id="r"),
        "rated": q.claim_batch_rated("rated", 10, 300.0, None, Rate(100, 60.0),
                                     run_id="r")[0],
        "rated_capped": q.claim_batch_rated("rated_capped", 10, 300.0, 5, Rate(100, 60.0),
                                            run_id="r")[0],
    }
    # the combined statement completes the first claim's jobs, with results, and claims
    batch = claimed["batch"]
    assert sorted(batch) == sorted(_stored(conn, table, [r.id for r in batch]))
    results = [json.dumps({"result": row.id}) for row in batch]
    written, claimed["combined"] = q.complete_many_and_claim(
        [r.id for r in batch], [r.fence or 0 for r in batch], "combined", 10, 300.0,
        run_id="r", results=results)
    assert written == {r.id for r in batch}
    assert conn.execute(sql.SQL("SELECT id, result FROM {} WHERE id = ANY(%s) ORDER BY id")
                        .format(table), [[r.id for r in batch]]).fetchall() == [
        (r.id, {"result": r.id}) for r in sorted(batch, key=lambda r: r.id)]
    # the run's first claim, behind run_start (which names the queue in drainer.start)
    conn.execute("SELECT set_config('drainer.start', 'q:first', false)")
    rows = conn.execute(q.text("claim_first"), {
        "queues": ["first"], "eligible": [True], "leases": [300.0],
        "batch_size": 10, "start_now": 10, "run_id": "r",
    }).fetchall()
    assert {len(r) for r in rows} == {len(ClaimedRow._fields)}
    claimed["first"] = [ClaimedRow(*r) for r in rows]

    for kind in KINDS:
        got = sorted(claimed[kind], key=lambda r: r.id)
        assert len(got) == 3, kind
        if kind != "batch":  # compared above: its rows are done now
            assert got == sorted(_stored(conn, table, [r.id for r in got])), kind
        for n, row in enumerate(sorted(got, key=lambda r: r.priority)):
            assert row.queue == kind and row.payload == {"queue": kind, "n": n}, kind
            assert (row.attempts, row.max_attempts, row.fence) == (1, 7 + n, 1), kind
            assert row.trace_context == {
                "traceparent": f"00-{n + 1:032x}-{n + 1:016x}-01", "tracestate": f"q={kind}"}
            assert row.locked_until > row.run_at, kind
