"""App module for the rate limit test: a rate-limited handler that logs its start times."""

from __future__ import annotations

import os
import time

from drainer import Job, task

RATE = os.environ.get("RATED_LIMIT", "3/0.5s")
LEASE = 60.0


@task("rated", rate_limit=RATE, lease=LEASE)
def rated(job: Job) -> None:
    # the claim's instant on the database's clock: its lease ends LEASE after the rate
    # window's clock (job.deadline, no timeout set; a heartbeat extends it only later)
    assert job.deadline is not None
    claimed = job.deadline.timestamp() - LEASE
    line = f"start {time.time():.6f} {os.getpid()} {job.id} {claimed:.6f}\n"
    fd = os.open(os.environ["RATED_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one O_APPEND write a line: lines never interleave
    finally:
        os.close(fd)
    time.sleep(0.02)
