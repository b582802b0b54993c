"""``drainer demo``: the whole flow on a throwaway database, for a first look."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

from psycopg import sql
from pydantic import SecretStr

from drainer.registry import Job, Registry
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


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


@contextmanager
def _database(settings: Settings) -> Iterator[tuple[str, bool]]:
    if settings.database_url is not None:
        yield settings.dsn, False
        return
    from drainer._embedded import embedded_postgres

    _say("demo: no DRAINER_DATABASE_URL set, starting a throwaway embedded PostgreSQL ...")
    with embedded_postgres() as url:
        yield url, True


def demo_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.db import connect
    from drainer.drain import run_once
    from drainer.migrate import migrate
    from drainer.producer import JobSpec, enqueue_many
    from drainer.status import collect_status, render_status

    with _database(settings) as (url, embedded):
        schema = settings.schema_name if embedded else f"drainer_demo_{uuid.uuid4().hex[:8]}"
        run_settings = settings.model_copy(update={
            "database_url": SecretStr(url),
            "schema_name": schema,
            # a short backoff so the demo can show retries succeeding (default 10 s)
            "retry_base": min(settings.retry_base, 1.0),
        })
        try:
            with connect(run_settings) as conn:
                result = migrate(conn, schema, run_settings.table)
                _say(f"demo: migrated {schema}.{run_settings.table} to version "
                     f"{result.to_version}")
                rnd = random.Random(7)
                specs = []
                for i in range(args.jobs):
                    queue = rnd.choice(["emails", "emails", "webhooks", "reports"])
                    payload = {"n": i, "flaky": queue == "reports" and i % 5 == 0}
                    specs.append(JobSpec(queue, payload, priority=rnd.choice([0, 0, 1])))
                enq = enqueue_many(conn, specs, schema=schema, table=run_settings.table)
                _say(f"demo: enqueued {enq.enqueued} jobs on emails, webhooks and reports")
            _say(render_status(collect_status(run_settings)))
            _say("\ndemo: draining (run-once) ...")
            report = run_once(run_settings, registry=demo_registry())
            sys.stdout.write(json.dumps(report.as_dict(), default=str) + "\n")
            sys.stdout.flush()
            _say(f"demo: {report.succeeded} succeeded, {report.retried} wait for a retry "
                 f"(backoff {run_settings.retry_base:g}s * 2^attempts), {report.failed} "
                 f"failed, in {report.duration_s:.2f}s with one connection, now closed.")
            if report.next_due_at:
                wait = (datetime.fromisoformat(report.next_due_at)
                        - datetime.now(timezone.utc)).total_seconds()
                _say(f"\ndemo: no connection open; waking again in {max(wait, 0):.1f}s "
                     "when the retries are due ...")
                time.sleep(max(wait, 0) + 0.1)
                report = run_once(run_settings, registry=demo_registry())
                sys.stdout.write(json.dumps(report.as_dict(), default=str) + "\n")
                sys.stdout.flush()
                _say(f"demo: second drain: {report.succeeded} succeeded, {report.failed} "
                     "failed.")
            _say("")
            _say(render_status(collect_status(run_settings)))
        finally:
            if not embedded and not args.keep:
                with connect(run_settings) as conn:
                    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                        sql.Identifier(schema)))
    return 0

