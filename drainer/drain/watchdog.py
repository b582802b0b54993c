"""The ``--max-runtime`` watchdog: a hard bound on a run, even when the database goes silent.

The deadline stops claiming; a statement waiting on a frozen server (a partition, a compute
frozen mid-statement: the kernel still acknowledges, so TCP keepalives see nothing) would
still hold the run. Past the deadline the watchdog cuts the run's connections (a socket
``shutdown``: the blocked statement fails at once with a connection error), and
:func:`drainer.drain.run_once` returns the report it has (``stopped_by`` max_runtime).
When the process owns itself (``drainer run-once``) and even that does not end the run, it
exits with :data:`~drainer.errors.EXIT_WATCHDOG` and one line on stderr.

When: ``WATCHDOG_MARGIN_S`` after the deadline or after the last handler seen running past
it, whichever is later, and at the latest ``deadline + grace + WATCHDOG_MARGIN_S`` (the grace
period is for running handlers, not for statements); the exit ``WATCHDOG_EXIT_AFTER_S``
after the cut. Jobs whose outcome was not written keep their lease and come back through
the reaper: nothing is lost, at most run again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from drainer.errors import EXIT_WATCHDOG

logger = logging.getLogger("drainer.drain")

#: Past the deadline (and the grace period, while handlers run), the seconds a run still has
#: to end by itself: its last statements (release, outcomes, what is left) and maintenance.
WATCHDOG_MARGIN_S = 2.0
#: After the cut, the seconds before ``drainer run-once`` exits without a report.
WATCHDOG_EXIT_AFTER_S = 3.0
#: How often the watchdog looks.
WATCHDOG_TICK_S = 0.1


def cut(conn: psycopg.Connection[Any] | None) -> bool:
    """Shut the connection's socket down (both ways): whoever waits on it wakes with an
    error at once. The file descriptor stays libpq's (closed by ``conn.close()``)."""
    if conn is None or conn.closed:
        return False
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return False
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    with s, contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    return True


class Watchdog(threading.Thread):
    """Watches one run: see the module docstring. ``connections()`` lists the run's
    connections now (work, heartbeat); ``busy()`` is whether handlers are running."""

    def __init__(self, deadline: float, grace: float,
                 connections: Callable[[], list[psycopg.Connection[Any] | None]],
                 busy: Callable[[], bool], on_cut: Callable[[], None], *,
                 hard_exit: bool, command: str = "run-once") -> None:
        super().__init__(name="drainer-watchdog", daemon=True)
        self.deadline = deadline
        self.grace = grace
        self.connections = connections
        self.busy = busy
        self.on_cut = on_cut
        self.hard_exit = hard_exit
        self.command = command
        self.done = threading.Event()
        self.cut_at: float | None = None  # when the connections were cut
        self.busy_at = float("-inf")  # when a handler was last seen running

    def cut_by(self) -> float:
        """The instant the watchdog cuts the connections, as things stand now."""
        since = min(self.deadline + self.grace, max(self.deadline, self.busy_at))
        return since + WATCHDOG_MARGIN_S

    def time_left(self, now: float | None = None) -> float:
        """Seconds until the cut as things stand (for a maintenance statement's budget)."""
        return self.cut_by() - (time.monotonic() if now is None else now)

    @property
    def fired(self) -> bool:
        return self.cut_at is not None

    def run(self) -> None:
        while not self.done.wait(WATCHDOG_TICK_S):
            now = time.monotonic()
            if self.busy():
                self.busy_at = now
            if self.cut_at is None:
                if now >= self.cut_by():
                    self._cut(now)
            elif self.hard_exit and now >= self.cut_at + WATCHDOG_EXIT_AFTER_S:
                self._exit(now)

    def _cut(self, now: float) -> None:
        self.cut_at = now
        self.on_cut()
        n = sum(cut(c) for c in self.connections())
        logger.warning("the run is %.1fs past --max-runtime and has not ended: cut its %d "
                       "database connection(s); jobs whose outcome was not written are left "
                       "to their lease", now - self.deadline, n)

    def _exit(self, now: float) -> None:
        with contextlib.suppress(Exception):
            sys.stderr.write(
                f"drainer {self.command}: still running {now - self.deadline:.1f}s past "
                "--max-runtime after its database connections were cut (a frozen or "
                f"unreachable database): exiting with {EXIT_WATCHDOG}; claimed jobs are left "
                "to their lease\n")
            sys.stderr.flush()
        os._exit(EXIT_WATCHDOG)

    def stop(self) -> None:
        self.done.set()
