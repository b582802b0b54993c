"""App module for the max_running test: handlers that log their start and end times."""

from __future__ import annotations

import os
import time

from drainer import Job, task


def _log(event: str, job: Job) -> None:
    line = f"{event} {time.time():.6f} {os.getpid()} {job.id}\n"
    fd = os.open(os.environ["CAPPED_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one O_APPEND write a line: lines never interleave
    finally:
        os.close(fd)


@task("capped", max_running=3)
def capped(job: Job) -> None:
    _log("start", job)
    time.sleep(float(job.payload.get("sleep", 0.1)))
    _log("end", job)
