"""Eight ``drainer run-once`` processes at once on 10,000 jobs, four threads each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings
from tests.conftest import finish
from tests.reliability._helpers import (
    executions,
    jobs,
    runs_per_job,
    start_drainer,
)

JOBS = 10_000
PROCESSES = 8


@pytest.mark.slow
def test_eight_run_once_processes_run_every_job_once(
    migrated: Settings, conn: psycopg.Connection[Any], pg_url: str, tmp_path: Path
) -> None:
    enqueue_many(conn, [JobSpec("rec", {"n": i}, max_attempts=1) for i in range(JOBS)],
                 schema=migrated.schema_name)
    procs = [start_drainer(["run-once", "--concurrency", "4", "--batch-size", "25"],
                           pg_url=pg_url, schema=migrated.schema_name, log_dir=tmp_path)
             for _ in range(PROCESSES)]
    results = [finish(p, timeout=120) for p in procs]  # all reaped before any assert
    reports = []
    for code, out, err in results:
        assert code == 0, err[-2000:]
        reports.append(json.loads(out))

    table = jobs(conn, migrated.schema_name)
    assert len(table) == JOBS
    assert {(r["status"], r["attempts"]) for r in table.values()} == {("done", 1)}
    runs = runs_per_job(tmp_path)
    assert set(runs) == set(table), "some job never ran"
    assert set(runs.values()) == {1}, "some job ran twice"
    assert len(executions(tmp_path, "end")) == JOBS
    assert sum(r["claimed"] for r in reports) == JOBS
    assert sum(r["succeeded"] for r in reports) == JOBS
    assert all(r["lost"] == 0 and r["released"] == 0 for r in reports)
    workers = {pid for _j, _a, pid in executions(tmp_path)}
    print(f"\n{PROCESSES} drainers: claimed per process "
          f"{sorted(r['claimed'] for r in reports)}; {len(workers)} processes ran jobs")
    assert len(workers) >= 2, "the drainers did not run at the same time"
