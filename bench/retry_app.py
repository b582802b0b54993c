"""The awake benchmark's retry workload (``--workload retry``): a job whose payload says
``fail`` fails its first attempt, and its task's retry policy makes the first wait
``BENCH_RETRY_WAIT`` seconds (default 5): least(cap, base x 2^1) with base = wait / 2."""

from __future__ import annotations

import os

from drainer import Job, Retry, task

WAIT_S = float(os.environ.get("BENCH_RETRY_WAIT", "5"))


@task("bench", retry=Retry(base=WAIT_S / 2, cap=WAIT_S))
def fail_once(job: Job) -> None:
    if job.payload.get("fail") and job.attempt == 1:
        raise RuntimeError("failing the first attempt (bench retry workload)")
