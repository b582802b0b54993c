"""The claim stays an index scan on the claim index that stops after the batch, per queue.

100,000 queued rows over 5 queues: a claim over ``queue = ANY(...)`` with an ORDER BY the
index cannot deliver would sort every queued row; drainer claims one queue at a time, so
every claim (custom and generic plan, alone or behind the batch completion) must be
Limit > LockRows > Index Scan on the claim index (the run's first claim a priority at a
time: a range of the index per priority, found by one probe each), with no Sort and no Seq
Scan.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.db import Queries
from drainer.settings import Settings

QUEUES = [f"q{i}" for i in range(5)]
PARAMS = {"batch_size": 10, "lease": 300.0, "ids": [1, 2], "fences": [1, 1],
          "results": [None, None], "start_now": 1, "run_id": "test", "followups": "[]",
          "errors": ["e", "e"], "max_attempts": [None, None], "bases": [10.0, 10.0],
          "caps": [3600.0, 3600.0], "jitters": [0.0, 0.0], "seconds": [1.0, 1.0],
          "leases": [300.0, 300.0]}
#: the type of each parameter, as a prepared statement declares it
TYPES = {"ids": "bigint[]", "fences": "bigint[]", "results": "jsonb[]", "followups": "jsonb",
         "queue": "text", "batch_size": "int8", "start_now": "int8", "run_id": "text",
         "lease": "float8", "errors": "text[]", "max_attempts": "int[]", "bases": "float8[]",
         "caps": "float8[]", "jitters": "float8[]", "seconds": "float8[]",
         "leases": "float8[]"}


@pytest.fixture
def loaded(migrated: Settings, conn: psycopg.Connection[Any]) -> Settings:
    table = sql.Identifier(migrated.schema_name, "jobs")
    conn.execute(sql.SQL(
        "INSERT INTO {} (queue, payload, priority, run_at) "
        "SELECT (%s::text[])[1 + g %% 5], '{{}}', g %% 3, now() - (g %% 1000) * interval '1s' "
        "FROM generate_series(1, 100000) g").format(table), [QUEUES])
    conn.execute(sql.SQL(
        "INSERT INTO {} (queue, payload, status, finished_at) "
        "SELECT 'q0', '{{}}', 'done', now() FROM generate_series(1, 20000)").format(table))
    conn.execute(sql.SQL("ANALYZE {}").format(table))
    return migrated


def _nodes(plan: dict[str, Any], parents: tuple[str, ...] = ()
           ) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    yield parents, plan
    for child in plan.get("Plans", []):
        yield from _nodes(child, (*parents, plan["Node Type"]))


def _assert_index_claim(plan: dict[str, Any], index: str, where: str,
                        walk: bool = False) -> None:
    nodes = list(_nodes(plan))
    types = [n["Node Type"] for _p, n in nodes]
    assert "Sort" not in types and "Incremental Sort" not in types, (where, types)
    # the first start_now rows are a LIMIT over the claimed CTE, not a row_number() over it
    assert "WindowAgg" not in types, (where, types)
    scans = [(p, n) for p, n in nodes if n.get("Index Name") == index]
    locked = [(p, n) for p, n in scans if p[-1] == "LockRows"]
    assert locked, (where, types)
    for parents, node in scans:
        assert node["Node Type"] in ("Index Scan", "Index Only Scan"), (where, node)
        cond = node.get("Index Cond", "")
        if parents[-1] == "LockRows":
            # the rows claimed, stopped by the batch's LIMIT; walking (claim_first): one
            # priority's due jobs at a time, a range of the index
            assert parents[-2:] == ("Limit", "LockRows"), (where, parents)
            assert "run_at <=" in cond and ("priority =" in cond or not walk), (where, cond)
        else:
            # the walk to the queue's next priority: one entry of the index, nothing locked
            assert parents[-1] == "Limit" and "queue =" in cond, (where, parents, cond)
    assert walk or len(scans) == len(locked), (where, types)
    assert not [n for _p, n in nodes if n["Node Type"] == "Seq Scan"
                and n.get("Relation Name") == "jobs"], (where, types)


def _explain(conn: psycopg.Connection[Any], text: str, params: dict[str, Any]
             ) -> dict[str, Any]:
    row = conn.execute("EXPLAIN (FORMAT JSON) " + text, params).fetchone()
    assert row is not None
    plan: dict[str, Any] = row[0][0]["Plan"]
    return plan


def _explain_generic(conn: psycopg.Connection[Any], text: str, names: list[str],
                     types: list[str], values: dict[str, Any]) -> dict[str, Any]:
    for i, name in enumerate(names, start=1):
        text = text.replace(f"%({name})s", f"${i}")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        conn.execute(f"PREPARE drainer_plan_test({', '.join(types)}) AS {text}")
        args = ", ".join(sql.Literal(values[n]).as_string(conn) for n in names)
        row = conn.execute(f"EXPLAIN (FORMAT JSON) EXECUTE drainer_plan_test({args})"
                           ).fetchone()
    finally:
        conn.execute("DEALLOCATE ALL")
        conn.execute("RESET plan_cache_mode")
    assert row is not None
    plan: dict[str, Any] = row[0][0]["Plan"]
    return plan


@pytest.mark.parametrize("queue", QUEUES)
def test_claim_is_an_index_scan_per_queue(loaded: Settings, conn: psycopg.Connection[Any],
                                          queue: str) -> None:
    q = Queries(conn, loaded.schema_name, loaded.table)
    index = f"{loaded.table}_claim_idx"
    values = {**PARAMS, "queue": queue}
    _assert_index_claim(_explain(conn, q.text("claim_batch"), values), index, "claim custom")
    _assert_index_claim(
        _explain(conn, q.text("complete_many_and_claim"), values), index,
        "complete+claim custom")
    _assert_index_claim(_explain_generic(
        conn, q.text("claim_batch"), ["queue", "batch_size", "start_now", "run_id", "lease"],
        ["text", "int8", "int8", "text", "float8"], values), index, "claim generic")
    generic = _explain_generic(
        conn, q.text("complete_many_and_claim"),
        ["ids", "fences", "results", "followups", "queue", "batch_size", "start_now",
         "run_id", "lease"],
        ["bigint[]", "bigint[]", "jsonb[]", "jsonb", "text", "int8", "int8", "text",
         "float8"],
        values)
    _assert_index_claim(generic, index, "complete+claim generic")
    # the completion finds its rows by primary key, never by walking the lease index
    # (every running row times every completed id, as a generic plan with a literal did)
    used = {n.get("Index Name") for _p, n in _nodes(generic)}
    assert f"{loaded.table}_lease_idx" not in used and f"{loaded.table}_pkey" in used, used


def _assert_probe_per_queue(plan: dict[str, Any], index: str, where: str) -> None:
    nodes = list(_nodes(plan))
    types = [n["Node Type"] for _p, n in nodes]
    scans = [(p, n) for p, n in nodes if n.get("Index Name") == index]
    assert scans, (where, types)
    for parents, node in scans:
        # probes of the claim index per queue: its next priority (stopped at the first row),
        # or that priority's due jobs (a range: queue, priority and run_at in the condition)
        assert node["Node Type"] in ("Index Scan", "Index Only Scan"), (where, node)
        cond = node.get("Index Cond", "")
        assert parents[-1] == "Limit" or ("priority =" in cond and "run_at <=" in cond), \
            (where, parents, cond)
    assert not [n for _p, n in nodes if n["Node Type"] == "Seq Scan"
                and n.get("Relation Name") == "jobs"], (where, types)


def test_due_queues_probes_the_claim_index_once_per_queue(
        loaded: Settings, conn: psycopg.Connection[Any]) -> None:
    q = Queries(conn, loaded.schema_name, loaded.table)
    index = f"{loaded.table}_claim_idx"
    served = [*QUEUES, *(f"empty{i}" for i in range(300))]
    _assert_probe_per_queue(_explain(conn, q.text("due_queues"), {"queues": served}),
                            index, "due_queues custom")
    _assert_probe_per_queue(_explain_generic(conn, q.text("due_queues"), ["queues"],
                                             ["text[]"], {"queues": served}),
                            index, "due_queues generic")
    assert q.due_queues(["nothing", *reversed(QUEUES)]) == list(reversed(QUEUES))


def test_the_first_claim_sent_with_run_start_is_an_index_scan(
        loaded: Settings, conn: psycopg.Connection[Any]) -> None:
    """claim_first (behind run_start, which names the first due queue in drainer.start):
    that queue's claim, the same Limit > LockRows > Index Scan as claim_batch, a range of
    the index per priority (claim_walk); no Sort, no Seq Scan of the jobs, whatever the
    number of served queues."""
    q = Queries(conn, loaded.schema_name, loaded.table)
    index = f"{loaded.table}_claim_idx"
    served = [*(f"empty{i}" for i in range(300)), *QUEUES]
    values = {"queues": served, "eligible": [True] * len(served),
              "leases": [300.0] * len(served), "batch_size": 10, "start_now": 1,
              "run_id": "test"}
    conn.execute("SELECT set_config('drainer.start', %s, false)", [f"q:{QUEUES[1]}"])
    _assert_index_claim(_explain(conn, q.text("claim_first"), values), index, "claim_first",
                        walk=True)
    rows = conn.execute(q.text("claim_first"), values).fetchall()
    assert len(rows) == 10 and {r[1] for r in rows} == {QUEUES[1]}
    # not eligible (a max_running queue, say): it claims nothing, not the next queue
    values["eligible"] = [name != QUEUES[1] for name in served]
    assert conn.execute(q.text("claim_first"), values).fetchall() == []
    values["eligible"] = [True] * len(served)
    # run_start's other decisions: an outdated table (''), nothing due ('idle'), and a
    # queue named like a decision is still only its own 'q:' value
    for start in ("", "idle", QUEUES[1]):
        conn.execute("SELECT set_config('drainer.start', %s, false)", [start])
        assert conn.execute(q.text("claim_first"), values).fetchall() == [], start


#: every statement that writes an outcome to claimed jobs, fenced on (id, fence) by
#: the fragment `fenced`
OUTCOMES = ["complete_many", "delete_completed_many", "fail_many", "snooze_many",
            "extend_many", "release_many"]


@pytest.mark.parametrize("name", OUTCOMES)
def test_outcomes_find_their_rows_by_primary_key_in_custom_and_generic_plans(
        loaded: Settings, conn: psycopg.Connection[Any], name: str) -> None:
    """An outcome as psycopg and pgbench -M prepared run it: a custom plan (re-planned with the
    values) or the generic one, each one primary-key probe per id, never the lease index
    walked and joined with every id (running x batch comparisons: a claim of 1,000 and its
    completion ran at 2,000 jobs/s under pgbench -M prepared; at a claim of 10 the custom
    plan that walked it cost the completion 0.61 ms where the probes cost 0.44 ms)."""
    q = Queries(conn, loaded.schema_name, loaded.table)
    text = q.text(name)
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", text)))
    # as the statistics see a table filled and analyzed before a drain: no running row, so
    # an empty lease index looks like the cheapest way to the running rows
    for where, plan in (
            ("custom", _explain(conn, text, PARAMS)),
            ("generic", _explain_generic(conn, text, names, [TYPES[n] for n in names],
                                         PARAMS))):
        used = {n.get("Index Name") for _p, n in _nodes(plan)}
        assert f"{loaded.table}_lease_idx" not in used, (where, used)
        assert f"{loaded.table}_pkey" in used, (where, used)


def test_a_prepared_claim_and_completion_keep_the_generic_plan(
        loaded: Settings, conn: psycopg.Connection[Any]) -> None:
    """claim_batch and complete_many as the drain sends them in step (psycopg prepares a
    statement at its fifth execution): after the server's first five custom plans, the
    generic plan is kept, not planned again at every execution. With LIMIT as a plain
    parameter the custom plan always looked cheaper, and the claim was planned every time
    (0.18 ms of its 0.72 ms under pgbench -M prepared at LIMIT 10)."""
    q = Queries(conn, loaded.schema_name, loaded.table)
    for _ in range(15):
        rows = q.claim_batch(QUEUES[2], 10, 300.0, run_id="test")
        assert len(rows) == 10
        assert q.complete_many([r.id for r in rows], [r.fence for r in rows]) == \
            {r.id for r in rows}
    plans = {("claim" if "FOR UPDATE SKIP LOCKED" in text else "completion"): (generic, custom)
             for text, generic, custom in conn.execute(
                 "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")}
    assert set(plans) == {"claim", "completion"}, plans
    for generic, custom in plans.values():
        assert custom <= 5 and generic >= 5, plans
