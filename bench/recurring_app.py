"""The awake benchmark's recurring workload: a no-op job every minute, and nothing else."""

from __future__ import annotations

from drainer import Job, task


@task("bench", cron="* * * * *")
def every_minute(job: Job) -> None:
    pass
