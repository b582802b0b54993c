"""The drain cycle: connect, reap, claim and run until nothing is due, archive, vacuum, exit.

The parts: :mod:`.claims` (which queue, how many, in step / combined / ahead),
:mod:`.handlers` (calling handlers), :mod:`.outcomes` (fenced batched writes),
:mod:`.leases` (the heartbeat), :mod:`.limits` (stop, deadline, --max-jobs),
:mod:`.loop` (the state machine over them), :mod:`.report` (the run report);
maintenance (reaper, archiver, vacuum) is :mod:`drainer.maintenance`. Work done once at
the start of a run: the schema check, the reaper and which queues have due jobs in one
statement (``run_start``), then, when the app has recurring definitions on the served
queues, their sync (:class:`drainer.recurring.DrainSync`, ``recurring_sync``).
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

from drainer import db, otel, pipeline, queue_limits
from drainer._signals import on_stop_signals
from drainer.app import load_app
from drainer.drain import collector, transaction
from drainer.drain import handlers as handler_calls
from drainer.drain.claims import Claims, combinable, first_claim_size
from drainer.drain.handlers import MAX_ERROR_CHARS, Handlers, format_error, make_running
from drainer.drain.leases import Heartbeat
from drainer.drain.limits import MAX_RUNTIME, Limits, record
from drainer.drain.loop import Drain, heartbeat_interval
from drainer.drain.outcomes import Outcomes
from drainer.drain.report import RunReport
from drainer.drain.watchdog import Watchdog
from drainer.maintenance import archiver, reaper, vacuum
from drainer.migrate import check_version, latest_version
from drainer.recurring import DrainSync
from drainer.registry import Registry, Task, default_registry

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
    stop = stop or threading.Event()
    queues = resolve_queues(settings, registry)
    set_max_running, set_rates = _setting_limits(settings, registry)
    if settings.max_runtime is not None:
        limit = started + settings.max_runtime
        deadline = limit if deadline is None else min(deadline, limit)
    report = RunReport(run_id=run_id or uuid.uuid4().hex[:12], queues=queues)
    tracing = otel.for_run(settings.otel)
    hurry = threading.Event()
    signals = on_stop_signals(_stop_on_signal(stop, hurry)) if handle_signals \
        else contextlib.nullcontext()
    parts: dict[str, Any] = {}  # the run's connection and drain, for the watchdog
    watchdog = None if deadline is None else _watchdog(settings, deadline, parts, hurry,
                                                       hard_exit=handle_signals)
    with signals:
        try:
            latest = latest_version()  # read before the session is open (it is billed)
            schedules = DrainSync(registry.schedules.values(), queues)
            # the end of an empty run goes out behind run_start (one round trip for both);
            # not with recurring definitions, whose sync comes between the two
            finish = None if schedules.definitions else _finish_args(settings, registry)
            max_attempts = [registry.tasks[name].max_attempts for name in queues]
            # the run's first claim goes behind run_start too (when it may: see _first)
            first, first_size = _first(settings, registry, queues, set_max_running,
                                       set_rates, report.run_id, finish)
            start = None if finish is None else db.run_start_text(
                settings.schema_name, settings.table, queues, latest, max_attempts, finish,
                first)
            # what is alive now leaves the collector's generations before the session opens:
            # a full collection while it is open would walk every module of the process
            collector.freeze_startup()
            conn = parts["conn"] = db.connect(settings)
            connected_at = time.monotonic()
            try:
                q = db.Queries(conn, settings.schema_name, settings.table)
                limits = Limits(stop, deadline, settings.max_jobs)
                if first is not None and limits.stopped_by(0) is not None:
                    # past the deadline (or stopped) while connecting: nothing is claimed
                    assert finish is not None
                    first = None
                    start = db.run_start_text(settings.schema_name, settings.table, queues,
                                              latest, max_attempts, finish)
                # schema check, reap, which queues have due jobs and which are paused (the
                # run's one lookup of them), and the end of the run if nothing is due: one
                # round trip
                version, reaped, due, paused, controls, fin, claimed = \
                    q.run_start_claim_and_finish(queues, latest, max_attempts, finish,
                                                 first, text=start)
                check_version(q, version, latest)
                logger.debug("drain started", extra={"run_id": report.run_id,
                                                     "queues": queues})
                report.reaped = reaper.counted(reaped).reaped
                report.paused = [name for name in queues if name in paused]
                if report.paused:
                    logger.info("queues paused, not claimed: %s", ", ".join(report.paused),
                                extra={"run_id": report.run_id})
                    report.queues = [name for name in queues if name not in paused]
                    due = [name for name in due if name not in paused]
                    fin = None  # it read the paused queues' jobs too: again at the end
                # the recurring definitions of the served queues (a statement only when the
                # app has some): their next occurrences are rows before anything is claimed
                if schedules.definitions:
                    synced = schedules.start(q)
                    if synced.superseded or synced.caught_up:  # catch-up runs, due now
                        due = list(dict.fromkeys([*due, *schedules.queues_synced()]))
                tasks = _limited_tasks(registry, report, set_max_running, set_rates, controls)
                # the queues drained (paused ones left out) that have due jobs: with none,
                # the loop would claim nothing, so it is not built (nor its heartbeat thread)
                if report.queues and due:
                    fin = None  # (it did nothing: run_start found jobs to claim)
                    drain = parts["drain"] = _build(settings, registry, conn, q, report,
                                                    limits, hurry, progress, tasks)
                    drain.claims.known_due(due)
                    if finish is not None:  # the completions may go with the run's end
                        drain.finish = {**finish, "queues": report.queues}
                    if claimed:  # claimed with run_start: the loop's first claim
                        drain.take_first(drain.claims.claimed_first(claimed, first_size))
                    if tracing is not None:
                        # every handler call of the process from now on runs in a job span
                        handler_calls.job_context = otel.JobSpan
                        drain.outcomes.on_outcome = tracing.outcome
                    with collector.fewer_collections():
                        drain.run()
                elif report.queues:
                    record(report, limits.stopped_by(report.claimed))  # as its first step does
                # an occurrence that came due during the run gets its successor before the
                # summary below reads next_due_at (a statement only if the run lasted that long)
                schedules.finish(q)
                served = registry.queues()
                if not stop.is_set():
                    if fin is None and "drain" in parts:  # it went with the completions
                        fin = parts["drain"].fin
                    _maintain(settings, q, report, served, watchdog, fin)
                else:
                    report.remaining_due, next_due, report.unserved_due = \
                        q.queue_summary_served(queues, served)
                    report.next_due_at = _iso(next_due)
                _warn_unserved(report, served)
            finally:
                conn.close()
                report.connected_s = round(time.monotonic() - connected_at, 6)
                if tracing is not None:
                    tracing.close()  # a drain-and-exit process: flush before it exits
        except Exception as exc:
            if watchdog is None or not watchdog.fired:
                clash = db.prepared_statement_clash(exc)
                if clash is not None:  # every entry point: exit 2, say what to set
                    raise clash from None
                raise
            # the watchdog cut the connections: what the run did is in the report
            report.stopped_by = report.stopped_by or MAX_RUNTIME
            report.deadline_hit = True
            logger.warning("the run ended by the --max-runtime watchdog (%s); outcomes not "
                           "written are left to their lease", db._one_line(exc),
                           extra={"run_id": report.run_id})
        finally:
            if watchdog is not None:
                watchdog.stop()
    report.duration_s = round(time.monotonic() - started, 6)
    logger.debug("drain finished", extra=report.as_dict())
    if settings.pushgateway_url:
        _push_metrics(settings, report)
    return report


def _watchdog(settings: Settings, deadline: float, parts: dict[str, Any],
              hurry: threading.Event, *, hard_exit: bool) -> Watchdog:
    """The run's --max-runtime watchdog (see :mod:`.watchdog`), started."""

    def connections() -> list[psycopg.Connection[Any] | None]:
        drain: Drain | None = parts.get("drain")
        beat = None if drain is None or drain.heartbeat is None else drain.heartbeat.conn
        return [parts.get("conn"), beat]

    def busy() -> bool:
        drain: Drain | None = parts.get("drain")
        return drain is not None and _executing(drain.handlers) > 0

    def on_cut() -> None:
        hurry.set()  # no more waiting for handlers
        drain: Drain | None = parts.get("drain")
        if drain is not None and drain.heartbeat is not None:
            drain.heartbeat.abandon()  # no reconnecting to a silent server, no waiting

    watchdog = Watchdog(deadline, settings.grace, connections, busy, on_cut,
                        hard_exit=hard_exit)
    watchdog.start()
    return watchdog


