"""Which attempts a process death is charged for, on the real statements (tests/unit/
test_charging.py has the same rules over the in-memory fake): only the jobs that started,
and the reaper fails a job at its task's max_attempts, not the row's."""

from __future__ import annotations

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
    code, _out, err = run_once(pg_url, schema, tmp_path, "--lease", "30", app=APP)
    assert code == 0, err[-2000:]
    good = [r for r in jobs(conn, schema).values() if r["id"] != min(jobs(conn, schema))]
    never_ran = [r for r in good if r["status"] == "failed"]
    assert not never_ran, (f"{len(never_ran)} good jobs failed with 0 executions: "
                           f"{never_ran[0]['last_error']!r}")
    assert {r["status"] for r in good} == {"done"}
    assert set(runs_per_job(tmp_path).values()) == {1}


def test_the_reaper_honours_the_tasks_max_attempts(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("exit_max_attempts_2", {})], schema=schema)  # the row's: 5
    run_once_through_deaths(conn, pg_url, schema, tmp_path, 6, app=APP)
    (row,) = jobs(conn, schema).values()
    assert len(executions(tmp_path)) == 2, (
        f"ran {len(executions(tmp_path))} times, the task allows 2; row: {row['status']} "
        f"attempts={row['attempts']}")
    assert row["status"] == "failed"
