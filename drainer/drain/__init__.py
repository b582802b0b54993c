"""The drain cycle: connect, reap, claim and run until nothing is due, archive, vacuum, exit.

The parts: :mod:`.claims` (which queue, how many, in step / combined / ahead),
:mod:`.handlers` (calling handlers), :mod:`.outcomes` (fenced batched writes),
:mod:`.leases` (the heartbeat), :mod:`.limits` (stop, deadline, --max-jobs),
:mod:`.loop` (the state machine over them), :mod:`.report` (the run report);
maintenance (reaper, archiver, vacuum) is :mod:`drainer.maintenance`. Work done once at
the start of a run (the reaper today; a sync of recurring definitions would go next to it)
is a maintenance service's ``run_once()`` called from :func:`run_once` below.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from drainer import db
from drainer._signals import on_stop_signals
from drainer.drain import transaction
from drainer.drain.claims import Claims
from drainer.drain.handlers import MAX_ERROR_CHARS, Handlers, format_error, make_running
from drainer.drain.leases import Heartbeat
from drainer.drain.limits import Limits
from drainer.drain.loop import Drain, heartbeat_interval
from drainer.drain.outcomes import Outcomes
from drainer.drain.report import RunReport
from drainer.maintenance import archiver, reaper, vacuum
from drainer.migrate import check_schema
from drainer.registry import Registry, Task, default_registry, load_app

if TYPE_CHECKING:
    import psycopg

    from drainer.settings import Settings

__all__ = ["MAX_ERROR_CHARS", "RunReport", "format_error", "resolve_queues", "run_once"]

logger = logging.getLogger(__name__)


def run_once(
    settings: Settings,
    *,
    registry: Registry | None = None,
    stop: threading.Event | None = None,
    deadline: float | None = None,
    handle_signals: bool = False,
    progress: Callable[[RunReport], None] | None = None,
) -> RunReport:
    """Drain once: the cycle every entry point (CLI, scheduler, serve, serverless) uses.

    ``deadline`` is a ``time.monotonic()`` instant after which no more jobs are claimed
    (the earlier of it and ``settings.max_runtime`` wins). ``stop`` is an event that asks
    for a graceful shutdown, as SIGTERM does with ``handle_signals``.
    """
    registry = registry or default_registry
    started = time.monotonic()
    stop = stop or threading.Event()
    queues = resolve_queues(settings, registry)
    if settings.max_runtime is not None:
        limit = started + settings.max_runtime
        deadline = limit if deadline is None else min(deadline, limit)
    report = RunReport(run_id=uuid.uuid4().hex[:12], queues=queues)
    hurry = threading.Event()
    signals = on_stop_signals(_stop_on_signal(stop, hurry)) if handle_signals \
        else contextlib.nullcontext()
    with signals:
        conn = db.connect(settings)
        connected_at = time.monotonic()
        try:
            q = db.Queries(conn, settings.schema_name, settings.table)
            # the schema check and the run's one lookup of paused queues, one statement
            version, paused = q.schema_version_and_paused()
            check_schema(q, known=(version,))
            logger.debug("drain started", extra={"run_id": report.run_id, "queues": queues})
            report.reaped = reaper.run_once(
                q, queues, [registry.tasks[name].max_attempts for name in queues]).reaped
            limits = Limits(stop, deadline, settings.max_jobs)
            report.paused = [name for name in queues if name in paused]
            if report.paused:
                logger.info("queues paused, not claimed: %s", ", ".join(report.paused),
                            extra={"run_id": report.run_id})
                report.queues = [name for name in queues if name not in paused]
            if report.queues:  # the queues drained (paused ones left out, also below)
                _build(settings, registry, conn, q, report, limits, hurry, progress).run()
            if not stop.is_set():
                _maintain(settings, q, report)
            else:
                report.remaining_due, next_due = q.queue_summary(queues)
                report.next_due_at = _iso(next_due)
        finally:
            conn.close()
            report.connected_s = round(time.monotonic() - connected_at, 6)
    report.duration_s = round(time.monotonic() - started, 6)
    logger.debug("drain finished", extra=report.as_dict())
    if settings.pushgateway_url:
        _push_metrics(settings, report)
    return report


def _build(settings: Settings, registry: Registry, conn: psycopg.Connection[Any],
           q: db.Queries, report: RunReport, limits: Limits, hurry: threading.Event,
           progress: Callable[[RunReport], None] | None) -> Drain:
    """The drain loop's parts, wired for one connection."""

    def lease(task: Task) -> float:
        return task.lease if task.lease is not None else settings.lease

    handlers = Handlers(settings.concurrency, settings.batch_size, settings.job_timeout,
                        may_start=lambda: not limits.must_release())
    handlers.result_max_bytes = settings.result_max_bytes
    outcomes = Outcomes(q, report, delete=settings.delete_on_complete,
                        retry_base=settings.retry_base, retry_cap=settings.retry_cap)
    outcomes.tasks = registry.tasks

    runner = transaction.TransactionRunner(
        settings, q, outcomes, report,
        lambda t, row: make_running(t, row, lease(t), handlers.timeout(t)), lease,
        grace=settings.grace, stopping=limits.must_release, hurry=hurry)

    def free_slots() -> int:
        # the jobs of an in-step claim that start at once: one when sequential
        return 1 if settings.concurrency == 1 else \
            settings.concurrency - handlers.in_flight()

    pipelined = db.ClaimPipeline.supported() and settings.pipeline_depth >= 2
    claims = Claims(q, db.ClaimPipeline(q) if pipelined else None, outcomes, report,
                    registry.tasks, batch_size=settings.batch_size,
                    max_jobs=settings.max_jobs, depth=settings.pipeline_depth,
                    combine=not settings.delete_on_complete, lease=lease,
                    run_in_transaction=runner.run_batch, free_slots=free_slots)
    drain = Drain(report, q, claims, handlers, outcomes, limits,
                  vacuum.BetweenBatches(q, settings.vacuum_every),
                  batch_size=settings.batch_size, grace=settings.grace, hurry=hurry,
                  lease=lease, progress=progress, on_close=runner.close)
    drain.retry_linger = settings.retry_linger
    interval = heartbeat_interval([lease(registry.tasks[name]) for name in report.queues])
    drain.heartbeat = Heartbeat(settings, report.run_id, interval, drain.leases,
                                handlers.lock)
    return drain


