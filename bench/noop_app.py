"""Handlers for the benchmarks: one no-op job handler on the queue ``bench``."""

from __future__ import annotations

from drainer import Job, task


@task("bench")
def noop(job: Job) -> None:
    pass
