"""App module for the logs and progress tests: a slow handler and a failing one."""

from __future__ import annotations

import time

from drainer import Job, task


@task("slowish")
def slowish(job: Job) -> None:
    time.sleep(float(job.payload.get("sleep", 0.1)))


@task("fails")
def fails(job: Job) -> None:
    raise ValueError(f"cannot handle {job.payload}")


@task("fails_twice", max_attempts=2)
def fails_twice(job: Job) -> None:
    """Always fails; the task allows 2 attempts (the row's column defaults to 5)."""
    raise ValueError("still broken")