def _maintain(settings: Settings, q: db.Queries, report: RunReport) -> None:
    """After the drain: archive, vacuum, and what is left due."""
    queues = report.queues
    if settings.archive_mode == "delete":
        # archive, table health and what is left in one statement
        fin = q.finish_run(queues, settings.archive_after, settings.failed_retention,
                           settings.archive_batch_size)
        config = archiver.ArchiverConfig.from_settings(settings)
        report.archived = archiver.run_once_after(
            q, config, fin["archived_done"], fin["archived_failed"]).archived
        vac = vacuum.run_once(q, settings.vacuum_threshold, health=fin)
        report.remaining_due, next_due = int(fin["remaining_due"]), fin["next_due_at"]
    else:
        report.archived = archiver.run_once(
            q, archiver.ArchiverConfig.from_settings(settings)).archived
        vac = vacuum.run_once(q, settings.vacuum_threshold)
        report.remaining_due, next_due = q.queue_summary(queues)
    report.vacuumed = vac.vacuumed
    report.n_dead_tup = vac.n_dead_tup
    report.last_autovacuum = _iso(vac.last_autovacuum)
    report.next_due_at = _iso(next_due)


def resolve_queues(settings: Settings, registry: Registry) -> list[str]:
    """The queues this drain claims: those with handlers, or the --queue subset of them."""
    from drainer.errors import ConfigError

    if settings.app:
        load_app(settings.app)
    known = registry.queues()
    if not known:
        raise ConfigError(
            "no handlers registered: name the module with your @task functions in "
            "DRAINER_APP or --app"
        )
    if not settings.queues:
        return known
    missing = [q for q in settings.queues if q not in registry.tasks]
    if missing:
        raise ConfigError(
            f"no handler for queue {', '.join(map(repr, missing))} (handlers exist for: "
            f"{', '.join(known)})"
        )
    return list(dict.fromkeys(settings.queues))


def _stop_on_signal(stop: threading.Event, hurry: threading.Event) -> Callable[[str], None]:
    """SIGTERM/SIGINT: stop claiming; a second signal cuts the grace period short."""

    def handler(name: str) -> None:
        if stop.is_set():
            logger.warning("received %s again: not waiting for running jobs (they are left "
                           "to their lease)", name)
            hurry.set()
            return
        logger.info("received %s: stopping (no new claims; claimed jobs that did not start "
                    "are released; running jobs get the grace period)", name)
        stop.set()

    return handler


def _push_metrics(settings: Settings, report: RunReport) -> None:
    try:
        from drainer import metrics

        metrics.push_report(settings, report)
    except Exception as exc:
        logger.warning("pushing metrics failed: %s", db._one_line(exc))


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
