"""The end of a run: archive, vacuum when dead tuples pile up, and what is left due."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from drainer.maintenance import archiver, vacuum

if TYPE_CHECKING:
    from drainer.db.queries import Queries
    from drainer.drain.report import RunReport
    from drainer.drain.watchdog import Watchdog
    from drainer.settings import Settings


def finish(settings: Settings, q: Queries, report: RunReport, served: list[str],
           watchdog: Watchdog | None, fin: dict[str, Any] | None) -> None:
    """Archive, vacuum and count what is left (on queues with handlers, and on queues
    without). ``fin``: finish_run's result when it already went out (with the first Query
    of an empty run, or with the last completions)."""
    queues = report.queues
    timeout = maintenance_timeout(settings, watchdog)
    if settings.archive_mode == "delete":
        # archive, table health and what is left in one statement
        if fin is None:
            fin = q.finish_run(queues, settings.archive_after, settings.failed_retention,
                               settings.archive_batch_size, served=served)
        report.unserved_due = fin["unserved_due"]
        config = archiver.ArchiverConfig.from_settings(settings)
        report.archived = archiver.run_once_after(
            q, config, fin["archived_done"], fin["archived_failed"]).archived
        vac = vacuum.run_once(q, settings.vacuum_threshold, health=fin, timeout=timeout)
        report.remaining_due, next_due = int(fin["remaining_due"]), fin["next_due_at"]
    else:
        report.archived = archiver.run_once(
            q, archiver.ArchiverConfig.from_settings(settings)).archived
        vac = vacuum.run_once(q, settings.vacuum_threshold, timeout=timeout)
        report.remaining_due, next_due, report.unserved_due = \
            q.queue_summary_served(queues, served)
    report.vacuumed = vac.vacuumed
    report.n_dead_tup = vac.n_dead_tup
    report.last_autovacuum = iso(vac.last_autovacuum)
    report.next_due_at = iso(next_due)


def stopped(q: Queries, report: RunReport, queues: list[str], served: list[str]) -> None:
    """The end of a run a signal stopped: no maintenance, only what is left."""
    report.remaining_due, next_due, report.unserved_due = \
        q.queue_summary_served(queues, served)
    report.next_due_at = iso(next_due)


def maintenance_timeout(settings: Settings, watchdog: Watchdog | None) -> float | None:
    """The VACUUM's statement_timeout: --maintenance-timeout, within what the watchdog
    leaves; None (the session's own) when drainer does not own its session settings
    (--no-session-options: a transaction-mode pooler, see Queries._vacuum)."""
    if not settings.session_options:
        return None
    timeout = settings.maintenance_timeout or float("inf")
    if watchdog is not None:
        timeout = min(timeout, max(0.1, watchdog.time_left() - 0.5))
    return 0.0 if timeout == float("inf") else timeout


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
