"""The awake benchmark's hard and long workloads (``--workload hard``, ``--workload long``).

One task on the queue ``bench``: a payload with ``fail`` fails its first attempt (the task's
retry policy brings it back ``BENCH_RETRY_WAIT`` seconds later, 5 by default); ``sleep``
makes the handler wait that many seconds without touching the database (the long
workload's 60 s handlers). With ``BENCH_CRON`` set, a recurring no-op definition on the
same schedule (the hard workload's). Every handler call appends its start time, end time
and attempt to ``$BENCH_ATTEMPT_LOG`` (one short ``os.write`` on an O_APPEND file): the
benchmark's wasted-resume count needs to know when handlers ran, which the table keeps
only for the last attempt.
"""

from __future__ import annotations

import os
import threading
import time

from drainer import Job, Retry, task

WAIT_S = float(os.environ.get("BENCH_RETRY_WAIT", "5"))
_LOG = os.environ.get("BENCH_ATTEMPT_LOG", "")
_fd_lock = threading.Lock()
_fd: int | None = None


def record(started: float, attempt: int) -> None:
    global _fd
    if not _LOG:
        return
    with _fd_lock:
        if _fd is None:
            _fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, f"{started:.6f} {time.time():.6f} {attempt}\n".encode())


@task("bench", retry=Retry(base=WAIT_S / 2, cap=WAIT_S))
def work(job: Job) -> None:
    started = time.time()
    try:
        if job.payload.get("sleep"):
            time.sleep(float(job.payload["sleep"]))
        if job.payload.get("fail") and job.attempt == 1:
            raise RuntimeError("failing the first attempt (bench hard workload)")
    finally:
        record(started, job.attempt)


if os.environ.get("BENCH_CRON"):
    @task("bench_cron", cron=os.environ["BENCH_CRON"])
    def occurrence(job: Job) -> None:
        record(time.time(), job.attempt)
