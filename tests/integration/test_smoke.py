"""A first end-to-end check: migrate, enqueue, drain."""

from __future__ import annotations

from typing import Any

import psycopg

from drainer import Job, enqueue_many, run_once
from drainer.producer import JobSpec
from drainer.registry import Registry
from drainer.settings import Settings


def test_drain_runs_every_job_once(migrated: Settings, conn: psycopg.Connection[Any],
                                   registry: Registry) -> None:
    seen: list[int] = []

    @registry.task("emails")
    def handler(job: Job) -> None:
        seen.append(job.id)

    enqueue_many(conn, [JobSpec("emails", {"n": i}) for i in range(500)],
                 schema=migrated.schema_name)
    report = run_once(migrated, registry=registry)
    assert report.claimed == 500
    assert report.succeeded == 500
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 500
    assert report.remaining_due == 0