def _executing(handlers: Handlers) -> int:
    """Handlers executing now (read from another thread: an estimate): in flight, minus
    the outcomes not collected yet and the jobs queued to threads but not started. A drain
    blocked on a silent database collects nothing: its finished handlers do not count."""
    try:
        pool, loop = handlers.pool, handlers.loop
        queued = (0 if pool is None else len(pool.work)) + \
            (0 if loop is None else len(loop.waiting))
        return max(0, handlers.in_flight() - handlers.uncollected - queued)
    except AttributeError:  # the handlers changed shape: count them all (the grace applies)
        return handlers.in_flight()


def _maintenance_timeout(settings: Settings, watchdog: Watchdog | None) -> float | None:
    """The VACUUM's statement_timeout: --maintenance-timeout, within what the watchdog
    leaves; None (the session's own) when drainer does not own its session settings
    (--no-session-options: a transaction-mode pooler, see vacuum.budget)."""
    if not settings.session_options:
        return None
    timeout = settings.maintenance_timeout or float("inf")
    if watchdog is not None:
        timeout = min(timeout, max(0.1, watchdog.time_left() - 0.5))
    return 0.0 if timeout == float("inf") else timeout


def _build(settings: Settings, registry: Registry, conn: psycopg.Connection[Any],
           q: db.Queries, report: RunReport, limits: Limits, hurry: threading.Event,
           progress: Callable[[RunReport], None] | None,
           tasks: dict[str, Task] | None = None) -> Drain:
    """The drain loop's parts, wired for one connection; ``tasks``: the served queues' tasks
    with the run's limits in force (default: the registry's)."""

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
                    tasks or registry.tasks, batch_size=settings.batch_size,
                    max_jobs=settings.max_jobs, depth=settings.pipeline_depth,
                    combine=not settings.delete_on_complete, lease=lease,
                    run_in_transaction=runner.run_batch, free_slots=free_slots,
                    room=handlers.free,
                    # a Sync is timed when no claim is in flight and no handler runs (the
                    # loop's step checks; concurrent fast handlers go idle when a claim
                    # takes longer than they do, which is when growing it pays)
                    probe=(lambda: pipeline.sync_round_trip(conn.pgconn))
                    if db.ClaimPipeline.supported() else None)
    drain = Drain(report, q, claims, handlers, outcomes, limits,
                  vacuum.BetweenBatches(q, settings.vacuum_every,
                                        _maintenance_timeout(settings, None)),
                  batch_size=settings.batch_size, grace=settings.grace, hurry=hurry,
                  lease=lease, progress=progress, on_close=runner.close)
    drain.retry_linger = settings.retry_linger
    interval = heartbeat_interval([lease(registry.tasks[name]) for name in report.queues])
    drain.heartbeat = Heartbeat(settings, report.run_id, interval, drain.leases,
                                handlers.lock)
    return drain


