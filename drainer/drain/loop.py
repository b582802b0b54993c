"""The drain loop: a small state machine over claims, handlers, outcomes and limits.

Phases: CLAIMING (claims go out while jobs are due) -> DRAINED (a claim found nothing: finish
what is in hand) -> DONE; from either, a limit or a stop with handlers still running leads
to STOPPING (release what did not start, give the running the grace period) -> DONE.
Within a phase each :meth:`Drain.step` starts what may start, collects what finished,
and sends the next claim ahead, reads one back, writes outcomes or claims in step.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import psycopg

from drainer._loaders import UndecodablePayload
from drainer.drain.claims import Batch, BatchClock, Claims
from drainer.drain.handlers import Handlers, Running, make_running
from drainer.drain.leases import HEARTBEAT_FRACTION, Heartbeat
from drainer.drain.limits import Limits, record
from drainer.drain.outcomes import Outcomes, undecodable
from drainer.drain.report import RunReport, job_extra
from drainer.drain.statements import Statements
from drainer.job import Job
from drainer.registry import Task

if TYPE_CHECKING:
    from drainer.maintenance.vacuum import BetweenBatches

logger = logging.getLogger("drainer.drain")

#: With a progress line (a terminal), remaining due jobs are counted at most this often.
PROGRESS_DUE_INTERVAL_S = 1.0


class Phase(enum.Enum):
    CLAIMING = "claiming"
    DRAINED = "drained"
    STOPPING = "stopping"
    DONE = "done"


class Drain:
    """One drain's loop; the parts are built by :func:`drainer.drain.run_once`."""

    def __init__(self, report: RunReport, statements: Statements, claims: Claims,
                 handlers: Handlers, outcomes: Outcomes, limits: Limits,
                 vacuum: BetweenBatches | None, *, batch_size: int, grace: float,
                 hurry: threading.Event, lease: Callable[[Task], float],
                 heartbeat: Heartbeat | None = None,
                 progress: Callable[[RunReport], None] | None = None,
                 on_close: Callable[[], None] | None = None) -> None:
        self.report = report
        self.q = statements
        self.claims = claims
        self.handlers = handlers
        self.outcomes = outcomes
        self.limits = limits
        self.vacuum = vacuum
        self.batch_size = batch_size
        self.grace = grace
        self.hurry = hurry
        self.lease = lease
        self.heartbeat = heartbeat
        self.on_close = on_close  # at the end of the loop (the transaction connection)
        self.progress = None if progress is None else _Progress(progress, statements, report)
        self.phase = Phase.CLAIMING
        self.retry_linger = 0.0  # seconds to wait in the tail for a retry due that soon
        self.pending: deque[Running] = deque()  # claimed, not handed to a handler yet
        self.clock: BatchClock = claims.clock
        #: finish_run's keyword arguments (queues included): the completions of a drain
        #: whose last claim came back short go with the end of the run (see
        #: :meth:`_may_finish`); None: the run's end is its own statement (run_once's).
        self.finish: dict[str, Any] | None = None
        self.fin: dict[str, Any] | None = None  # finish_run's result, when it went so

    def leases(self) -> list[Running]:
        """The jobs whose leases are ours to extend: running, or waiting to start."""
        return [*self.handlers.running.values(), *self.pending]

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.start()
        try:
            while self.phase is not Phase.DONE:
                if self.phase is Phase.STOPPING:
                    self.stop()
                else:
                    self.step()
        finally:
            try:
                self._take(self.claims.settle())  # only after an error: nothing else is left
                self.outcomes.write()
                self._show_progress()
            finally:
                if self.heartbeat is not None:
                    self.heartbeat.stop()
                self.handlers.shutdown()
                if self.on_close is not None:
                    self.on_close()

    def step(self) -> None:
        """One turn of the loop while CLAIMING or DRAINED."""
        if self.clock.wants_probe() and not self.claims.ahead \
                and not self.handlers.in_flight():
            self.claims.time_link()  # nothing else runs now: a Sync alone is timed alone
        limit = self._check_limits()
        if limit is None and self._claim_due():
            # the successes buffered so far go with the claim (one round trip, not two)
            self._claim(with_successes=self.claims.can_combine() and not self._vacuum_due())
        if self.limits.must_release():
            # shutdown, or past the deadline: claimed jobs that have not started go back at
            # once (running a whole batch could overrun a platform limit)
            self._release(take_back=True)
        self._hand_over()
        idle = self._collect_finished()
        if self.claims.ahead and self._read_ahead(idle):
            return
        if self._write_or_claim(idle):
            return
        busy = self.handlers.in_flight()
        if self.pending or busy:
            if busy and (self.limits.must_release() or (limit is not None and not self.pending)):
                self.phase = Phase.STOPPING
        elif limit is None and self.phase is Phase.DRAINED and self._again():
            self.phase = Phase.CLAIMING
        elif self.phase is Phase.DRAINED or limit is not None:
            self.phase = Phase.DONE

    def _claim_due(self) -> bool:
        """Whether the next in-step claim goes out now: while claiming, nothing claimed waits
        to start and no claim is in flight; with concurrent handlers, once a share of their
        slots is free (see :meth:`_refill_at`) or none is busy."""
        if self.phase is not Phase.CLAIMING or self.pending or self.claims.ahead:
            return False
        h = self.handlers
        return not self._refilling() or not h.in_flight() or h.room() >= self._refill_at()

    def _refilling(self) -> bool:
        """Claims wait for a share of free slots (:meth:`_refill_at`): concurrent handlers
        on a queue whose claims carry completions (not transaction mode, max_running or
        rate_limit: those claim in step, sized to the free handlers, as before)."""
        return self.handlers.concurrency > 1 and self.claims._may_combine(self.claims.cursor)

    def _refill_at(self) -> int:
        """Concurrent handlers: free slots (of ``concurrency`` handlers and as many jobs
        queued ahead of them) that make a claim worth sending: a quarter of the handlers, at
        least a batch, at most all of them. The jobs queued ahead keep the handlers busy
        while it is out, and the successes of those freed go with it (one statement, one
        round trip and one commit for hundreds of jobs at --concurrency 1000, not one for
        every few)."""
        c = self.handlers.concurrency
        return min(c, max(self.batch_size, c // 4))

    def _holding(self) -> bool:
        """Concurrent handlers while claiming: the buffered outcomes wait for the next claim
        (:meth:`_claim_due`), which writes them in the same statement."""
        return (self.handlers.concurrency > 1 and self.phase is Phase.CLAIMING
                and not self.pending and not self.claims.ahead
                and bool(self.handlers.in_flight()) and self.claims.can_combine()
                and not self._vacuum_due() and self._check_limits() is None)

    def _again(self) -> bool:
        """Before exiting: claim again when follow-ups due now were just inserted (the
        statement that inserted them could not claim them), when a rate-limited queue's
        window has room again, or when a retry or snooze of this drain, or the next slot of
        a rate-limited queue, is due within retry_linger seconds (waited for here: the
        compute is up anyway, the next wake would cost a resume)."""
        if self.outcomes.followups_due:
            self.outcomes.followups_due = False
            return True
        if self.claims.freed_capped_slots():
            return True
        now = datetime.now(timezone.utc)
        if self.claims.rate_slot_open(now):  # a rate window has room again by now
            return True
        if self.retry_linger <= 0:
            return False
        # a retry or snooze of this drain, or the next slot of a rate-limited queue it left
        # due jobs on, whichever comes first
        due = min((t for t in (self.outcomes.next_retry_at(now),
                               self.claims.next_rate_slot(now)) if t is not None),
                  default=None)
        if due is None:
            return False
        wait = (due - now).total_seconds()
        if wait > self.retry_linger:
            return False
        if self.limits.deadline is not None and \
                time.monotonic() + max(wait, 0) >= self.limits.deadline:
            return False
        if wait > 0:
            started = time.monotonic()
            self.limits.stop.wait(wait + 0.01)
            self.report.lingered_s = round(self.report.lingered_s
                                           + time.monotonic() - started, 6)
        return not self.limits.stop.is_set()

    def _hand_over(self) -> None:
        """Start what may start; once the batch is (nearly) handed over, claim the next ahead."""
        starting: list[Running] = []
        busy = self.handlers.in_flight()
        pending, slots = self.pending, self.handlers.slots
        while pending and busy + len(starting) < slots(pending[0]):
            starting.append(pending.popleft())
        if starting:
            self.clock.start(time.monotonic(), len(starting))
            self.handlers.start_many(starting)
        # as many as the claims' window allows (see Claims.size: one, or more when the
        # round trip is long for the handlers' speed), once what waits to start runs out
        # within two round trips (sequential handlers take a large batch a few at a time)
        while self.clock.runs_out(len(self.pending)) and self.handlers.in_flight() \
                and self._may_send_ahead():
            self.claims.send_ahead()

    def _read_ahead(self, idle: bool) -> bool:
        """With claims in flight: read one once the batch in hand is done (True: this step
        is over), or all of them when the batch runs slow."""
        if not idle:
            if not self.clock.slow_now(time.monotonic()):
                return True
            # a slow batch: take the jobs claimed ahead out of the socket, where the
            # heartbeat could not extend their leases
            self._take(self.claims.settle())
            return False
        # the batch in hand is done and the next was claimed while it ran: send its
        # successes (with another claim), then take the next batch
        if self._may_send_ahead():
            self.claims.send_ahead()
        self._take(self.claims.receive())
        self._show_progress()
        return True

    def _write_or_claim(self, idle: bool) -> bool:
        """Write the outcomes of a finished batch (or a batch worth of them), with the next
        claim when it is due (True: this step is over); VACUUM between batches."""
        buffered = len(self.outcomes)
        # while a batch is still being handed over, its outcomes wait for a batch worth of
        # them: the claim's size (grown to the round trip: they then go with the next
        # claim, not one round trip each --batch-size jobs)
        if not buffered or (self.pending and buffered < max(self.batch_size,
                                                             self.claims.last_size)) \
                or self._holding():
            return False
        if idle and self.phase is Phase.CLAIMING and self._may_finish():
            self._finish()  # the completions and the end of the run: one round trip
            return True
        if idle and self.phase is Phase.CLAIMING and self.claims.can_combine() \
                and not self._vacuum_due() and self._check_limits() is None:
            self._claim(with_successes=True)  # one round trip
            return True
        self.outcomes.write()
        self._show_progress()
        if idle and self.phase is Phase.CLAIMING and self.vacuum is not None \
                and self._vacuum_due():
            self.vacuum.run_once(self.report.finished)
        return False

    def _may_finish(self) -> bool:
        """Whether the buffered outcomes may go with the end of the run (finish_run, which
        then runs only if no job of the drained queues is due): the last claim came back
        short and no other queue is believed due, nothing is in flight or waiting, and
        the outcomes are successes only, with no follow-ups (a retry, a snooze or a
        follow-up may be due again within the run: those take the loop's path)."""
        o = self.outcomes
        return (self.finish is not None and not self.claims.ahead and not self.pending
                and not self.claims.last_full and self.claims.due is not None
                and not self.claims.due and bool(o.ok) and not o.failed and not o.snoozed
                and not o.followups_due and not any(x.job.followups for x in o.ok)
                and not self._vacuum_due() and self._check_limits() is None)

    def _finish(self) -> None:
        """The successes and finish_run (if_drained) in one statement: DONE when it ran
        (nothing due), else the loop claims on (finish_run goes again at the end)."""
        assert self.finish is not None
        buf = self.outcomes.take_successes()
        try:
            written, self.fin = self.q.complete_many_and_finish(
                [x.job.id for x in buf], [x.job.fence for x in buf], self.finish,
                delete=self.outcomes.delete, **self.outcomes.completion(buf))
        except psycopg.errors.DeadlockDetected as exc:
            # it rolled back whole (the archive's deletes met another drainer's): the
            # successes alone, and finish_run at the end of the run, as before
            logger.warning("completions with the end of the run deadlocked, writing them "
                           "alone: %s", exc, extra={"run_id": self.report.run_id})
            self.finish = None
            self.outcomes.put_back(buf)
            self.outcomes.write()
            self._show_progress()
            return
        self.outcomes.written(buf, written)
        self._show_progress()
        if self.fin is not None:
            self.phase = Phase.DONE

    def take_first(self, batch: Batch) -> None:
        """The jobs of the run's first claim (sent with run_start): waiting to start, their
        leases the heartbeat's from now on."""
        self._take(batch)

    def stop(self) -> None:
        """Release what did not start, give running handlers the grace period, then leave
        them to their lease."""
        self._check_limits()  # a signal may have come since the step began
        self._release(take_back=self.limits.must_release())
        until = time.monotonic() + self.grace
        while self.handlers.in_flight() and time.monotonic() < until \
                and not self.hurry.is_set():
            self._collect(min(0.1, max(0.0, until - time.monotonic())))
            if len(self.outcomes):
                self.outcomes.write()
                self._show_progress()
        self._release(take_back=True)
        for r in self.handlers.still_running():
            r.job.cancelled.set()
            logger.warning("job %d still running after the %.0fs grace period: left to its "
                           "lease", r.job.id, self.grace,
                           extra=job_extra(self.report.run_id, r.job, outcome="abandoned"))
        self.phase = Phase.DONE

    # -- the steps ----------------------------------------------------------------------------
    def _check_limits(self) -> str | None:
        """The limit that stops claiming now, if any, noted in the report."""
        why = self.limits.stopped_by(self.report.claimed)
        record(self.report, why)
        return why

    def _vacuum_due(self) -> bool:
        return self.vacuum is not None and self.vacuum.due(self.report.finished)

    def _may_send_ahead(self) -> bool:
        return (self.phase is Phase.CLAIMING and self.clock.fast()
                and self.claims.can_send_ahead() and not self._vacuum_due()
                and self._check_limits() is None)

    def _claim(self, *, with_successes: bool = False) -> None:
        batch, progressed = self.claims.claim(with_successes=with_successes)
        self._take(batch)
        if with_successes:
            self._show_progress()
        if not progressed:
            self.phase = Phase.DRAINED

    def _take(self, batch: Batch) -> None:
        extend, pending = self._extend_one, self.pending
        for task, row in batch:
            r = make_running(task, row, self.lease(task), self.handlers.timeout(task))
            if isinstance(row.payload, UndecodablePayload):
                poison = undecodable(r)
                if poison is not None:
                    self.outcomes.add(poison)  # failed at once; the rest of the batch runs
                    continue
            r.job._extend = extend
            pending.append(r)

    def _extend_one(self, job: Job, seconds: float | None) -> bool:
        if self.heartbeat is None:
            return False
        with self.handlers.lock:
            r = self.handlers.running.get(job.id)
        return self.heartbeat.extend_one(r, job, seconds)

    def _collect_finished(self) -> bool:
        """Buffer the outcomes of finished handlers (waiting a little when nothing else can
        start); True when the batch in hand is done (nothing waiting, nothing running)."""
        busy = self.handlers.in_flight()
        full = not self.pending or busy >= self.handlers.slots(self.pending[0])
        if busy and full and self.handlers.wait_sequential(0.05):
            self._collect(0)
        elif busy and full and not (self._refilling() and self._claim_due()):
            self._collect(0.05, self._wanted(busy))
        else:
            self._collect(0)
        idle = not self.pending and not self.handlers.in_flight()
        if idle:
            self.clock.finish(time.monotonic())
        return idle

    def _wanted(self, busy: int) -> int:
        """How many outcomes to wait for (up to 50 ms) before the next step has work to do:
        with concurrent handlers, those that make a claim due, or in the drained tail a
        share of what runs; else the first."""
        if not self._refilling():
            return 1
        if self.phase is Phase.CLAIMING and not self.pending and not self.claims.ahead:
            return max(1, self._refill_at() - self.handlers.room())
        if self.phase is Phase.DRAINED:
            return max(1, min(busy, self._refill_at()))
        return 1

    def _collect(self, block_for: float, want: int = 1) -> None:
        for outcome, r in self.handlers.wait(block_for, want):
            self.outcomes.add(outcome, lost=r.lost)

    def _release(self, take_back: bool) -> None:
        """Give back the claimed jobs that did not start (with ``take_back``, also those
        queued to handler threads but not picked up yet), without using up an attempt."""
        self._take(self.claims.settle())
        jobs = list(self.pending)
        self.pending.clear()
        if take_back:
            jobs.extend(self.handlers.take_back())
        if not jobs:
            return
        released = self.q.release_many([r.job.id for r in jobs], [r.job.fence for r in jobs])
        self.report.released += len(released)
        logger.info("released %d claimed jobs that had not started", len(released),
                    extra={"run_id": self.report.run_id})

    def _show_progress(self) -> None:
        if self.progress is not None:
            self.progress.show(may_count=not self.claims.ahead)

class _Progress:
    """The progress line (a terminal only), with a fresh due count at most each second."""

    def __init__(self, draw: Callable[[RunReport], None], statements: Statements,
                 report: RunReport) -> None:
        self.draw = draw
        self.q = statements
        self.report = report
        self.checked = time.monotonic()
        self.base: tuple[int, int] | None = None  # due jobs counted, claimed by then

    def show(self, *, may_count: bool) -> None:
        """Redraw; ``may_count``: the connection is free for a count (no claims ahead)."""
        now = time.monotonic()
        if now - self.checked >= PROGRESS_DUE_INTERVAL_S and may_count:
            self.checked = now
            self.base = self.q.queue_summary(self.report.queues)[0], self.report.claimed
        if self.base is not None:  # between counts: minus what was claimed since
            due, claimed = self.base
            self.report.remaining_due = max(0, due - (self.report.claimed - claimed))
        self.draw(self.report)


def heartbeat_interval(leases: list[float]) -> float:
    """How often the heartbeat looks at leases: a fraction of the shortest."""
    return max(0.05, min(leases) * HEARTBEAT_FRACTION)
