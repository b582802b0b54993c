"""App module of the server-condition tests: a job that does nothing, one that naps."""

from __future__ import annotations

import time

from drainer import Job, task


@task("quick")
def quick(job: Job) -> None:
    pass


@task("nap")
def nap(job: Job) -> None:
    time.sleep(float(job.payload.get("s", 3)))
