"""The fleet benchmark's handler: each job waits BENCH_FLEET_JOB_MS milliseconds (10)."""

from __future__ import annotations

import os
import time

from drainer import Job, task

JOB_S = float(os.environ.get("BENCH_FLEET_JOB_MS", "10")) / 1000


@task("fleet_bench")
def wait(job: Job) -> None:
    time.sleep(JOB_S)
