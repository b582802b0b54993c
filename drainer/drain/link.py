"""The drain's work connection, opened again when it is lost.

A compute that suspends cuts every connection (so do a pooler, a compute restart, a network
blip); a drain whose handlers outlive the idle timeout finds its connection gone when it
has outcomes to write. :class:`Reconnecting` is the run's :class:`~drainer.db.Queries`:
before a statement it looks whether the server ended the connection (a cut arrives as a
reset or an end of file the socket already holds: no round trip), and when it did, or when
a statement fails because the connection went, it connects again (with the connect retries
of the first connection, through a cold start) and sends the statement on the new one. The
outcomes it then writes are fenced as always: a job whose lease was lost meanwhile is
refused, never written twice. A database that stays unreachable raises
DatabaseUnavailable (exit 3), as the first connection does.

:func:`awake_within`: whether a statement of this drain ended less than an idle timeout ago
(the compute is up for it), what the heartbeat plans its extensions against.
"""

from __future__ import annotations

import contextlib
import logging
import select
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import pq

from drainer import db

if TYPE_CHECKING:
    from datetime import datetime

    from drainer.db.queries import ClaimedRow
    from drainer.drain.report import RunReport
    from drainer.queue_limits import Rate
    from drainer.settings import Settings

logger = logging.getLogger("drainer.drain")

_T = TypeVar("_T")


def cut(conn: psycopg.Connection[Any]) -> bool:
    """Whether an idle connection was ended by the server or on the way (the socket is
    readable with nothing asked: an end of file, a reset, a FATAL before it): read without
    waiting, no byte sent."""
    if conn.closed:
        return True
    pgconn = conn.pgconn
    if pgconn.transaction_status != pq.TransactionStatus.IDLE or \
            pgconn.pipeline_status != pq.PipelineStatus.OFF:
        return False  # a statement is on its way: its result tells
    try:
        readable, _w, _x = select.select([pgconn.socket], [], [], 0)
        if readable:
            pgconn.consume_input()
    except (psycopg.OperationalError, OSError, ValueError):
        return True
    return pgconn.status == pq.ConnStatus.BAD


class Reconnecting(db.Queries):
    """The run's statements on a connection that is opened again when it is lost."""

    def __init__(self, settings: Settings, conn: psycopg.Connection[Any],
                 report: RunReport) -> None:
        super().__init__(conn, settings.schema_name, settings.table)
        self.settings = settings
        self.report = report
        self.idle_timeout = settings.effective_idle_timeout
        #: time.monotonic() when the last statement on this connection ended
        self.last_used = time.monotonic()
        #: called with the new connection (the run's watchdog, the claim pipeline)
        self.on_reconnect: list[Callable[[psycopg.Connection[Any]], None]] = []

    def reconnect(self, why: str) -> None:
        """Close what is left of the connection and open a new one (DatabaseUnavailable
        when every attempt fails)."""
        logger.warning("the database connection was lost (%s): reconnecting", why,
                       extra={"run_id": self.report.run_id})
        with contextlib.suppress(psycopg.Error):  # what is left of a broken connection
            self.conn.close()
        conn = db.connect(self.settings)  # DatabaseUnavailable (exit 3): every attempt failed
        self.conn = conn
        self._sql.conn = conn
        self.report.reconnects += 1
        for hook in self.on_reconnect:
            hook(conn)

    def ready(self) -> None:
        """Before a statement that starts on an idle connection: connect again if it was
        cut. (An idle connection is left open, not closed: it sends nothing, which is not
        activity, and a close would send a Terminate message, which is.)"""
        if cut(self.conn):
            self.reconnect("the server ended it")

    def _again(self, exc: BaseException, idle_before: bool) -> bool:
        """Whether ``exc`` was the connection going (not a statement's error) on a
        statement that started on an idle connection: sent again on a new one."""
        return idle_before and isinstance(exc, psycopg.OperationalError) and \
            self.conn.closed and db.timeout_kind(exc) is None

    def _idle(self) -> bool:
        pgconn = self.conn.pgconn
        return self.conn.closed or (
            pgconn.transaction_status == pq.TransactionStatus.IDLE
            and pgconn.pipeline_status == pq.PipelineStatus.OFF)

    def _exec(self, name: str, params: dict[str, Any] | None = None) -> psycopg.Cursor[Any]:
        idle = self._idle()
        if idle:
            self.ready()
        try:
            cur = super()._exec(name, params)
        except psycopg.OperationalError as exc:
            if not self._again(exc, idle):
                raise
            self.reconnect(db.one_line(exc))
            cur = super()._exec(name, params)
        self.last_used = time.monotonic()
        return cur

    # the claims of limited queues run a transaction in a pipeline: sent again whole
    def claim_batch_capped(self, queue: str, batch_size: int, lease: float,
                           max_running: int, *, start_now: int | None = None,
                           run_id: str | None = None) -> list[ClaimedRow]:
        return self._whole(lambda: super(Reconnecting, self).claim_batch_capped(
            queue, batch_size, lease, max_running, start_now=start_now, run_id=run_id))

    def claim_batch_rated(self, queue: str, batch_size: int, lease: float,
                          max_running: int | None, rate: Rate, *,
                          start_now: int | None = None, run_id: str | None = None
                          ) -> tuple[list[ClaimedRow], datetime | None, int]:
        return self._whole(lambda: super(Reconnecting, self).claim_batch_rated(
            queue, batch_size, lease, max_running, rate, start_now=start_now,
            run_id=run_id))

    def _whole(self, statement: Callable[[], _T]) -> _T:
        self.ready()
        try:
            out = statement()
        except psycopg.OperationalError as exc:
            if not self._again(exc, True):
                raise
            self.reconnect(db.one_line(exc))
            out = statement()
        self.last_used = time.monotonic()
        return out


def awake_within(last_used: float, idle_timeout: float | None, now: float) -> bool:
    """Whether a statement that ended at ``last_used`` keeps the compute up at ``now``, with
    a margin (a tenth of the idle timeout, at least 0.5 s) for the clocks and the round trip."""
    if idle_timeout is None:
        return True  # not declared: every moment counts as awake (the heartbeat as before)
    return now - last_used < idle_timeout - max(0.5, idle_timeout / 10)
