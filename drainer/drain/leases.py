"""The heartbeat: extends the leases of claimed jobs, on a second connection opened only
when a lease runs low.

With an idle timeout declared (--idle-timeout, --platform) the extensions are planned
against it: while a statement of this drain keeps the compute up, a lease with less than
two thirds left is extended then (it costs no resume); while the compute may be suspended,
only a lease with less than a third left is (the compute is woken for it, a third of the
lease before it would be lost: time for a cold start and the connect retries). A handler
that finishes before then never wakes the compute for its lease."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from drainer import db
from drainer.drain import link
from drainer.drain.calls import Running
from drainer.drain.report import job_extra
from drainer.job import Job

if TYPE_CHECKING:
    from drainer.settings import Settings

logger = logging.getLogger("drainer.drain")

#: A heartbeat extends leases every lease * HEARTBEAT_FRACTION seconds.
HEARTBEAT_FRACTION = 1 / 3


def running_low(jobs: list[Running], now: float, *, awake: bool = True) -> list[Running]:
    """The jobs whose lease has less than (1 - HEARTBEAT_FRACTION) of its length left, or
    when the compute may be suspended (not ``awake``), less than HEARTBEAT_FRACTION."""
    left = (1 - HEARTBEAT_FRACTION) if awake else HEARTBEAT_FRACTION
    return [r for r in jobs if not r.done and not r.lost
            and r.lease_expires - now < r.lease * left]


class Heartbeat(threading.Thread):
    """Every ``interval`` seconds, extends the leases running low among ``leases()`` (the
    jobs claimed and not finished: running, or waiting to start)."""

    def __init__(self, settings: Settings, run_id: str, interval: float,
                 leases: Callable[[], list[Running]], lock: threading.Lock,
                 last_used: Callable[[], float] | None = None) -> None:
        super().__init__(name="drainer-heartbeat", daemon=True)
        self.settings = settings
        self.run_id = run_id
        self.interval = interval
        self.leases = leases
        self.leases_lock = lock  # guards what leases() reads
        self.stopped = threading.Event()
        self.conn: psycopg.Connection[Any] | None = None
        self.queries: db.Queries | None = None
        self.lock = threading.Lock()
        self.abandoned = False
        self.idle_timeout = settings.effective_idle_timeout
        #: time.monotonic() when the work connection's last statement ended
        self.work_used = last_used
        self.used = 0.0  # when this connection's last statement ended

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.beat()
            except Exception as exc:  # keep beating: the next tick may reconnect
                # a pooler's prepared-statement clash gets the line that says what to set
                logger.warning("heartbeat failed: %s",
                               db.prepared_statement_clash(exc) or db.one_line(exc))
                self._close()
        if self.abandoned:
            self._close()  # stop() did not wait for this thread

    def beat(self, only: list[Running] | None = None, seconds: float | None = None
             ) -> set[int]:
        """Extend leases about to run low (or ``only`` those given); return ids still ours."""
        if only is None:
            now = time.monotonic()
            used = max(self.used, 0.0 if self.work_used is None else self.work_used())
            awake = link.awake_within(used, self.idle_timeout, now)
            with self.leases_lock:
                candidates = running_low(self.leases(), now, awake=awake)
        else:
            candidates = only
        if not candidates:
            return set()
        with self.lock:
            if self.stopped.is_set():
                return set()  # the drain is over: never open a connection after it
            leases = [seconds if seconds is not None else r.lease for r in candidates]
            ids, fences = [r.job.id for r in candidates], [r.job.fence for r in candidates]
            try:
                kept = self._open().extend_many(ids, fences, leases)
            except psycopg.OperationalError as exc:
                if self.conn is None or not self.conn.closed or db.timeout_kind(exc):
                    raise
                # cut while idle, the cut noticed by the statement: once more, connected again
                self.conn = None
                kept = self._open().extend_many(ids, fences, leases)
            self.used = time.monotonic()
        now = time.monotonic()
        for r, lease in zip(candidates, leases, strict=True):
            if r.job.id in kept:
                r.lease_expires = now + lease
                if r.timeout_at is None:
                    r.job.deadline = kept[r.job.id]
            else:
                r.lost = True
                r.job.cancelled.set()
                logger.warning("job %d is no longer ours (lease lost or cancelled): its "
                               "handler was told to stop and its outcome will not be "
                               "written", r.job.id, extra=job_extra(self.run_id, r.job))
        return set(kept)

    def _open(self) -> db.Queries:
        """The heartbeat's statements, connected (again, when the connection was cut while
        it was idle: a suspend between two beats)."""
        if self.conn is not None and link.cut(self.conn):
            self.conn.close()
            self.conn = None
        if self.conn is None:
            self.conn = db.connect(self.settings, purpose="heartbeat")
            self.queries = db.Queries(self.conn, self.settings.schema_name,
                                      self.settings.table)
        assert self.queries is not None
        return self.queries

    def extend_one(self, r: Running | None, job: Job, seconds: float | None) -> bool:
        """``job.extend()``: extend this one job's lease now."""
        if r is None or r.lost:
            return False
        return job.id in self.beat([r], seconds)

    def _close(self) -> None:
        with self.lock:
            if self.conn is not None:
                try:
                    self.conn.close()
                finally:
                    self.conn = None
                    self.queries = None

    def abandon(self) -> None:
        """Stop without waiting (the --max-runtime watchdog: the server is silent, a beat
        or a reconnect in progress may hang): no new beat, the thread closes its own."""
        self.abandoned = True
        self.stopped.set()

    def stop(self) -> None:
        if self.abandoned:
            return
        with self.lock:
            self.stopped.set()
        if self.is_alive():
            self.join(timeout=5)
        self._close()


def heartbeat_interval(leases: list[float], idle_timeout: float | None = None) -> float:
    """How often the heartbeat looks at leases: a fraction of the shortest; with an idle
    timeout, half the fraction (a lease is extended a third before it ends at the latest)
    and at most half the idle timeout (a look falls within each time the compute is up)."""
    if idle_timeout is None:
        return max(0.05, min(leases) * HEARTBEAT_FRACTION)
    return max(0.05, min(min(leases) * HEARTBEAT_FRACTION / 2, idle_timeout / 2))
