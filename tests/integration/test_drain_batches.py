"""The drain loop's batch path: completions and the next claim share one statement."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from drainer import Job, enqueue_many, run_once
from drainer.db import Queries
from drainer.producer import JobSpec
from drainer.registry import Registry
from drainer.settings import Settings
from tests.conftest import make_settings


def _statuses(conn: psycopg.Connection[Any], schema: str) -> dict[str, int]:
    rows = conn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY status").format(
        sql.Identifier(schema, "jobs"))).fetchall()
    return {r[0]: r[1] for r in rows}


def test_several_queues_each_job_once(migrated: Settings, conn: psycopg.Connection[Any],
                                      registry: Registry) -> None:
    seen: list[tuple[str, int]] = []
    queues = [f"q{i}" for i in range(5)]
    for q in queues:
        registry.task(q)(lambda job: seen.append((job.queue, job.id)))
    # uneven queues: the rotation must move on when one runs dry
    specs = [JobSpec(q, {"i": i}) for n, q in enumerate(queues) for i in range(7 + 11 * n)]
    enqueue_many(conn, specs, schema=migrated.schema_name)
    report = run_once(migrated, registry=registry)
    assert report.claimed == report.succeeded == len(specs)
    assert len(seen) == len(set(seen)) == len(specs)
    assert _statuses(conn, migrated.schema_name) == {"done": len(specs)}
    assert report.lost == 0 and report.remaining_due == 0


def test_failures_and_successes_in_one_batch(migrated: Settings,
                                             conn: psycopg.Connection[Any],
                                             registry: Registry) -> None:
    @registry.task("mixed")
    def handler(job: Job) -> None:
        if job.payload["i"] % 3 == 0:
            raise ValueError("bad")

    enqueue_many(conn, [JobSpec("mixed", {"i": i}) for i in range(45)],
                 schema=migrated.schema_name)
    report = run_once(migrated, registry=registry)
    assert report.succeeded == 30 and report.retried == 15 and report.failed == 0
    assert _statuses(conn, migrated.schema_name) == {"done": 30, "queued": 15}
    assert report.remaining_due == 0 and report.next_due_at is not None


def test_max_jobs_stops_between_batches(pg_url: str, migrated: Settings,
                                        conn: psycopg.Connection[Any],
                                        registry: Registry) -> None:
    registry.task("n")(lambda job: None)
    enqueue_many(conn, [JobSpec("n", {}) for _ in range(100)], schema=migrated.schema_name)
    settings = make_settings(pg_url, migrated.schema_name, batch_size=10, max_jobs=25)
    report = run_once(settings, registry=registry)
    assert report.claimed == report.succeeded == 25
    assert report.remaining_due == 75 and report.stopped_by == "max_jobs"
    assert _statuses(conn, migrated.schema_name) == {"done": 25, "queued": 75}


def test_outcome_of_a_job_taken_away_is_not_written(pg_url: str, migrated: Settings,
                                                    conn: psycopg.Connection[Any],
                                                    registry: Registry) -> None:
    """A job whose row changed under it (reaped and claimed again) is counted lost, and the
    combined completion + claim leaves that row alone."""
    table = sql.Identifier(migrated.schema_name, "jobs")

    @registry.task("t")
    def handler(job: Job) -> None:
        if job.payload["i"] == 3:
            conn.execute(sql.SQL("UPDATE {} SET attempts = attempts + 1, fence = fence + 1 "
                                 "WHERE id = %s")
                         .format(table), [job.id])

    enqueue_many(conn, [JobSpec("t", {"i": i}) for i in range(25)],
                 schema=migrated.schema_name)
    report = run_once(migrated, registry=registry)
    assert report.claimed == 25 and report.succeeded == 24 and report.lost == 1
    assert _statuses(conn, migrated.schema_name) == {"done": 24, "running": 1}


def test_complete_many_and_claim_fences_and_claims(migrated: Settings,
                                                   conn: psycopg.Connection[Any]) -> None:
    enqueue_many(conn, [JobSpec("a", {"i": i}) for i in range(5)],
                 schema=migrated.schema_name)
    q = Queries(conn, migrated.schema_name, migrated.table)
    first = q.claim_batch("a", 2, 60)
    ids = [r.id for r in first]
    # the second job's attempt is stale: its completion must not be written
    written, claimed = q.complete_many_and_claim(
        ids, [first[0].attempts, first[1].attempts + 1], "a", 2, 60)
    assert written == {ids[0]}
    assert len(claimed) == 2 and not set(ids) & {r.id for r in claimed}
    assert all(r.attempts == 1 and r.queue == "a" for r in claimed)
    assert _statuses(conn, migrated.schema_name) == {"done": 1, "running": 3, "queued": 1}
