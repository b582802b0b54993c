"""Due jobs on queues no handler serves: reported by run-once, warned about by enqueue."""

from __future__ import annotations

import json
import logging
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer import db, enqueue, run_once
from drainer.registry import Registry
from drainer.settings import Settings
from tests.conftest import make_settings, run_cli


def test_run_once_reports_due_jobs_on_queues_without_handlers(
        migrated: Settings, conn: psycopg.Connection[Any], registry: Registry,
        caplog: pytest.LogCaptureFixture) -> None:
    registry.task("email")(lambda job: None)
    names = {"schema": migrated.schema_name, "table": migrated.table}
    enqueue(conn, "email", {}, **names)
    for _ in range(3):
        enqueue(conn, "emial", {}, **names)
    enqueue(conn, "zz", {}, **names)
    # not due yet, or not queued: not reported
    enqueue(conn, "later", {}, run_at=conn.execute("SELECT now() + interval '1h'")
            .fetchone()[0], **names)  # type: ignore[index]
    conn.execute(sql.SQL("INSERT INTO {} (queue, status, finished_at) "
                         "VALUES ('gone', 'done', now())")
                 .format(sql.Identifier(migrated.schema_name, "jobs")))
    with caplog.at_level(logging.WARNING, logger="drainer"):
        report = run_once(migrated, registry=registry)
    assert report.succeeded == 1 and report.remaining_due == 0
    assert report.unserved_due == {"emial": 3, "zz": 1}
    assert report.as_dict()["unserved_due"] == {"emial": 3, "zz": 1}
    warnings = [r for r in caplog.records if "no handler serves" in r.getMessage()]
    assert len(warnings) == 1
    assert "'emial' (3)" in warnings[0].getMessage()


def test_a_queue_subset_does_not_count_queues_that_have_handlers(
        migrated: Settings, pg_url: str, conn: psycopg.Connection[Any],
        registry: Registry, caplog: pytest.LogCaptureFixture) -> None:
    registry.task("a")(lambda job: None)
    registry.task("b")(lambda job: None)
    names = {"schema": migrated.schema_name, "table": migrated.table}
    enqueue(conn, "b", {}, **names)
    settings = make_settings(pg_url, migrated.schema_name, queues=["a"])
    with caplog.at_level(logging.WARNING, logger="drainer"):
        report = run_once(settings, registry=registry)
    assert report.unserved_due == {} and report.remaining_due == 0
    assert not [r for r in caplog.records if "no handler serves" in r.getMessage()]


@pytest.mark.parametrize("archive_mode", ["move", "delete"])
def test_both_end_of_run_statements_report_it(
        migrated: Settings, pg_url: str, conn: psycopg.Connection[Any],
        registry: Registry, archive_mode: str) -> None:
    registry.task("a")(lambda job: None)
    enqueue(conn, "b", {}, schema=migrated.schema_name, table=migrated.table)
    settings = make_settings(pg_url, migrated.schema_name, archive_mode=archive_mode)
    assert run_once(settings, registry=registry).unserved_due == {"b": 1}


def test_queue_summary_without_served_reads_nothing_more(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    enqueue(conn, "b", {}, schema=migrated.schema_name, table=migrated.table)
    q = db.Queries(conn, migrated.schema_name, migrated.table)
    assert q.queue_summary(["a"]) == (0, None)
    assert q.queue_summary_served(["a"], None) == (0, None, {})
    assert q.queue_summary_served(["a"], ["a"]) == (0, None, {"b": 1})


def test_enqueue_warns_about_a_queue_never_seen(pg_url: str, migrated: Settings) -> None:
    schema = migrated.schema_name
    first = run_cli(["enqueue", "emial", "{}"], pg_url=pg_url, schema=schema)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["enqueued"] == 1
    assert "queue 'emial' has never been seen" in first.stderr
    # now it has been seen (queued), and later with every job done: no warning
    again = run_cli(["enqueue", "emial", "{}"], pg_url=pg_url, schema=schema)
    assert again.returncode == 0 and "never been seen" not in again.stderr
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(sql.SQL("UPDATE {} SET status = 'done', finished_at = now()")
                  .format(sql.Identifier(schema, "jobs")))
    done = run_cli(["enqueue", "emial"], pg_url=pg_url, schema=schema, input="{}\n")
    assert done.returncode == 0 and "never been seen" not in done.stderr


def test_enqueue_with_app_refuses_a_queue_without_handler(pg_url: str,
                                                          migrated: Settings) -> None:
    schema = migrated.schema_name
    bad = run_cli(["enqueue", "emial", "{}", "--app", "sample_jobs"], pg_url=pg_url,
                  schema=schema)
    assert bad.returncode == 2, bad.stderr
    assert "no handler for queue 'emial' in sample_jobs" in bad.stderr
    with psycopg.connect(pg_url, autocommit=True) as c:
        n = c.execute(sql.SQL("SELECT count(*) FROM {}")
                      .format(sql.Identifier(schema, "jobs"))).fetchone()
    assert n == (0,)
    # a queue with a handler in the app: enqueued, no warning although never seen
    ok = run_cli(["enqueue", "noop", "{}"], pg_url=pg_url, schema=schema,
                 DRAINER_APP="sample_jobs")
    assert ok.returncode == 0, ok.stderr
    assert "never been seen" not in ok.stderr
