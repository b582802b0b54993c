"""The parts of ``drainer demo`` (drainer/cli/run.py): sample handlers, jobs and a database."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from drainer.job import Job
from drainer.producer import JobSpec
from drainer.registry import Registry

if TYPE_CHECKING:
    from drainer.settings import Settings


def demo_registry() -> Registry:
    """Three sample queues: quick emails, an async webhook, reports that fail once."""
    reg = Registry()

    @reg.task("emails")
    def send_email(job: Job) -> None:
        time.sleep(0.001)

    @reg.task("webhooks", timeout=5)
    async def call_webhook(job: Job) -> None:
        await asyncio.sleep(0.002)

    @reg.task("reports", max_attempts=3)
    def render_report(job: Job) -> None:
        if job.payload.get("flaky") and job.attempt == 1:
            raise RuntimeError("renderer busy (the demo fails this job once: it is retried "
                               "after the backoff)")

    return reg


def demo_jobs(n: int) -> list[JobSpec]:
    """``n`` sample jobs on the three queues (the same ones every time)."""
    rnd = random.Random(7)
    specs = []
    for i in range(n):
        queue = rnd.choice(["emails", "emails", "webhooks", "reports"])
        payload = {"n": i, "flaky": queue == "reports" and i % 5 == 0}
        specs.append(JobSpec(queue, payload, priority=rnd.choice([0, 0, 1])))
    return specs


@contextmanager
def demo_database(settings: Settings) -> Iterator[tuple[str, bool]]:
    """(database URL, embedded?): the settings' database, else a throwaway embedded one."""
    if settings.database_url is not None:
        yield settings.dsn, False
        return
    from drainer._embedded import embedded_postgres

    with embedded_postgres() as url:
        yield url, True
