"""Which attempts a process death is charged for, on the real statements (tests/unit/
test_charging.py has the same rules over the in-memory fake): only the jobs that started,
and the reaper fails a job at its task's max_attempts, not the row's."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import psycopg

from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings
from tests.reliability._helpers import (
    enqueue_jobs,
    executions,
    jobs,
    run_once,
    run_once_through_deaths,
    runs_per_job,
    start_drainer,
    status_counts,
    wait_for,
    wait_leases_expired,
)

Conn = psycopg.Connection[Any]
APP = "rel_task_options_jobs"


def test_jobs_claimed_but_never_started_are_not_charged_by_a_death(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    schema = migrated.schema_name
    # the poison job first (priority), 10 good ones claimed in the same batch behind it
    enqueue_many(conn, [JobSpec("poison_among_good", {"exit": True}, priority=10,
                                max_attempts=1)], schema=schema)
    enqueue_jobs(conn, schema, 10, queue="poison_among_good", max_attempts=1)
    code, _out, _err = run_once(pg_url, schema, tmp_path, "--batch-size", "11", "--lease", "1",
                                app=APP)
    assert code == 7, "the poison job kills the drainer"
    assert len(executions(tmp_path)) == 1, "only the poison job started"
    wait_leases_expired(conn, schema)
    # the poison job's first death is free (a claim proves no start); the next, as a
    # suspect at the head of its claim, is charged and fails it
    run_once_through_deaths(conn, pg_url, schema, tmp_path, 3, app=APP)
    assert jobs(conn, schema)[min(jobs(conn, schema))]["status"] == "failed"
    good = [r for r in jobs(conn, schema).values() if r["id"] != min(jobs(conn, schema))]
    never_ran = [r for r in good if r["status"] == "failed"]
    assert not never_ran, (f"{len(never_ran)} good jobs failed with 0 executions: "
                           f"{never_ran[0]['last_error']!r}")
    assert {r["status"] for r in good} == {"done"}
    assert {runs_per_job(tmp_path)[r["id"]] for r in good} == {1}


def test_the_reaper_honours_the_tasks_max_attempts(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("exit_max_attempts_2", {})], schema=schema)  # the row's: 5
    run_once_through_deaths(conn, pg_url, schema, tmp_path, 6, app=APP)
    (row,) = jobs(conn, schema).values()
    # max_attempts + 1: the first death is free (a claim proves no start), then charged
    assert len(executions(tmp_path)) == 3, (
        f"ran {len(executions(tmp_path))} times, the task allows 2 + 1; row: {row['status']} "
        f"attempts={row['attempts']}")
    assert row["status"] == "failed"


def test_a_death_as_the_claim_commits_charges_no_job(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("rec", {"n": i, "sleep": 0.3}, max_attempts=1)
                        for i in range(64)], schema=schema)
    proc = start_drainer(["run-once", "--concurrency", "64", "--batch-size", "64",
                          "--lease", "1"], pg_url=pg_url, schema=schema, log_dir=tmp_path)
    try:  # kill -9 as soon as the claim's rows turn running
        wait_for(lambda: status_counts(conn, schema).get("running"), 30,
                 "the claim", interval=0.001)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    started = set(runs_per_job(tmp_path))
    wait_leases_expired(conn, schema)

    code, _out, err = run_once(pg_url, schema, tmp_path, "--concurrency", "64", "--lease", "30")
    assert code == 0, err[-2000:]
    table = jobs(conn, schema)
    failed = [r for r in table.values() if r["status"] == "failed"]
    assert not failed, (f"{len(failed)} jobs failed ({len(set(table) - started)} never "
                        f"started before the kill): {failed[0]['last_error']!r}")
    assert {r["status"] for r in table.values()} == {"done"}
    assert all(r["attempts"] == 1 for r in table.values())  # the run that finished
    assert all(runs_per_job(tmp_path)[i] == 1 for i in set(table) - started)
