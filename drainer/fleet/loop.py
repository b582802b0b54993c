"""``drainer schedule --fleet``: the known-work policy across the fleet, in one process.

A look reads the control table (:func:`~drainer.fleet.status.fleet_next_wake`, one
statement, never a tenant): when a tenant is due, or was never drained, the loop runs a
fleet run (:func:`~drainer.fleet.run.run_fleet`: those tenants only); otherwise it
sleeps until the earliest known due time, looking again every ``look`` seconds at most
(a producer's ``due`` shows up there), and at once when :meth:`FleetLoop.wake` is called
(``POST /drain?tenant=NAME`` on ``--listen``). No tenant is connected to between runs.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from drainer.errors import DrainerError

if TYPE_CHECKING:
    from collections.abc import Callable

    from drainer.fleet.run import FleetReport, TenantLogs
    from drainer.fleet.status import FleetWake
    from drainer.registry import Registry
    from drainer.settings import Settings

logger = logging.getLogger("drainer.fleet")

#: Seconds between two looks at the control table when nothing is due sooner: how late a
#: producer's ``due`` (without a trigger) is seen.
DEFAULT_LOOK_S = 10.0


class FleetLoop:
    """Look, run when a tenant is due, sleep until the next known due time; repeat."""

    def __init__(self, settings: Settings, *, stop: threading.Event, look: float,
                 registry: Registry | None = None,
                 on_report: Callable[[FleetReport], None] | None = None,
                 logs: TenantLogs | None = None) -> None:
        self.settings = settings
        self.stop = stop
        self.look = look
        self.registry = registry
        self.on_report = on_report
        self.logs = logs
        self.woken = threading.Event()
        self.lock = threading.Lock()  # one fleet run of this process at a time
        self.runs = 0
        self.looks = 0
        self._conn: Any = None

    def wake(self) -> None:
        """Look again now (a tenant was marked due)."""
        self.woken.set()

    def run(self) -> int:
        """Until ``stop``: the fleet runs started."""
        try:
            while not self.stop.is_set():
                self.woken.clear()
                wake = self._next_wake()
                if wake is not None and wake.at is not None and wake.at <= _now():
                    logger.info("fleet wake: %s", wake.reason,
                                extra={"wake": True, "reason": wake.reason})
                    report = self._run_logged()
                    if report is not None and (report.lines or report.left):
                        continue  # look again at once: what the run left, new marks
                    # nothing this process could take (another run holds the due tenants,
                    # or the run failed): the next look after the usual pause
                    delay = self.look
                else:
                    delay = self._delay(wake)
                if wake is not None and wake.at is None:
                    logger.debug("no known work on any tenant: next look in %.1f s", delay)
                self._sleep(delay)
        finally:
            self._close()
        return self.runs

    def triggered(self, coalescer_stop: threading.Event) -> dict[str, Any]:
        """A fleet run asked for through POST /drain?tenant=NAME (the mark is written): it
        waits for this loop's run in progress, never overlaps it."""
        with self.lock:
            if self.stop.is_set() or coalescer_stop.is_set():
                raise DrainerError("shutting down: the fleet run did not start")
            logger.info("fleet wake: trigger (POST /drain?tenant=...)",
                        extra={"wake": True, "reason": "trigger"})
            from drainer.serve import requested_run_id

            return self._run(requested_run_id()).as_dict()

    def _run_logged(self) -> FleetReport | None:
        with self.lock:
            try:
                return self._run()
            except DrainerError as exc:
                logger.error("fleet run failed: %s (next look in %.1f s)", exc, self.look)
            except Exception as exc:
                logger.error("fleet run failed: %s: %s (next look in %.1f s)",
                             type(exc).__name__, " ".join(str(exc).split()), self.look,
                             exc_info=exc)
        return None

    def _run(self, run_id: str | None = None) -> FleetReport:
        from drainer.fleet.run import run_fleet

        self.runs += 1
        report = run_fleet(self.settings, registry=self.registry, stop=self.stop,
                           run_id=run_id, logs=self.logs)
        if self.on_report is not None:
            self.on_report(report)
        return report

    def _next_wake(self) -> FleetWake | None:
        """The control table's next wake (one statement on a connection kept between
        looks); None when the control database could not be read (logged)."""
        import psycopg

        from drainer.fleet.control import Control, connect_control
        from drainer.fleet.status import fleet_next_wake
        from drainer.fleet.tenants import listed_names

        self.looks += 1
        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect_control(self.settings)
            conn = self._conn
            control = Control(conn, self.settings.schema_name)
            names = listed_names(self.settings, conn)
            return fleet_next_wake(control, names, self.settings.fleet_max_sleep)
        except (DrainerError, psycopg.Error) as exc:
            logger.error("cannot read the control table: %s (next look in %.1f s)",
                         " ".join(str(exc).split()), self.look)
            self._close()
            return None

    def _delay(self, wake: FleetWake | None) -> float:
        if wake is None or wake.at is None:
            return self.look
        return max(0.0, min(self.look, (wake.at - _now()).total_seconds()))

    def _sleep(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while not self.stop.is_set() and not self.woken.is_set():
            left = until - time.monotonic()
            if left <= 0:
                return
            self.woken.wait(min(left, 0.5))

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a broken connection
                logger.debug("closing the control connection failed", exc_info=True)


def _now() -> datetime:
    return datetime.now(timezone.utc)
