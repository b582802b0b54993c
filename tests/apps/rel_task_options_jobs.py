"""App module of the reliability tests that need tasks with their own options: rel_jobs'
handlers, plus tasks that set max_attempts, transaction mode or a timeout, one whose verdict
the process's environment picks, and a queue where one poison job is claimed among good ones.

Executions are recorded in ``$REL_LOG_DIR`` files as in rel_jobs (never in the database,
which some of these tests freeze or restart).
"""

from __future__ import annotations

import os

import rel_jobs  # noqa: F401  (registers rec, p_exit, ...)
from rel_jobs import _sleep, record

from drainer import Job, task


@task("exit_max_attempts_2", max_attempts=2)
def exit_max_attempts_2(job: Job) -> None:
    """Kills the process; the task allows 2 attempts (the row's default is 5)."""
    record(job, "start")
    os._exit(7)


@task("tx_exit", transaction=True)
def tx_exit(job: Job) -> None:
    """A transaction-mode task that kills the process."""
    record(job, "start")
    os._exit(7)


@task("tx_timeout_1s", transaction=True, timeout=1)
def tx_timeout_1s(job: Job) -> None:
    """A transaction-mode task with timeout=1 whose handler runs ``payload['sleep']`` s."""
    record(job, "start")
    _sleep(float(job.payload.get("sleep", 3)))
    record(job, "end")


@task("tx_long", transaction=True)
def tx_long(job: Job) -> None:
    """A transaction-mode task without a timeout that runs ``payload['sleep']`` s."""
    record(job, "start")
    _sleep(float(job.payload.get("sleep", 10)))
    record(job, "end")


@task("env_verdict")
def env_verdict(job: Job) -> None:
    """Sleeps ``payload['sleep']`` s, then fails when this process has REL_VERDICT=fail."""
    record(job, "start")
    _sleep(float(job.payload.get("sleep", 2)))
    record(job, "end")
    if os.environ.get("REL_VERDICT") == "fail":
        raise RuntimeError(f"new owner's verdict: attempt {job.attempt} failed")


@task("poison_among_good")
def poison_among_good(job: Job) -> None:
    """Good jobs and, with ``payload['exit']``, one that kills the process: one queue, so
    the good ones are claimed in the same batch as the poison one."""
    record(job, "start")
    if job.payload.get("exit"):
        os._exit(7)
    record(job, "end")
