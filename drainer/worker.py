"""``drainer worker``: always on; LISTEN for hints, drain with ``run_once``, poll as fallback.

Each wake (a notification for one of its queues, a fallback poll, a reconnect) runs one
:func:`drainer.drain.run_once`: the same claim, fenced outcomes, reaper and maintenance
as every other entry point, on a short-lived connection of its own. The LISTEN
connection is separate and only ever waits: a notification is a hint to look, never
the job, and a lost one is caught by the next poll.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from drainer import db
from drainer.errors import DatabaseUnavailable, SchemaError

if TYPE_CHECKING:
    from drainer.drain.report import RunReport
    from drainer.registry import Registry
    from drainer.settings import Settings

logger = logging.getLogger(__name__)

#: The channel ``drainer migrate --notify-trigger`` notifies (payload: the queue name).
CHANNEL = "drainer"
#: Longest single wait on the LISTEN socket, so a stop request is seen promptly.
WAIT_SLICE_S = 0.5
#: Longest pause between reconnect attempts after the database went away.
MAX_RECONNECT_DELAY_S = 30.0


@dataclass
class WorkerStats:
    """Totals over the worker's life, printed as one JSON object when it exits."""

    wakes: int = 0
    notified_wakes: int = 0
    poll_wakes: int = 0
    reconnects: int = 0
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    released: int = 0
    reaped: int = 0
    errors: int = 0
    started_at: str = field(
        default_factory=lambda: datetime.now(timezone.utc).isoformat())

    def add(self, report: RunReport) -> None:
        for name in ("claimed", "succeeded", "retried", "failed", "released", "reaped"):
            setattr(self, name, getattr(self, name) + getattr(report, name))


class Worker:
    """The wait loop; ``run()`` returns when ``stop`` is set."""

    def __init__(self, settings: Settings, queues: list[str], *, min_poll: float,
                 max_poll: float, stop: threading.Event | None = None,
                 registry: Registry | None = None) -> None:
        self.settings = settings
        self.queues = queues
        self.min_poll = min_poll
        self.max_poll = max_poll
        self.stop = stop or threading.Event()
        self.registry = registry
        self.stats = WorkerStats()
        self.listen: psycopg.Connection[Any] | None = None
        self.interval = min_poll

    # -- the LISTEN connection ---------------------------------------------------------------------
    def _connect_listen(self) -> bool:
        """Open the LISTEN connection (direct, never through a transaction pooler)."""
        try:
            conn = db.connect(self.settings, purpose="listen")
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
        except (DatabaseUnavailable, psycopg.Error) as exc:
            logger.warning("cannot LISTEN: %s", db.one_line(exc))
            return False
        self.listen = conn
        logger.info("listening on channel %r for queues %s", CHANNEL, ", ".join(self.queues))
        return True

    def _close_listen(self) -> None:
        if self.listen is not None:
            with contextlib.suppress(psycopg.Error):
                self.listen.close()
            self.listen = None

    def _wait(self, until: float) -> bool:
        """Wait for a notification for our queues until ``until``; True when one came.

        Raises psycopg.OperationalError when the LISTEN connection is lost.
        """
        assert self.listen is not None
        hinted = False
        while not self.stop.is_set():
            left = until - time.monotonic()
            if left <= 0:
                break
            for n in self.listen.notifies(timeout=min(left, WAIT_SLICE_S)):
                if n.payload in self.queues or not n.payload:
                    hinted = True
                    break  # later ones are covered by the drain this one starts
            if hinted:
                break
        return hinted

    # -- draining ----------------------------------------------------------------------------------
    def _drain(self, why: str) -> RunReport | None:
        from drainer.drain import run_once

        self.stats.wakes += 1
        try:
            report = run_once(self.settings, registry=self.registry, stop=self.stop)
        except SchemaError:
            raise
        except (DatabaseUnavailable, psycopg.Error) as exc:
            self.stats.errors += 1
            logger.warning("drain after %s failed: %s", why, db.one_line(exc))
            return None
        self.stats.add(report)
        if report.claimed:
            logger.info("woke on %s: %d claimed, %d succeeded, %d retried, %d failed", why,
                        report.claimed, report.succeeded, report.retried, report.failed,
                        extra={"run_id": report.run_id, "wake": why})
        else:
            logger.debug("woke on %s: nothing due", why, extra={"wake": why})
        return report

    def _next_poll(self, report: RunReport | None) -> float:
        """When to poll next: backoff while empty, sooner when a job comes due."""
        now = time.monotonic()
        if report is None:
            return now + self.interval
        if report.claimed:
            self.interval = self.min_poll  # work appeared: reset the backoff
        else:
            self.interval = min(self.interval * 2, self.max_poll)
        if report.deadline_hit and report.remaining_due and not self.stop.is_set():
            return now  # stopped by --max-runtime/--max-jobs with work left: go again
        at = now + self.interval
        if report.next_due_at:
            due = datetime.fromisoformat(report.next_due_at)
            in_s = (due - datetime.now(timezone.utc)).total_seconds()
            at = min(at, now + max(0.0, in_s))  # a retry or delayed job comes due first
        return at

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> WorkerStats:
        reconnect_delay = 0.5
        must_poll = True  # poll once at start: jobs may have come while nobody listened
        why = "start"
        next_poll = time.monotonic()
        try:
            while not self.stop.is_set():
                if self.listen is None:
                    if not self._connect_listen():
                        self.stop.wait(reconnect_delay)
                        reconnect_delay = min(reconnect_delay * 2, MAX_RECONNECT_DELAY_S)
                        continue
                    reconnect_delay = 0.5
                    if why != "start":
                        # a suspend or restart dropped every connection: whatever was
                        # notified meanwhile is lost, so look once at once
                        self.stats.reconnects += 1
                        must_poll, why = True, "reconnect"
                if must_poll or time.monotonic() >= next_poll:
                    if not must_poll:
                        why = "poll"
                    report = self._drain(why)
                    if why == "poll":
                        self.stats.poll_wakes += 1
                    elif why == "notify":
                        self.stats.notified_wakes += 1
                    next_poll = self._next_poll(report)
                    must_poll = False
                    continue
                try:
                    if self._wait(next_poll):
                        must_poll, why = True, "notify"
                except psycopg.Error as exc:
                    logger.warning("LISTEN connection lost (%s): reconnecting; polling once "
                                   "when back", db.one_line(exc))
                    self._close_listen()
                    why = "reconnect"
        finally:
            self._close_listen()
        return self.stats


def warn_at_start(settings: Settings, min_poll: float, max_poll: float) -> list[str]:
    """The start-up warnings: always-on, direct connection, poll shorter than idle timeout."""
    lines = [
        "drainer worker keeps the database compute awake while it runs: it holds a LISTEN "
        f"connection and polls at least once every {max_poll:g}s; use run-once/schedule/serve "
        "to let a serverless compute suspend",
        "drainer worker needs a direct connection: LISTEN does not work through a "
        "transaction-mode pooler (PgBouncer pool_mode=transaction, Supavisor :6543)",
    ]
    idle = settings.effective_idle_timeout
    if idle and max_poll < idle:
        lines.append(
            f"poll interval (at most {max_poll:g}s) is shorter than the compute's idle "
            f"timeout ({idle:g}s): the compute will never suspend while this worker runs")
    for line in lines:
        logger.warning(line)
    return lines
