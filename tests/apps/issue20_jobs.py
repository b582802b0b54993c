"""App module of tests/reliability/test_issue20.py: rel_jobs' handlers and a few more.

Executions are recorded in ``$REL_LOG_DIR`` files as in rel_jobs (never in the database,
which some of these tests freeze or restart).
"""

from __future__ import annotations

import os

import rel_jobs  # noqa: F401  (registers rec, p_exit, ...)
from rel_jobs import _sleep, record

from drainer import Job, task


@task("i20_exit", max_attempts=2)
def i20_exit(job: Job) -> None:
    """Kills the process; the task allows 2 attempts (the row's default is 5)."""
    record(job, "start")
    os._exit(7)


@task("i20_tx_exit", transaction=True)
def i20_tx_exit(job: Job) -> None:
    """A transaction-mode task that kills the process."""
    record(job, "start")
    os._exit(7)


@task("i20_tx_slow", transaction=True, timeout=1)
def i20_tx_slow(job: Job) -> None:
    """A transaction-mode task with timeout=1 whose handler runs ``payload['sleep']`` s."""
    record(job, "start")
    _sleep(float(job.payload.get("sleep", 3)))
    record(job, "end")


@task("i20_verdict")
def i20_verdict(job: Job) -> None:
    """Sleeps ``payload['sleep']`` s, then fails when this process has I20_VERDICT=fail."""
    record(job, "start")
    _sleep(float(job.payload.get("sleep", 2)))
    record(job, "end")
    if os.environ.get("I20_VERDICT") == "fail":
        raise RuntimeError(f"new owner's verdict: attempt {job.attempt} failed")


@task("i20_mixed")
def i20_mixed(job: Job) -> None:
    """Good jobs and, with ``payload['exit']``, one that kills the process: one queue, so
    the good ones are claimed in the same batch as the poison one."""
    record(job, "start")
    if job.payload.get("exit"):
        os._exit(7)
    record(job, "end")


@task("i20_tx_long", transaction=True)
def i20_tx_long(job: Job) -> None:
    """A transaction-mode task without a timeout that runs ``payload['sleep']`` s."""
    record(job, "start")
    _sleep(float(job.payload.get("sleep", 10)))
    record(job, "end")
