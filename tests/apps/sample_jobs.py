"""App module used by acceptance tests: handlers that record what they did in the database."""

from __future__ import annotations

import os
import time

import psycopg
from psycopg import sql

from drainer import Job, task

_URL = os.environ.get("DRAINER_DATABASE_URL", "")
_SCHEMA = os.environ.get("DRAINER_SCHEMA", "drainer")


def _record(job: Job, note: str = "") -> None:
    with psycopg.connect(_URL, autocommit=True) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {} (job_id, attempt, pid, note) VALUES (%s, %s, %s, %s)")
            .format(sql.Identifier(_SCHEMA, "executions")),
            (job.id, job.attempt, os.getpid(), note),
        )


@task("noop")
def noop(job: Job) -> None:
    pass


@task("record")
def record(job: Job) -> None:
    _record(job)


@task("sleepy")
def sleepy(job: Job) -> None:
    _record(job, "start")
    deadline = time.monotonic() + float(job.payload.get("sleep", 5))
    while time.monotonic() < deadline:
        time.sleep(0.05)
    _record(job, "end")


@task("boom")
def boom(job: Job) -> None:
    raise ValueError(f"boom {job.payload}")


@task("nap")
def nap(job: Job) -> None:
    """Sleep payload["sleep"] seconds (no database access)."""
    time.sleep(float(job.payload.get("sleep", 0.2)))
