"""Recurring occurrences in real drains: served by run_once, counted in next_due_at, and what
the sync costs in statements."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from drainer import db, run_once
from drainer.job import Job
from drainer.recurring import DrainSync, SyncResult, define, sync
from drainer.registry import Registry
from drainer.settings import Settings
from tests.integration.test_run_cost import _round_trips, traced  # noqa: F401 - a fixture

UTC = timezone.utc


def _minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def test_a_drain_runs_the_due_occurrence_and_reports_the_next(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any]) -> None:
    seen: list[Job] = []
    registry.task("tick", cron="* * * * *")(seen.append)
    now = datetime.now(UTC)
    with psycopg.connect(migrated.dsn, autocommit=True) as c:
        # a drain two minutes ago created the occurrence of the minute after it: due now
        sync(db.Queries(c, migrated.schema_name, "jobs"), list(registry.schedules.values()),
             ["tick"], now - timedelta(minutes=2))
    report = run_once(migrated, registry=registry)
    after = datetime.now(UTC)
    # the occurrence created then (the minute after it) was missed: catch-up `latest` runs
    # one occurrence for the window, the latest minute
    assert report.succeeded == 1
    [job] = seen
    assert job.scheduled_for is not None
    assert _minute(now) <= job.scheduled_for <= _minute(after)
    assert job.payload == {"scheduled_for": job.scheduled_for.isoformat()}
    # the next occurrence exists, and the report's next_due_at is it
    assert report.next_due_at is not None
    assert datetime.fromisoformat(report.next_due_at) == job.scheduled_for + timedelta(minutes=1)
    again = run_once(migrated, registry=registry)
    assert again.claimed == 0 and again.next_due_at == report.next_due_at


def test_a_drain_with_definitions_sends_three_statements_whatever_their_number(
        migrated: Settings, registry: Registry, traced: list[tuple[Any, Path]]) -> None:  # noqa: F811
    registry.task("nightly", cron="0 3 * * *", timezone="Europe/Berlin")(lambda job: None)
    for i in range(50):
        registry.recurring("nightly", f"{i} 4 * * *", key=f"k{i}")
    first = run_once(migrated, registry=registry)
    assert first.claimed == 0 and first.next_due_at is not None
    _conn, path = traced[0]
    # run_start (schema check, reap, due queues), the sync of 51 definitions, finish_run,
    # one round trip each, whatever their number (without definitions an empty run sends
    # run_start and finish_run together: one round trip)
    assert _round_trips(path) == 3
    second = run_once(migrated, registry=registry)
    assert _round_trips(traced[1][1]) == 3 and second.next_due_at == first.next_due_at


def test_removing_a_definition_from_the_app_removes_its_future_row(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    old = Registry()
    old.task("a", cron="@hourly")(lambda job: None)
    old.recurring("a", "@daily", key="daily")
    run_once(migrated, registry=old)
    new = Registry()
    new.task("a", cron="@hourly")(lambda job: None)
    run_once(migrated, registry=new)
    keys = conn.execute(sql.SQL("SELECT recurring_key FROM {} WHERE status = 'queued'").format(
        sql.Identifier(migrated.schema_name, "jobs"))).fetchall()
    assert keys == [("a",)]


def test_removing_the_last_definition_removes_its_future_row_in_the_first_statement(
        migrated: Settings, conn: psycopg.Connection[Any],
        traced: list[tuple[Any, Path]]) -> None:  # noqa: F811
    old = Registry()
    old.task("a")(lambda job: None)
    old.recurring("a", "@daily", key="daily")
    other = Registry()  # another deployment's series, on a queue this app does not serve
    other.task("b", cron="@hourly")(lambda job: None)
    run_once(migrated, registry=old)
    run_once(migrated, registry=other)
    jobs = sql.Identifier(migrated.schema_name, "jobs")
    new = Registry()
    new.task("a")(lambda job: None)
    report = run_once(migrated, registry=new)
    # the future occurrence is gone; the other deployment's series is untouched
    rows = conn.execute(sql.SQL("SELECT recurring_key, queue FROM {} WHERE status = 'queued'")
                        .format(jobs)).fetchall()
    assert rows == [("b", "b")]
    assert report.claimed == 0 and report.next_due_at is None
    # no statement more than a run without definitions sends: one round trip
    assert _round_trips(traced[2][1]) == 1


def test_the_end_of_a_long_run_syncs_again_only_past_the_first_fire_time(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    clock = [datetime(2026, 12, 1, 9, 0, 30, tzinfo=UTC)]
    d = define("a", "* * * * *")
    q = db.Queries(conn, migrated.schema_name, "jobs")
    drain = DrainSync([d], ["a"], clock=lambda: clock[0])
    drain.start(q)
    assert drain.first_next == datetime(2026, 12, 1, 9, 1, tzinfo=UTC)
    clock[0] += timedelta(seconds=20)
    assert drain.finish(q) is None  # the run ended before 09:01: nothing to do
    clock[0] += timedelta(seconds=20)  # 09:01:10: the 09:01 occurrence may have run
    assert drain.finish(q) == SyncResult(inserted=1)
    times = [r[0] for r in conn.execute(sql.SQL(
        "SELECT scheduled_for FROM {} ORDER BY 1").format(
        sql.Identifier(migrated.schema_name, "jobs"))).fetchall()]
    assert times == [datetime(2026, 12, 1, 9, m, tzinfo=UTC) for m in (1, 2)]


def test_a_run_without_definitions_deletes_only_future_never_claimed_occurrences(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    """What the first statement unschedules: the future occurrences of the served queues
    never claimed; a due one is a job to run, a claimed one (fence > 0) is kept, as are a
    job that is no occurrence and another queue's series."""
    jobs = sql.Identifier(migrated.schema_name, "jobs")
    conn.execute(sql.SQL(
        "INSERT INTO {} (queue, recurring_key, scheduled_for, run_at, recurring_hash, fence) "
        "SELECT queue, key, now() + d * interval '1 day', now() + d * interval '1 day', "
        "hash, fence FROM (VALUES ('a', 'gone', 1, 'h', 0), ('a', 'claimed', 1, 'h', 1), "
        "('a', 'due', -1, 'h', 0), ('a', NULL, 1, NULL, 0), ('b', 'other', 1, 'h', 0)) "
        "AS v(queue, key, d, hash, fence)").format(jobs))
    registry = Registry()
    registry.task("a")(lambda job: None)
    report = run_once(migrated, registry=registry)
    assert report.succeeded == 1
    rows = conn.execute(sql.SQL("SELECT queue, recurring_key, status FROM {} ORDER BY 1, 2")
                        .format(jobs)).fetchall()
    assert rows == [("a", "claimed", "queued"), ("a", "due", "done"), ("a", None, "queued"),
                    ("b", "other", "queued")]
