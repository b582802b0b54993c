"""An app with recurring jobs for the CLI tests: a per-minute tick and a weekday digest.

Each run of a handler appends its occurrence to $RECURRING_LOG (when set), one line each.
"""

from __future__ import annotations

import os

import drainer
from drainer import Job, task


def _log(job: Job) -> None:
    path = os.environ.get("RECURRING_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{job.queue} {job.scheduled_for.isoformat() if job.scheduled_for else '-'}"
                    f" {os.getpid()}\n")


@task("tick", cron="* * * * *")
def tick(job: Job) -> None:
    _log(job)


@task("digest")
def digest(job: Job) -> None:
    _log(job)


drainer.recurring("digest", "0 8 * * mon-fri", key="weekday-digest", payload={"kind": "short"},
                  timezone="Europe/Berlin")
