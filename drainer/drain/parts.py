"""The drain loop's parts, wired for one run on one connection."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from drainer import db, otel
from drainer.drain import transaction
from drainer.drain.calls import make_running
from drainer.drain.claims import Claims
from drainer.drain.end import maintenance_timeout
from drainer.drain.handlers import Handlers
from drainer.drain.leases import Heartbeat, heartbeat_interval
from drainer.drain.loop import Drain
from drainer.drain.outcomes import Outcomes
from drainer.maintenance import vacuum

if TYPE_CHECKING:
    import psycopg

    from drainer.drain.limits import Limits
    from drainer.drain.report import RunReport
    from drainer.registry import Registry, Task
    from drainer.settings import Settings


def build(settings: Settings, registry: Registry, conn: psycopg.Connection[Any],
          q: db.Queries, report: RunReport, limits: Limits, hurry: threading.Event,
          progress: Callable[[RunReport], None] | None, tasks: dict[str, Task],
          tracing: otel.RunTracing | None = None) -> Drain:
    """The loop over ``report.queues``; ``tasks``: the served queues' tasks with the run's
    limits in force; ``tracing``: each handler call in a job span, ended with its outcome."""

    def lease(task: Task) -> float:
        return task.lease if task.lease is not None else settings.lease

    handlers = Handlers(settings.concurrency, settings.batch_size, settings.job_timeout,
                        may_start=lambda: not limits.must_release(),
                        context=None if tracing is None else otel.JobSpan)
    handlers.result_max_bytes = settings.result_max_bytes
    pipelined = db.ClaimPipeline.supported() and settings.pipeline_depth >= 2
    outcomes = Outcomes(q, report, delete=settings.delete_on_complete,
                        retry_base=settings.retry_base, retry_cap=settings.retry_cap,
                        pipeline=db.ClaimPipeline(q) if pipelined else None)
    outcomes.tasks = registry.tasks
    if tracing is not None:
        outcomes.tally.on_outcome = tracing.outcome
    runner = transaction.TransactionRunner(
        settings, q, outcomes, report,
        lambda t, row: make_running(t, row, lease(t), handlers.timeout(t)), lease,
        grace=settings.grace, stopping=limits.must_release, hurry=hurry,
        context=handlers.context)

    def free_slots() -> int:
        # the jobs of an in-step claim that start at once: one when sequential
        return 1 if settings.concurrency == 1 else \
            settings.concurrency - handlers.in_flight()

    claims = Claims(q, outcomes, report, tasks, batch_size=settings.batch_size,
                    max_jobs=settings.max_jobs,
                    depth=settings.pipeline_depth if pipelined else 1,
                    combine=not settings.delete_on_complete, lease=lease,
                    run_in_transaction=runner.run_batch, free_slots=free_slots,
                    room=handlers.free,
                    # a Sync is timed when no claim is in flight and no handler runs (the
                    # loop's step checks; concurrent fast handlers go idle when a claim
                    # takes longer than they do, which is when growing it pays)
                    probe=(lambda: db.sync_round_trip(conn.pgconn))
                    if db.ClaimPipeline.supported() else None)
    drain = Drain(report, q, claims, handlers, outcomes, limits,
                  vacuum.BetweenBatches(q, settings.vacuum_every,
                                        maintenance_timeout(settings, None)),
                  batch_size=settings.batch_size, grace=settings.grace, hurry=hurry,
                  lease=lease, progress=progress, on_close=runner.close)
    drain.tail.linger = settings.retry_linger
    interval = heartbeat_interval([lease(registry.tasks[name]) for name in report.queues])
    drain.heartbeat = Heartbeat(settings, report.run_id, interval, drain.leases,
                                handlers.lock)
    return drain
