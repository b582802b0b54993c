"""A drain whose connection is cut (the compute suspends under a handler, or goes away at
any moment) reconnects, writes what finished, and completes: exit 0, every job done once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.suspend import SuspendSimulator
from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings
from tests.conftest import finish
from tests.reliability._helpers import executions, jobs
from tests.suspend.conftest import (
    IDLE_S,
    cut_once_a_handler_runs,
    start_drainer,
    target_of,
    url_through,
)

pytestmark = pytest.mark.slow

#: A resume longer than any connect timeout drainer can be given: libpq's floor is 2 s.
COLD_START_LONG_S = 3.0


def _enqueue(conn: psycopg.Connection[Any], schema: str, n: int, sleep: float) -> list[int]:
    """n sleepy jobs; their ids, in order."""
    enqueue_many(conn, [JobSpec("sleepy", {"sleep": sleep}) for _ in range(n)], schema=schema)
    return sorted(jobs(conn, schema))


def _done_once(conn: psycopg.Connection[Any], schema: str, log_dir: Path) -> None:
    rows = jobs(conn, schema)
    assert {r["status"] for r in rows.values()} == {"done"}, rows
    ends = Counter(job_id for job_id, _a, _p in executions(log_dir, "end"))
    assert ends == dict.fromkeys(rows, 1), ends


def test_handlers_that_outlive_the_idle_timeout_finish_every_job_once(
        pg_url: str, schema: str, migrated: Settings, conn: psycopg.Connection[Any],
        sim: SuspendSimulator, tmp_path: Path) -> None:
    """Handlers longer than T that do not touch the database (the heartbeat of the default
    300 s lease comes at 100 s): the compute suspends under each of them."""
    _enqueue(conn, schema, 3, IDLE_S * 1.6)
    proc = start_drainer(["run-once", "--queue", "sleepy"], url=url_through(pg_url, sim),
                         schema=schema, log_dir=tmp_path)
    code, _out, err = finish(proc, 120)
    cuts = [e for e in sim.events() if e.kind == "suspend" and "drainer" in e.cut_applications]
    assert cuts, sim.events()  # the scenario: the drain's connection was cut under a handler
    assert code == 0, err[-3000:]
    _done_once(conn, schema, tmp_path)


def test_a_cut_between_claim_and_outcome_loses_no_outcome(
        pg_url: str, schema: str, migrated: Settings, conn: psycopg.Connection[Any],
        sim: SuspendSimulator, tmp_path: Path) -> None:
    """The compute goes away (a restart, a pooler, the network) while a handler works, well
    inside T: the drain reconnects through the cold start, writes the outcome, goes on."""
    _enqueue(conn, schema, 2, 1.0)
    proc = start_drainer(["run-once", "--queue", "sleepy"], url=url_through(pg_url, sim),
                         schema=schema, log_dir=tmp_path)
    try:
        # the drain's one connection, its two jobs claimed and no outcome written
        assert cut_once_a_handler_runs(sim, tmp_path) == 1
    finally:
        code, _out, err = finish(proc, 120)
    assert code == 0, err[-3000:]
    _done_once(conn, schema, tmp_path)
    assert len(sim.resumes()) == 2  # the run's start, and its reconnect


def test_the_first_connection_waits_out_a_cold_start_longer_than_the_connect_timeout(
        pg_url: str, schema: str, migrated: Settings, conn: psycopg.Connection[Any],
        tmp_path: Path) -> None:
    """A resume of 3 s against --connect-timeout 1 (libpq waits 2 s at least): the first
    attempt times out, a retry gets through once the compute is up."""
    _enqueue(conn, schema, 1, 0)
    with SuspendSimulator(IDLE_S, COLD_START_LONG_S, target_of(pg_url)) as slow:
        proc = start_drainer(["run-once", "--queue", "sleepy", "--connect-timeout", "1"],
                             url=url_through(pg_url, slow), schema=schema, log_dir=tmp_path)
        code, _out, err = finish(proc, 60)
    assert code == 0, err[-3000:]
    assert "connect attempt 1/5 failed" in err  # it did time out before the compute was up
    _done_once(conn, schema, tmp_path)


def test_a_reconnect_waits_out_a_cold_start_longer_than_the_connect_timeout(
        pg_url: str, schema: str, migrated: Settings, conn: psycopg.Connection[Any],
        tmp_path: Path) -> None:
    _enqueue(conn, schema, 1, 1.0)
    with SuspendSimulator(IDLE_S, COLD_START_LONG_S, target_of(pg_url)) as slow:
        proc = start_drainer(["run-once", "--queue", "sleepy", "--connect-timeout", "1"],
                             url=url_through(pg_url, slow), schema=schema, log_dir=tmp_path)
        try:
            # the drain's connection (and the first attempt's, which timed out on the
            # client's side and that psycopg has not closed yet: the compute still saw it)
            assert cut_once_a_handler_runs(slow, tmp_path) >= 1
        finally:
            code, _out, err = finish(proc, 120)
        resumes = slow.resumes()
    assert code == 0, err[-3000:]
    _done_once(conn, schema, tmp_path)
    assert len(resumes) == 2 and resumes[1].cause == "drainer"


def test_a_database_that_stays_unreachable_after_a_cut_is_exit_3(
        pg_url: str, schema: str, migrated: Settings, conn: psycopg.Connection[Any],
        tmp_path: Path) -> None:
    """The compute goes away under a handler and does not come back (nothing listens any
    more): the reconnect uses up its attempts, once, and the run exits 3; the job is left
    to its lease."""
    _enqueue(conn, schema, 1, 1.0)
    with SuspendSimulator(IDLE_S, 0.2, target_of(pg_url)) as gone:
        proc = start_drainer(["run-once", "--queue", "sleepy"], url=url_through(pg_url, gone),
                             schema=schema, log_dir=tmp_path, DRAINER_CONNECT_RETRIES="1")
        try:
            assert cut_once_a_handler_runs(gone, tmp_path) == 1
        except BaseException:
            finish(proc, 30)
            raise
    code, _out, err = finish(proc, 60)  # the simulator is gone: connections are refused
    assert code == 3, err[-3000:]
    assert err.count("connect attempt 1/2 failed") == 1, err[-3000:]  # not tried again
    assert "database unreachable after 2 attempts" in err
    (row,) = jobs(conn, schema).values()
    assert row["status"] == "running"