def _first(settings: Settings, registry: Registry, queues: list[str],
           max_running: dict[str, int], rates: dict[str, queue_limits.Rate], run_id: str,
           finish: dict[str, Any] | None) -> tuple[dict[str, Any] | None, int]:
    """claim_first's parameters (see :func:`drainer.db.first_claim_params`) and its size,
    for the run's first claim sent behind run_start; None when it is not sent: no
    finish_run behind run_start (recurring definitions, archive mode move: the statements
    in between), --max-jobs 0, or no queue whose claim can go so. A queue claimed in
    transaction mode, or under a max_running or a rate limit (the task's, the setting's;
    an operator's is read by the statement) is not claimed so: when it is the first due
    queue, the statement claims nothing and the loop claims as before."""
    size = first_claim_size(settings.batch_size, settings.concurrency, settings.max_jobs)
    if finish is None or size <= 0:
        return None, 0
    tasks = [registry.tasks[name] for name in queues]
    eligible = [combinable(t) and t.queue not in max_running and t.queue not in rates
                for t in tasks]
    if not any(eligible):
        return None, 0
    leases = [t.lease if t.lease is not None else settings.lease for t in tasks]
    return db.first_claim_params(queues, eligible, leases, size, settings.concurrency,
                                 run_id), size


def _finish_args(settings: Settings, registry: Registry) -> dict[str, Any] | None:
    """finish_run's arguments for the end of a run (archive-mode delete; None: the archive
    mode has statements of its own)."""
    if settings.archive_mode != "delete":
        return None
    return {"archive_after": settings.archive_after,
            "failed_retention": settings.failed_retention,
            "batch_size": settings.archive_batch_size, "served": registry.queues()}


