"""Transaction mode: each job's handler runs inside a transaction that also records its
success, so the handler's writes and ``done`` commit together or not at all.

The claim is an ordinary lease-mode claim (committed, the first job charged its attempt),
so a handler that kills its process is charged like any other: the lease expires, the
reaper counts the attempt, the job cannot loop forever. Then, job by job, on a connection
of its own (opened when the first such job is claimed):

- BEGIN; lock the row, fenced (``lock_running``: still ours, nobody else's);
- the handler runs on a handler thread (never the main thread: a signal is handled at
  once and the grace period bounds the wait), with ``job.conn`` the transaction's
  connection;
- success: ``complete_many`` in the same transaction, COMMIT;
- failure: ROLLBACK, then ``fail_many`` (a retry later, or failed for good);
- past the task's timeout, or the grace period after a stop: the server is told to
  cancel, the connection is closed (the server rolls the transaction back), the job is
  failed with a TimeoutError (timeout) or left to its lease (stop). The abandoned
  handler's thread may run on, but its connection is gone: nothing it writes commits.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from drainer import db
from drainer.drain import link
from drainer.drain.calls import JobContext, Outcome, Running, call
from drainer.drain.outcomes import Outcomes, undecodable
from drainer.drain.report import RunReport, job_extra

if TYPE_CHECKING:
    import psycopg

    from drainer.db import ClaimedRow, Queries
    from drainer.registry import Task
    from drainer.settings import Settings

logger = logging.getLogger("drainer.drain")

#: How often the main thread looks at the clock and the stop flag while a handler runs.
POLL_S = 0.05


class _HandlerFailed(Exception):
    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome


@dataclass
class _Box:
    """What the handler thread hands back."""

    outcome: Outcome | None = None
    written: set[int] | None = None  # the completion's result (success only)
    lost: bool = False  # the row was no longer ours when the transaction locked it
    error: BaseException | None = None  # the transaction itself failed (connection, ...)


class TransactionRunner:
    """Runs the batches of ``transaction=True`` tasks for one drain."""

    def __init__(self, settings: Settings, queries: Queries, outcomes: Outcomes,
                 report: RunReport, make: Callable[[Task, ClaimedRow], Running],
                 lease: Callable[[Task], float], *, grace: float,
                 stopping: Callable[[], bool], hurry: threading.Event,
                 context: JobContext | None = None) -> None:
        self.settings = settings
        self.context = context  # what each handler call runs in
        self.q = queries
        self.outcomes = outcomes
        self.report = report
        self.make = make
        self.lease = lease
        self.grace = grace
        self.stopping = stopping
        self.hurry = hurry
        self.conn: psycopg.Connection[Any] | None = None
        self.tq: Queries | None = None

    def run_batch(self, task: Task, size: int) -> int:
        """Claim up to ``size`` jobs of ``task``'s queue and run them one by one, each in
        its own transaction; returns how many were claimed."""
        rows = self.q.claim_batch(task.queue, size, self.lease(task), start_now=1,
                                  run_id=self.report.run_id)
        for i, row in enumerate(rows):
            if self.stopping():
                self._release(rows[i:])
                break
            r = self.make(task, row)
            poison = undecodable(r)
            if poison is not None:
                self.outcomes.add(poison)
            elif not self._run_one(r):
                self._release(rows[i + 1:])  # stopped past the grace period
                break
            self.outcomes.write_failures()
        return len(rows)

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            finally:
                self.conn = self.tq = None

    # -- one job ------------------------------------------------------------------------------
    def _run_one(self, r: Running) -> bool:
        """Run one job's transaction; False: abandoned after a stop (left to its lease)."""
        if self.conn is not None and link.cut(self.conn):  # cut between two jobs
            self.close()
        if self.conn is None:
            self.conn = db.connect(self.settings, purpose="transaction")
            self.tq = db.Queries(self.conn, self.settings.schema_name, self.settings.table)
        conn, tq = self.conn, self.tq
        assert tq is not None
        box = _Box()
        finished = threading.Event()
        thread = threading.Thread(target=self._work, args=(conn, tq, r, box, finished),
                                  name=f"drainer-tx-{r.job.id}", daemon=True)
        thread.start()
        grace_until: float | None = None
        while not finished.wait(POLL_S):
            now = time.monotonic()
            if r.timeout_at is not None and now >= r.timeout_at:
                self._abandon(r)
                self.outcomes.add(Outcome(
                    r.job, r.task, False,
                    f"TimeoutError: handler exceeded its timeout of {r.task.timeout}s "
                    "(its transaction was rolled back)", round(now - r.started, 6)))
                return True
            if grace_until is None and self.stopping():
                grace_until = now + self.grace
            if grace_until is not None and (now >= grace_until or self.hurry.is_set()):
                self._abandon(r)
                logger.warning("job %d still running after the %.0fs grace period: its "
                               "transaction was rolled back, the job is left to its lease",
                               r.job.id, self.grace, extra=job_extra(
                                   self.report.run_id, r.job, outcome="abandoned"))
                return False
        if box.error is not None:
            logger.warning("job %d: its transaction failed: %s", r.job.id,
                           db.one_line(box.error),
                           extra=job_extra(self.report.run_id, r.job))
            self.close()
            # the commit may or may not have happened: the fenced failure tells
            self.outcomes.add(Outcome(r.job, r.task, False,
                                      f"transaction failed: {db.one_line(box.error)}"))
        elif box.lost:
            assert box.outcome is not None
            self.outcomes.add(box.outcome, lost=True)
        elif box.written is not None:
            assert box.outcome is not None
            self.outcomes.committed(box.outcome, box.written)
        elif box.outcome is not None:
            self.outcomes.add(box.outcome)
        return True

    def _work(self, conn: psycopg.Connection[Any], tq: Queries, r: Running, box: _Box,
              finished: threading.Event) -> None:
        job = r.job
        try:
            with conn.transaction():
                if not tq.lock_running(job.id, job.fence):
                    box.lost = True
                    box.outcome = Outcome(job, r.task, False, "no longer ours")
                    return
                job.conn = conn
                try:
                    with conn.transaction():  # the handler's writes, in their own savepoint
                        outcome = call(r.task, job, context=self.context)
                        if not outcome.ok:
                            raise _HandlerFailed(outcome)
                finally:
                    job.conn = None
                box.written = self.outcomes.in_transaction(tq, outcome)
                box.outcome = outcome
        except _HandlerFailed as failed:
            box.outcome = failed.outcome
        except BaseException as exc:
            box.error = exc
        finally:
            finished.set()

    def _abandon(self, r: Running) -> None:
        """Tell the handler to stop and end its transaction: cancel what the server runs,
        close the connection (the server rolls back and lets the row lock go)."""
        r.job.cancelled.set()
        conn, self.conn, self.tq = self.conn, None, None
        if conn is None:
            return
        try:
            conn.cancel()
        except Exception as exc:
            logger.debug("cancel failed: %s", db.one_line(exc))
        try:
            # shut the socket down under libpq (not conn.close(), which would free what the
            # handler thread may be using): the server sees the connection end and rolls
            # back; the handler's next statement fails
            sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
            try:
                sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.close()
        except Exception as exc:
            logger.debug("closing the transaction's connection failed: %s",
                         db.one_line(exc))

    def _release(self, rows: list[ClaimedRow]) -> None:
        if not rows:
            return
        released = self.q.release_many(
            [r.id for r in rows], [r.attempts if r.fence is None else r.fence for r in rows])
        self.report.released += len(released)
        logger.info("released %d claimed jobs that had not started", len(released),
                    extra={"run_id": self.report.run_id})
