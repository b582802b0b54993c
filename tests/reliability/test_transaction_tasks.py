"""Tasks with ``transaction=True`` (the handler's writes and the job's outcome in one
transaction) keep the guarantees of the others: a death is charged an attempt, the task's
timeout is enforced, and SIGTERM is bounded by --grace."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg

from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings
from tests.reliability._helpers import (
    executions,
    jobs,
    run_once,
    run_once_through_deaths,
    start_drainer,
    wait_for,
)

Conn = psycopg.Connection[Any]
APP = "rel_task_options_jobs"


def test_a_transaction_task_that_kills_the_process_is_charged_an_attempt(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("tx_exit", {}, max_attempts=2)], schema=schema)
    run_once_through_deaths(conn, pg_url, schema, tmp_path, 4, app=APP)
    (row,) = jobs(conn, schema).values()
    assert len(executions(tmp_path)) <= 3, (  # max_attempts + 1: the first death is free
        f"ran {len(executions(tmp_path))} times with max_attempts=2; row: {row['status']} "
        f"attempts={row['attempts']}")
    assert row["status"] == "failed", row


def test_a_transaction_tasks_timeout_is_enforced(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("tx_timeout_1s", {"sleep": 3}, max_attempts=1)],
                 schema=schema)
    code, out, err = run_once(pg_url, schema, tmp_path, "--lease", "30", app=APP)
    assert code == 0, err[-2000:]
    (row,) = jobs(conn, schema).values()
    assert row["status"] == "failed", (f"a 3 s handler with timeout=1 ended {row['status']}; "
                                       f"report {out.strip()}")
    assert "timeout" in (row["last_error"] or "").lower() or "timed out" in (
        row["last_error"] or "").lower(), row["last_error"]


def test_sigterm_during_a_transaction_task_is_bounded_by_grace(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("tx_long", {"sleep": 10})], schema=schema)
    proc = start_drainer(["run-once", "--grace", "2", "--lease", "30"], pg_url=pg_url,
                         schema=schema, log_dir=tmp_path, app=APP)
    try:
        wait_for(lambda: executions(tmp_path), 20, "the handler to start")
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=14)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.wait(timeout=30)
        proc.communicate()
    assert took < 6, f"exit {took:.1f}s after SIGTERM with --grace 2"
