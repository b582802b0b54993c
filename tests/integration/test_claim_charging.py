"""The claim statement itself charges only the suspects it claims (a claim proves no start:
an expired lease gives any other job its attempt back), claims suspects only among the first
start_now rows (in claim order) and leaves a suspect queued beyond them: what the unit tests'
fake table (tests/unit/fake_statements.py) assumes, checked on PostgreSQL, in step (all
start at once), ahead (none) and between."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.db import Queries
from drainer.settings import Settings


def _fill(conn: psycopg.Connection[Any], table: sql.Composable, suspects: set[int]) -> list[int]:
    """Ten due jobs, in claim order 0..9 (run_at ascending); those at ``suspects`` suspect."""
    ids = []
    for n in range(10):
        row = conn.execute(sql.SQL(
            "INSERT INTO {} (queue, payload, run_at, suspect) "
            "VALUES ('q', '{{}}', now() - make_interval(secs => %s), %s) RETURNING id"
        ).format(table), [100 - n, n in suspects]).fetchone()
        assert row is not None
        ids.append(int(row[0]))
    return ids


@pytest.mark.parametrize("start_now", [10, 0, 3, 1000])
@pytest.mark.parametrize("kind", ["claim_batch", "complete_many_and_claim"])
def test_a_claim_charges_its_suspects_alone_and_later_suspects_wait(
        migrated: Settings, conn: psycopg.Connection[Any], start_now: int, kind: str) -> None:
    table = sql.Identifier(migrated.schema_name, "jobs")
    ids = _fill(conn, table, suspects={1, 5})
    q = Queries(conn, migrated.schema_name, migrated.table)
    if kind == "claim_batch":
        rows = q.claim_batch("q", 10, 300.0, start_now=start_now, run_id="r")
    else:
        _, rows = q.complete_many_and_claim([], [], "q", 10, 300.0, start_now=start_now,
                                            run_id="r")
    suspects = {ids[1], ids[5]}
    expected = [i for n, i in enumerate(ids) if n < start_now or n not in (1, 5)]
    assert [r.id for r in rows] == expected
    state = {r[0]: tuple(r[1:]) for r in conn.execute(sql.SQL(
        "SELECT id, status, charged, suspect, run_id FROM {}").format(table)).fetchall()}
    for n, i in enumerate(ids):
        if i in expected:
            assert state[i] == ("running", i in suspects, False, "r"), (n, state[i])
        else:  # a suspect behind the jobs that start at once: left for a later claim
            assert state[i] == ("queued", False, True, None), (n, state[i])
