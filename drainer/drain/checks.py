"""What a run warns about its own settings: a handler time limit no run can give, a lease
shorter than a round trip to the database."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from drainer.drain.report import RunReport
    from drainer.registry import Registry
    from drainer.settings import Settings

logger = logging.getLogger("drainer.drain")


def timeouts_over_max_runtime(settings: Settings, registry: Registry, report: RunReport
                              ) -> None:
    """Queues whose handler time limit (the task's timeout, else --job-timeout) exceeds
    --max-runtime, in the report (``timeout_over_max_runtime``) and one warning line: a job
    that needs that long is cut by the end of every run, charged an attempt each time, and
    fails 'lease expired' without ever finishing."""
    if settings.max_runtime is None:
        return
    over: dict[str, float] = {}
    for name in report.queues:
        task = registry.tasks[name]
        limit = task.timeout if task.timeout is not None else settings.job_timeout
        if limit is not None and limit > settings.max_runtime:
            over[name] = float(limit)
    report.timeout_over_max_runtime = over
    if over:
        listed = ", ".join(f"{q!r} ({t:g}s)" for q, t in over.items())
        logger.warning("handler timeout longer than --max-runtime (%gs) on %s: a job that "
                       "runs that long never finishes within a run (each run charges it an "
                       "attempt until it fails 'lease expired'); raise --max-runtime or "
                       "lower the timeout", settings.max_runtime, listed,
                       extra={"run_id": report.run_id, "timeout_over_max_runtime": over})


def short_leases(settings: Settings, registry: Registry, report: RunReport,
                 round_trip: float) -> None:
    """One warning line when a served queue's lease is shorter than ``round_trip`` (the
    run's first statement, measured): its jobs' leases can expire before an outcome or a
    heartbeat reaches the database, and another drainer runs them again."""
    short = {}
    for name in report.queues:
        task = registry.tasks[name]
        lease = float(task.lease if task.lease is not None else settings.lease)
        if lease < round_trip:
            short[name] = lease
    if short:
        listed = ", ".join(f"{q!r} ({t:g}s)" for q, t in short.items())
        logger.warning("lease shorter than the round trip to the database (%.3fs measured) "
                       "on %s: a job's lease can expire before its outcome or heartbeat is "
                       "written, and another drainer runs it again; raise --lease",
                       round_trip, listed, extra={"run_id": report.run_id})