def _maintain(settings: Settings, q: db.Queries, report: RunReport,
              served: list[str], watchdog: Watchdog | None = None,
              fin: dict[str, Any] | None = None) -> None:
    """After the drain: archive, vacuum, and what is left due (on queues with handlers, and
    on queues without). ``fin``: finish_run's result when it went out with run_start (an
    empty run)."""
    queues = report.queues
    if settings.archive_mode == "delete":
        # archive, table health and what is left in one statement
        if fin is None:
            fin = q.finish_run(queues, settings.archive_after, settings.failed_retention,
                               settings.archive_batch_size, served=served)
        report.unserved_due = fin["unserved_due"]
        config = archiver.ArchiverConfig.from_settings(settings)
        report.archived = archiver.run_once_after(
            q, config, fin["archived_done"], fin["archived_failed"]).archived
        vac = vacuum.run_once(q, settings.vacuum_threshold, health=fin,
                              timeout=_maintenance_timeout(settings, watchdog))
        report.remaining_due, next_due = int(fin["remaining_due"]), fin["next_due_at"]
    else:
        report.archived = archiver.run_once(
            q, archiver.ArchiverConfig.from_settings(settings)).archived
        vac = vacuum.run_once(q, settings.vacuum_threshold,
                              timeout=_maintenance_timeout(settings, watchdog))
        report.remaining_due, next_due, report.unserved_due = \
            q.queue_summary_served(queues, served)
    report.vacuumed = vac.vacuumed
    report.n_dead_tup = vac.n_dead_tup
    report.last_autovacuum = _iso(vac.last_autovacuum)
    report.next_due_at = _iso(next_due)


def _setting_limits(settings: Settings, registry: Registry
                    ) -> tuple[dict[str, int], dict[str, queue_limits.Rate]]:
    """--max-running / --rate-limit by queue; a queue without a handler (a misspelling) or
    in transaction mode is a ConfigError, before anything connects."""
    max_running, rates = queue_limits.setting_limits(settings.max_running, settings.rate_limit)
    transactional = [name for name, t in registry.tasks.items() if t.transaction]
    queue_limits.check_setting_queues(max_running, registry.tasks, transactional,
                                      "--max-running / DRAINER_MAX_RUNNING")
    queue_limits.check_setting_queues(rates, registry.tasks, transactional,
                                      "--rate-limit / DRAINER_RATE_LIMIT")
    return max_running, rates


def _limited_tasks(registry: Registry, report: RunReport, max_running: dict[str, int],
                   rates: dict[str, queue_limits.Rate],
                   controls: dict[str, queue_limits.Control]) -> dict[str, Task]:
    """The drained queues' tasks with the limits in force for this run (the operator's,
    then the setting's, then the task's; see :mod:`drainer.queue_limits`), noted in the
    report. An operator's limit on a transaction-mode queue cannot apply: a warning."""
    tasks = dict(registry.tasks)
    for name in report.queues:
        task = tasks[name]
        control = controls.get(name)
        if control is None and task.max_running is None and task.rate_limit is None \
                and name not in max_running and name not in rates:
            continue  # no limit from anyone: the task as it is (most queues; 300 add up)
        if task.transaction:
            if control is not None:
                logger.warning("queue %s: `drainer limit` does not apply to transaction=True "
                               "tasks; ignored", name, extra={"run_id": report.run_id})
            continue
        resolved = queue_limits.resolve(task.max_running, task.rate_limit,
                                        max_running.get(name), rates.get(name), control)
        tasks[name] = queue_limits.with_limits(task, resolved)
        if resolved.max_running is not None or resolved.rate is not None:
            report.limits[name] = resolved.as_dict()
    return tasks


def _warn_unserved(report: RunReport, served: list[str]) -> None:
    """One warning line for due jobs that no handler of this app will ever claim."""
    if not report.unserved_due:
        return
    jobs = sum(report.unserved_due.values())
    listed = ", ".join(f"{q!r} ({n})" for q, n in report.unserved_due.items())
    logger.warning("%d due job(s) on queues no handler serves: %s; nothing drains them "
                   "(a misspelt queue name? handlers exist for: %s)", jobs, listed,
                   ", ".join(served),
                   extra={"run_id": report.run_id, "unserved_due": report.unserved_due})


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
