"""``run_schedule`` from Python: same run_once, stop event, no signal handlers installed."""

from __future__ import annotations

import signal
import threading
from typing import Any

import psycopg

from drainer import Job, enqueue_many
from drainer.drain import RunReport
from drainer.producer import JobSpec
from drainer.registry import Registry
from drainer.scheduler import WakeSchedule, run_schedule
from drainer.settings import Settings
from drainer.waking import IdleTimeout


def test_run_schedule_drains_and_stops_without_touching_signals(
        migrated: Settings, conn: psycopg.Connection[Any], registry: Registry) -> None:
    seen: list[int] = []

    @registry.task("mail")
    def handler(job: Job) -> None:
        seen.append(job.id)

    enqueue_many(conn, [JobSpec("mail", {"n": i}) for i in range(20)],
                 schema=migrated.schema_name)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    during: list[dict[int, Any]] = []
    reports: list[RunReport] = []
    stop = threading.Event()

    def on_report(report: RunReport) -> None:
        during.append({s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)})
        reports.append(report)
        if len(reports) == 2:
            stop.set()

    timer = threading.Timer(20, stop.set)  # a safety net, not the expected way out
    timer.start()
    try:
        runs = run_schedule(migrated, WakeSchedule(interval=1.0), stop=stop, registry=registry,
                            idle=IdleTimeout(0.5, "--idle-timeout"), on_report=on_report)
    finally:
        timer.cancel()
    assert runs == 2 and len(reports) == 2
    assert reports[0].succeeded == 20 and reports[1].claimed == 0
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 20
    assert during == [before, before]
    assert {s: signal.getsignal(s) for s in before} == before
