"""App module of the suspend tests: handlers that record every execution in a file.

``sleepy`` sleeps ``payload['sleep']`` seconds without touching the database (what a
handler calling an API does); ``late_retry`` fails or snoozes its first attempt so that
its next run comes due ``payload['after']`` seconds later. Executions are recorded as in
rel_jobs (``$REL_LOG_DIR``), apart from the drainer's connection, which these tests cut.
"""

from __future__ import annotations

import os

from rel_jobs import _sleep, record

from drainer import Job, Retry, Snooze, task

#: late_retry's failing first attempts come back after this many seconds (the retry
#: policy's cap; the base is larger, so the cap is the wait of the first retry)
RETRY_AFTER_S = float(os.environ.get("SUSPEND_RETRY_AFTER_S", "1"))


@task("sleepy")
def sleepy(job: Job) -> None:
    record(job, "start")
    _sleep(float(job.payload.get("sleep", 0)))
    record(job, "end")


@task("late_retry", retry=Retry(base=10 * RETRY_AFTER_S, cap=RETRY_AFTER_S))
def late_retry(job: Job) -> None:
    """First run: ``payload['fail']`` fails (retried RETRY_AFTER_S later), else it snoozes
    ``payload['after']`` seconds; the next run succeeds."""
    record(job, "start")
    first = job.fence == 1  # the job's first claim (a snooze gives its attempt back)
    if first and job.payload.get("fail"):
        raise RuntimeError("failing the first attempt")
    if first:
        raise Snooze(float(job.payload.get("after", RETRY_AFTER_S)))
    record(job, "end")
