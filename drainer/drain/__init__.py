"""The drain cycle: connect, start, claim and run until nothing is due, finish, exit.

:func:`run_once` reads top to bottom: which queues (:func:`resolve_queues`) under which
limits (:mod:`.limits`), the first Query (:mod:`.start`: schema check, reap, due queues,
first claim, the end of an empty run), the loop's parts wired for one connection
(:func:`build`) and the loop over claims, handlers and outcomes (:mod:`.loop`), the end
(:mod:`.end`: archive, vacuum, what is left), the report (:mod:`.report`), and the hard
bound of --max-runtime (:mod:`.watchdog`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from drainer import db, otel, process
from drainer._signals import on_stop_signals
from drainer.app import load_app
from drainer.drain import checks, collector, end, start, transaction
from drainer.drain.calls import make_running
from drainer.drain.claims import Claims
from drainer.drain.end import maintenance_timeout
from drainer.drain.handlers import Handlers
from drainer.drain.leases import Heartbeat, heartbeat_interval
from drainer.drain.limits import (
    MAX_RUNTIME,
    Limits,
    SettingLimits,
    limited_tasks,
    record,
    setting_limits,
)
from drainer.drain.link import Reconnecting
from drainer.drain.loop import Drain
from drainer.drain.outcomes import Outcomes
from drainer.drain.report import RunReport
from drainer.drain.watchdog import Watchdog
from drainer.errors import ConfigError
from drainer.maintenance import reaper, vacuum
from drainer.migrate import check_version, latest_version
from drainer.recurring import DrainSync
from drainer.registry import Registry, default_registry

if TYPE_CHECKING:
    import psycopg

    from drainer.registry import Task
    from drainer.settings import Settings

__all__ = ["RunReport", "resolve_queues", "run_once"]

logger = logging.getLogger(__name__)


def run_once(
    settings: Settings,
    *,
    registry: Registry | None = None,
    stop: threading.Event | None = None,
    deadline: float | None = None,
    handle_signals: bool = False,
    progress: Callable[[RunReport], None] | None = None,
    run_id: str | None = None,
) -> RunReport:
    """Drain once: the cycle every entry point (CLI, scheduler, serve, serverless) uses.

    ``deadline`` is a ``time.monotonic()`` instant after which no more jobs are claimed
    (the earlier of it and ``settings.max_runtime`` wins). ``stop`` is an event that asks
    for a graceful shutdown, as SIGTERM does with ``handle_signals``. ``run_id``: the
    report's (and the claimed rows') run id, when the caller has already given one out
    (POST /drain answers it before the drain starts); else a new one.
    """
    registry = registry or default_registry
    started = time.monotonic()
    if settings.max_runtime is not None:
        limit = started + settings.max_runtime
        deadline = limit if deadline is None else min(deadline, limit)
    queues = resolve_queues(settings, registry)
    limits = setting_limits(settings, registry)
    run = _Run(settings, registry, RunReport(run_id or uuid.uuid4().hex[:12], queues),
               Limits(stop or threading.Event(), deadline, settings.max_jobs), progress)
    checks.timeouts_over_max_runtime(settings, registry, run.report)
    signals = on_stop_signals(run.on_signal) if handle_signals else contextlib.nullcontext()
    with signals:
        run.watch(hard_exit=handle_signals)
        try:
            _cycle(run, limits)
        except Exception as exc:
            run.ended_by(exc)
        finally:
            if run.watchdog is not None:
                run.watchdog.stop()
    run.report.duration_s = round(time.monotonic() - started, 6)
    logger.debug("drain finished", extra=run.report.as_dict())
    if settings.pushgateway_url:
        _push_metrics(settings, run.report)
    return run.report


def _cycle(run: _Run, limits: SettingLimits) -> None:
    """Connect, start, drain, finish, close."""
    settings, registry, report = run.settings, run.registry, run.report
    schedules = DrainSync(registry.schedules.values(), report.queues)
    # planned before the session opens (it is billed): the first Query's text included
    plan = start.plan(settings, registry, report.queues, latest_version(), limits,
                      report.run_id, alone=bool(schedules.definitions))
    tracing = otel.for_run(settings.otel)
    # what is alive now leaves the collector's generations before the session opens: a
    # full collection while it is open would walk every module of the process
    collector.freeze_startup()
    report.process_start_s = process.start_to_now_once()  # what came before the session
    q = Reconnecting(settings, db.connect(settings), report)
    run.conn = q.conn
    q.on_reconnect.append(run.reconnected)
    connected_at = time.monotonic()
    try:
        if run.limits.stopped_by(0) is not None:
            plan = plan.without_first()  # past the deadline while connecting: claim nothing
        sent = time.monotonic()
        found = start.send(q, plan)
        first_round_trip = time.monotonic() - sent
        checks.short_leases(settings, registry, report, first_round_trip)
        check_version(q, found.version, plan.latest)
        due = run.started(found)
        if schedules.definitions:
            # the definitions' next occurrences are rows before anything is claimed
            synced = schedules.start(q)
            if synced.superseded or synced.caught_up:  # catch-up runs, due now
                due = list(dict.fromkeys([*due, *schedules.queues_synced()]))
        tasks = limited_tasks(registry, report, limits, found.controls)
        if report.queues and due:
            drain = run.drain = build(settings, registry, q, report, run.limits,
                                      run.hurry, run.progress, tasks, tracing)
            drain.begin(due, plan, found.claimed, first_round_trip)
            with collector.fewer_collections():
                drain.run()
            run.fin = drain.fin
        elif report.queues:
            record(report, run.limits.stopped_by(report.claimed))  # as the loop would
        # an occurrence that came due during the run gets its successor before next_due_at
        # is read below (a statement only if the run lasted that long)
        schedules.finish(q)
        served = registry.queues()
        if run.limits.stop.is_set():
            end.stopped(q, report, run.queues, served)
        else:
            end.finish(settings, q, report, served, run.watchdog, run.fin)
        warn_unserved(report, served)
    finally:
        q.conn.close()
        report.connected_s = round(time.monotonic() - connected_at, 6)
        if tracing is not None:
            tracing.close()  # a drain-and-exit process: flush before it exits


class _Run:
    """One run's state that outlives a step of the cycle: its connection and loop (which
    the watchdog cuts and looks at from its own thread), and finish_run's result."""

    def __init__(self, settings: Settings, registry: Registry, report: RunReport,
                 limits: Limits, progress: Callable[[RunReport], None] | None) -> None:
        self.settings = settings
        self.registry = registry
        self.report = report
        self.queues = list(report.queues)  # as resolved, paused queues included
        self.limits = limits
        self.hurry = threading.Event()  # no more waiting for running handlers
        self.progress = progress
        self.conn: psycopg.Connection[Any] | None = None
        self.drain: Drain | None = None
        self.watchdog: Watchdog | None = None
        #: finish_run's result when it went out before the run's end (with the first
        #: Query of an empty run, or with the last completions): not sent again
        self.fin: dict[str, Any] | None = None

    def started(self, found: start.Start) -> list[str]:
        """Note what the first Query found; the due queues the run drains."""
        report = self.report
        report.reaped = reaper.counted(found.reaped).reaped
        self.fin = found.fin
        report.paused = [name for name in self.queues if name in found.paused]
        if not report.paused:
            return found.due
        logger.info("queues paused, not claimed: %s", ", ".join(report.paused),
                    extra={"run_id": report.run_id})
        report.queues = [name for name in self.queues if name not in found.paused]
        self.fin = None  # it counted the paused queues' jobs too: asked again at the end
        return [name for name in found.due if name not in found.paused]

    def reconnected(self, conn: psycopg.Connection[Any]) -> None:
        """The work connection was opened again (see :mod:`.link`): the watchdog's to cut."""
        self.conn = conn

    def watch(self, *, hard_exit: bool) -> None:
        """Start the --max-runtime watchdog (see :mod:`.watchdog`) when there is a deadline."""
        if self.limits.deadline is None:
            return
        self.watchdog = Watchdog(self.limits.deadline, self.settings.grace, self._connections,
                                 self._busy, self._cut, hard_exit=hard_exit)
        self.watchdog.start()

    def _connections(self) -> list[psycopg.Connection[Any] | None]:
        drain = self.drain
        beat = None if drain is None or drain.heartbeat is None else drain.heartbeat.conn
        return [self.conn, beat]

    def _busy(self) -> bool:
        drain = self.drain
        return drain is not None and drain.handlers.executing() > 0

    def _cut(self) -> None:
        self.hurry.set()
        drain = self.drain
        if drain is not None and drain.heartbeat is not None:
            drain.heartbeat.abandon()  # no reconnecting to a silent server, no waiting

    def ended_by(self, exc: Exception) -> None:
        """The cycle raised: re-raised, unless the watchdog cut the connections (what the
        run did is in the report)."""
        if self.watchdog is None or not self.watchdog.fired:
            clash = db.prepared_statement_clash(exc)
            if clash is not None:  # every entry point: exit 2, say what to set
                raise clash from None
            raise exc
        self.report.stopped_by = self.report.stopped_by or MAX_RUNTIME
        self.report.deadline_hit = True
        logger.warning("the run ended by the --max-runtime watchdog (%s); outcomes not "
                       "written are left to their lease", db.one_line(exc),
                       extra={"run_id": self.report.run_id})

    def on_signal(self, name: str) -> None:
        """SIGTERM/SIGINT: stop claiming; a second signal cuts the grace period short."""
        if self.limits.stop.is_set():
            logger.warning("received %s again: not waiting for running jobs (they are left "
                           "to their lease)", name)
            self.hurry.set()
            return
        logger.info("received %s: stopping (no new claims; claimed jobs that did not start "
                    "are released; running jobs get the grace period)", name)
        self.limits.stop.set()


