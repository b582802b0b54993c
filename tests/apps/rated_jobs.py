"""App module for the rate limit test: a rate-limited handler that logs its start times."""

from __future__ import annotations

import os
import time

from drainer import Job, task

RATE = os.environ.get("RATED_LIMIT", "3/0.5s")


@task("rated", rate_limit=RATE)
def rated(job: Job) -> None:
    line = f"start {time.time():.6f} {os.getpid()} {job.id}\n"
    fd = os.open(os.environ["RATED_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one O_APPEND write a line: lines never interleave
    finally:
        os.close(fd)
    time.sleep(0.02)
