"""A ~200-job demo database for the dashboard's tests, made the way an application makes
one: the demo's jobs (drainer.demo) and a few more, enqueued with drainer's producer
(one inside an OpenTelemetry span), drained by run_once with real handlers (successes
with results, a handler that enqueues a follow-up, failures with tracebacks, a recurring
series), then a paused queue, an operator's limit, a cancelled job and a lease left to
expire by a run that died."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import psycopg

from drainer import ops
from drainer.demo import demo_jobs
from drainer.drain import run_once
from drainer.job import Job
from drainer.migrate import migrate
from drainer.producer import JobSpec, enqueue, enqueue_many
from drainer.registry import Registry

if TYPE_CHECKING:
    from drainer.settings import Settings

#: A payload that would run as script if a page pasted it unescaped.
HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"
#: The recurring series of the demo.
SERIES = "nightly-report"


@dataclass
class Demo:
    failed_id: int  # a failed job with a traceback
    hostile_id: int  # failed too: its payload and error hold HOSTILE
    fanout_id: int  # done, with a result and one follow-up
    traced_id: int  # enqueued inside a span: a trace id
    cancelled_id: int
    run_id: str  # the first drain's run
    jobs: int


def demo_registry() -> Registry:
    reg = Registry()

    @reg.task("emails")
    def send_email(job: Job) -> dict[str, Any]:
        return {"sent_to": f"user{job.payload.get('n', 0)}@example.com"}

    @reg.task("webhooks")
    async def call_webhook(job: Job) -> None:
        return None

    @reg.task("reports", max_attempts=1)
    def render_report(job: Job) -> None:
        if job.payload.get("flaky") or job.payload.get("hostile"):
            raise RuntimeError(f"renderer crashed on {job.payload.get('hostile') or 'page 3'}")

    @reg.task("fanout")
    def fan_out(job: Job) -> dict[str, int]:
        job.enqueue("emails", {"n": 9000 + job.id, "from": job.id})
        return {"followups": 1}

    @reg.task("nightly", cron="0 3 * * *", catch_up="all")
    def nightly(job: Job) -> dict[str, str]:
        return {"rendered": str(job.scheduled_for)}

    reg.recurring("nightly", "30 3 * * *", key=SERIES, catch_up="all")
    return reg


def build_demo(settings: Settings) -> Demo:
    from opentelemetry.sdk.trace import TracerProvider

    from drainer.db import Queries, connect
    from drainer.recurring import sync

    reg = demo_registry()
    schema, table = settings.schema_name, settings.table
    with connect(settings) as conn:
        migrate(conn, schema, table)
        enqueue_many(conn, [*demo_jobs(180), *(JobSpec("fanout", {"k": i}) for i in range(6)),
                            *(JobSpec("emails", {"n": i}, run_at=datetime.now(timezone.utc)
                                      + timedelta(hours=2)) for i in range(5))],
                     schema=schema, table=table)
        hostile = enqueue(conn, "reports", {"hostile": HOSTILE}, schema=schema, table=table)
        with TracerProvider().get_tracer("checkout").start_as_current_span("checkout"):
            traced = enqueue(conn, "emails", {"n": -1, "order": 4711}, schema=schema,
                             table=table)
        q = Queries(conn, schema, table)
        # the series as a drain two days ago left it: its missed nights run in the drain
        sync(q, reg.schedules.values(), list(reg.tasks),
             datetime.now(timezone.utc) - timedelta(days=2))
    assert hostile is not None and traced is not None
    report = run_once(settings, registry=reg)
    with psycopg.connect(settings.dsn, autocommit=True) as conn:
        ids = {name: conn.execute(psycopg.sql.SQL(query).format(
            psycopg.sql.Identifier(schema, table))).fetchone()[0]  # type: ignore[index]
            for name, query in {
                "failed": "SELECT min(id) FROM {} WHERE status = 'failed' AND queue = 'reports'"
                          " AND payload->>'flaky' = 'true'",
                "fanout": "SELECT min(id) FROM {} WHERE queue = 'fanout'",
                "queued": "SELECT max(id) FROM {} WHERE status = 'queued' AND queue = 'emails'",
                "count": "SELECT count(*) FROM {}"}.items()}
    cancelled = ids["queued"]
    ops.cancel_jobs(settings, [cancelled])
    ops.pause(settings, ["webhooks"])
    ops.limit(settings, ["reports"], max_running=2, rate="100/m")
    with connect(settings) as conn:
        more = enqueue_many(conn, [JobSpec("webhooks", {"n": i}) for i in range(8)],
                            schema=schema, table=table)
        # a run that claimed a job and died: its lease runs out, the next run's reaper
        # returns it
        Queries(conn, schema, table).claim_batch("webhooks", 1, 0.5, run_id="died-7f3a")
    time.sleep(0.6)
    return Demo(ids["failed"], hostile, ids["fanout"], traced, cancelled, report.run_id,
                int(ids["count"]) + more.enqueued)