def build(settings: Settings, registry: Registry, q: Reconnecting, report: RunReport,
          limits: Limits, hurry: threading.Event,
          progress: Callable[[RunReport], None] | None, tasks: dict[str, Task],
          tracing: otel.RunTracing | None = None) -> Drain:
    """The loop over ``report.queues``; ``tasks``: the served queues' tasks with the run's
    limits in force; ``tracing``: each handler call in a job span, ended with its outcome."""

    def lease(task: Task) -> float:
        return task.lease if task.lease is not None else settings.lease

    handlers = Handlers(settings.concurrency, settings.batch_size, settings.job_timeout,
                        may_start=lambda: not limits.must_release(),
                        context=None if tracing is None else tracing.job_span)
    handlers.result_max_bytes = settings.result_max_bytes
    pipelined = db.ClaimPipeline.supported() and settings.pipeline_depth >= 2
    outcomes = Outcomes(q, report, delete=settings.delete_on_complete,
                        retry_base=settings.retry_base, retry_cap=settings.retry_cap,
                        pipeline=db.ClaimPipeline(q) if pipelined else None)
    outcomes.before_send = q.ready
    if pipelined:  # the pipeline of a connection opened again
        q.on_reconnect.append(lambda _conn: setattr(outcomes, "pipeline", db.ClaimPipeline(q)))
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
                    room=handlers.free)
    drain = Drain(report, q, claims, handlers, outcomes, limits,
                  vacuum.BetweenBatches(q, settings.vacuum_every,
                                        maintenance_timeout(settings, None)),
                  batch_size=settings.batch_size, grace=settings.grace, hurry=hurry,
                  lease=lease, progress=progress, on_close=runner.close)
    drain.tail.linger = settings.retry_linger
    interval = heartbeat_interval([lease(registry.tasks[name]) for name in report.queues],
                                  settings.effective_idle_timeout)
    drain.heartbeat = Heartbeat(settings, report.run_id, interval, drain.leases,
                                handlers.lock, last_used=lambda: q.last_used)
    return drain


def resolve_queues(settings: Settings, registry: Registry) -> list[str]:
    """The queues this drain claims: those with handlers, or the --queue subset of them."""
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


def warn_unserved(report: RunReport, served: list[str]) -> None:
    """One warning line for due jobs that no handler of this app will ever claim."""
    if not report.unserved_due:
        return
    jobs = sum(report.unserved_due.values())
    listed = ", ".join(f"{q!r} ({n})" for q, n in report.unserved_due.items())
    logger.warning("%d due job(s) on queues no handler serves: %s; nothing drains them "
                   "(a misspelt queue name? handlers exist for: %s)", jobs, listed,
                   ", ".join(served),
                   extra={"run_id": report.run_id, "unserved_due": report.unserved_due})


def _push_metrics(settings: Settings, report: RunReport) -> None:
    try:
        from drainer import metrics

        metrics.push_report(settings, report)
    except Exception as exc:
        logger.warning("pushing metrics failed: %s", db.one_line(exc))
