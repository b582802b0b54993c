"""App module of the fleet's CLI tests: handlers that say which database ran them."""

from __future__ import annotations

import time
from typing import Any

from drainer import Job, task


@task("work", transaction=True)
def work(job: Job) -> dict[str, Any]:
    assert job.conn is not None
    row = job.conn.execute("SELECT current_database()").fetchone()
    assert row is not None
    return {"db": row[0]}


@task("slow")
def slow(job: Job) -> None:
    time.sleep(float(job.payload.get("s", 0.2)))
