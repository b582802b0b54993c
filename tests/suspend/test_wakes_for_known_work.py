"""What drainer knows is coming wakes it, through a compute that suspends: a lease that a
cut left behind, a retry after a drain that serve ran, a retry due a moment after another."""

from __future__ import annotations

import http.client
import json
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.suspend import SuspendSimulator
from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings
from tests.acceptance._proc import DrainerProcess
from tests.conftest import finish
from tests.reliability._helpers import executions, jobs
from tests.suspend.conftest import (
    COLD_START_S,
    IDLE_S,
    RETRY_AFTER_S,
    cut_once_a_handler_runs,
    start_drainer,
    url_through,
)

pytestmark = pytest.mark.slow

TOKEN = "suspend-test-token"


def test_after_a_cut_the_next_run_is_due_when_the_stranded_lease_expires(
        pg_url: str, schema: str, migrated: Settings, conn: psycopg.Connection[Any],
        sim: SuspendSimulator, tmp_path: Path) -> None:
    """The compute went away under a handler and the run with it (a function frozen or
    killed): its job stays running until the lease expires, and that is when the next
    wake must come, not --max-sleep later."""
    enqueue_many(conn, [JobSpec("sleepy", {"sleep": 60})], schema=schema)
    url = url_through(pg_url, sim)
    dead = start_drainer(["run-once", "--queue", "sleepy", "--lease", "30"], url=url,
                         schema=schema, log_dir=tmp_path)
    try:
        assert cut_once_a_handler_runs(sim, tmp_path) == 1
    finally:
        dead.kill()
        finish(dead, 10)
    (row,) = jobs(conn, schema).values()
    assert row["status"] == "running" and not row["expired"], row
    lease: datetime = row["locked_until"]
    code, out, err = finish(start_drainer(["run-once", "--queue", "sleepy"], url=url,
                                          schema=schema, log_dir=tmp_path), 60)
    assert code == 0, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["claimed"] == 0 and report["reaped"] == 0  # the lease has not expired yet
    assert report["next_due_at"] is not None, report
    due = datetime.fromisoformat(report["next_due_at"])
    assert lease <= due <= lease + timedelta(seconds=2), (due, lease)


def _post_drain(port: int) -> dict[str, Any]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("POST", "/drain?wait=true", headers={"Authorization": f"Bearer {TOKEN}"})
        r = c.getresponse()
        body: dict[str, Any] = json.loads(r.read() or b"{}")
        assert r.status == 200, (r.status, body)
        return body
    finally:
        c.close()


def test_serve_runs_a_retry_without_another_trigger(
        pg_url: str, schema: str, migrated: Settings, conn: psycopg.Connection[Any],
        sim: SuspendSimulator, tmp_path: Path) -> None:
    enqueue_many(conn, [JobSpec("late_retry", {"fail": True})], schema=schema)
    proc = DrainerProcess(["serve", "--port", "0", "--queue", "late_retry"],
                          pg_url=url_through(pg_url, sim), schema=schema,
                          DRAINER_APP="suspend_jobs", REL_LOG_DIR=str(tmp_path),
                          DRAINER_IDLE_TIMEOUT=f"{IDLE_S:g}", DRAINER_CONNECT_RETRIES="4",
                          DRAINER_TRIGGER_TOKEN=TOKEN,
                          SUSPEND_RETRY_AFTER_S=f"{RETRY_AFTER_S:g}")
    try:
        port = int(proc.wait_log("listening on")["port"])
        run = _post_drain(port)
        assert run["report"]["retried"] == 1, run  # the first attempt failed: retry in 1 s
        # the retry is due 1 s later; the compute may suspend and resume in between
        deadline = time.monotonic() + RETRY_AFTER_S + IDLE_S + COLD_START_S + 8
        while time.monotonic() < deadline:
            (row,) = jobs(conn, schema).values()
            if row["status"] == "done":
                break
            time.sleep(0.1)
        assert row["status"] == "done", (row, proc.stderr()[-3000:])
        assert sorted(a for _j, a, _p in executions(tmp_path)) == [1, 2]
    finally:
        proc.kill()


def test_retries_due_a_moment_apart_run_in_the_same_wake(
        pg_url: str, schema: str, migrated: Settings, conn: psycopg.Connection[Any],
        sim: SuspendSimulator, tmp_path: Path) -> None:
    """5 jobs fail (retry 1 s later) and 15 snooze in the same drain for a moment longer:
    the drain lingers for the first 5, runs them, and its tail ends before the 15 are due.
    With --retry-linger covering both, both run before the run exits, on its one
    connection. The moment is 0.2 s: at 30 ms (as first seen) the tail of the drain here
    (13-21 ms from the first due time to the end) ends after the second due time half
    the time under load, and the run then claims the 15 by luck."""
    gap = 0.2
    enqueue_many(conn, [JobSpec("late_retry", {"fail": True}) for _ in range(5)]
                 + [JobSpec("late_retry", {"after": RETRY_AFTER_S + gap})
                    for _ in range(15)], schema=schema)
    code, out, err = finish(start_drainer(
        ["run-once", "--queue", "late_retry", "--batch-size", "20", "--retry-linger", "5"],
        url=url_through(pg_url, sim), schema=schema, log_dir=tmp_path), 60)
    assert code == 0, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert (report["retried"], report["snoozed"]) == (5, 15), report
    rows = jobs(conn, schema)
    assert Counter(r["status"] for r in rows.values()) == {"done": 20}, report
    assert report["succeeded"] == 20 and report["next_due_at"] is None, report
    assert len(sim.resumes()) == 1
