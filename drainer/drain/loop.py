"""The drain loop: a small state machine over claims, handlers, outcomes and limits.

Phases: CLAIMING (claims go out while jobs are due) -> DRAINED (a claim found nothing: finish
what is in hand) -> DONE; from either, a limit or a stop with handlers still running leads
to STOPPING (release what did not start, give the running the grace period) -> DONE.
Within a phase each :meth:`Drain.step` starts what may start, collects what finished,
and sends the next claim ahead, reads one back, writes outcomes or claims in step. The loop
decides which way outcomes and claims go; :mod:`.outcomes` writes, :mod:`.claims` claims,
:mod:`.pace` says when concurrent handlers make a claim worth sending.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from drainer.drain.claims import Batch, Claims
from drainer.drain.clock import BatchClock
from drainer.drain.handlers import Handlers
from drainer.drain.limits import Limits, record
from drainer.drain.outcomes import Outcomes
from drainer.drain.pace import Pace, Tail
from drainer.drain.pending import Pending
from drainer.drain.report import Progress, RunReport, job_extra
from drainer.drain.statements import Statements

if TYPE_CHECKING:
    from drainer.db.queries import ClaimedRow
    from drainer.drain.calls import Running
    from drainer.drain.leases import Heartbeat
    from drainer.drain.start import Plan
    from drainer.job import Job
    from drainer.maintenance.vacuum import BetweenBatches
    from drainer.registry import Task

logger = logging.getLogger("drainer.drain")


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
        self.heartbeat = heartbeat
        self.on_close = on_close  # at the end of the loop (the transaction connection)
        self.progress = None if progress is None else Progress(progress, statements, report)
        self.phase = Phase.CLAIMING
        self.tail = Tail(claims, outcomes.tally, limits, report)
        self.pending = Pending(handlers, outcomes, lease, self._extend_one)
        self.pace = Pace(handlers, claims, outcomes, self.pending, batch_size)
        self.clock: BatchClock = claims.clock
        #: finish_run's keyword arguments (queues included): the completions of a drain
        #: whose last claim came back short go with the end of the run (see
        #: :meth:`_may_finish`); None: the run's end is its own statement (run_once's).
        self.finish: dict[str, Any] | None = None
        self.fin: dict[str, Any] | None = None  # finish_run's result, when it went so

    def begin(self, due: list[str], plan: Plan, claimed: list[ClaimedRow],
              round_trip: float | None = None) -> None:
        """What the run's first Query found: the due queues, and the jobs of the first
        claim (waiting to start, their leases the heartbeat's from now on); the completions
        may go with the run's end when the Query could carry it. ``round_trip``: the
        Query's, timed: the claims after the first batch are sized from it (see
        :data:`drainer.drain.clock.ADAPT_SAMPLES`)."""
        if round_trip is not None:
            self.clock.round_trip(round_trip)
        self.claims.known_due(due)
        if plan.finish is not None:
            self.finish = {**plan.finish, "queues": self.report.queues}
        if claimed:
            self.pending.take(self.claims.claimed_first(claimed, plan.first_size))

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
                self.pending.take(self._settle())  # only after an error: nothing else left
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
        limit = self._check_limits()
        if limit is None and self.pace.claim_due(self.phase is Phase.CLAIMING):
            if not self.handlers.in_flight() and self._may_finish():
                # the last claim came back short: the successes go with the end of the run,
                # not with a claim that would find nothing and then a finish of its own
                # (two round trips and an empty claim's scan over the jobs just done)
                self._finish()
                if self.phase is Phase.DONE:
                    return
            if not self._fill_window():
                # the successes buffered so far go with the claim (one round trip, not two)
                self._claim(with_successes=self.claims.can_combine()
                            and not self._vacuum_due())
        if self.limits.must_release():
            # shutdown, or past the deadline: claimed jobs that have not started go back at
            # once (running a whole batch could overrun a platform limit)
            self._release(take_back=True)
        self._hand_over()
        idle = self._collect_finished()
        if self.outcomes.ahead and self._read_ahead(idle):
            return
        if self._write_or_claim(idle):
            return
        busy = self.handlers.in_flight()
        if self.pending or busy:
            if busy and (self.limits.must_release() or (limit is not None and not self.pending)):
                self.phase = Phase.STOPPING
        elif limit is None and self.phase is Phase.DRAINED and self.tail.again():
            self.phase = Phase.CLAIMING
        elif self.phase is Phase.DRAINED or limit is not None:
            self.phase = Phase.DONE

    def _holding(self) -> bool:
        return self.pace.holding(self.phase is Phase.CLAIMING) and not self._vacuum_due() \
            and self._check_limits() is None

    def _hand_over(self) -> None:
        """Start what may start; once the batch is (nearly) handed over, claim the next ahead."""
        self.pending.start(self.clock)
        # as many as the claims' window allows (see Claims.size: one, or more when the
        # round trip is long for the handlers' speed), once what waits to start runs out
        # within two round trips (sequential handlers take a large batch a few at a time)
        while self.clock.runs_out(len(self.pending)) and self.handlers.in_flight() \
                and self._may_send_ahead():
            self.outcomes.send_ahead(self.claims.next(ahead=True))

    def _read_ahead(self, idle: bool) -> bool:
        """With claims in flight: read one once the batch in hand is done (True: this step
        is over), or all of them when the batch runs slow."""
        if not idle:
            if not self.clock.slow_now(time.monotonic()):
                return True
            # a slow batch: take the jobs claimed ahead out of the socket, where the
            # heartbeat could not extend their leases
            self.pending.take(self._settle())
            return False
        # the batch in hand is done and the next was claimed while it ran: send its
        # successes (with another claim), then take the next batch
        if self._may_send_ahead():
            self.outcomes.send_ahead(self.claims.next(ahead=True))
        self.pending.take(self.claims.after_ahead(*self.outcomes.receive()))
        self._show_progress()
        return True

    def _write_or_claim(self, idle: bool) -> bool:
        """Write the outcomes of a finished batch (or a batch worth of them), with the next
        claim when it is due (True: this step is over); VACUUM between batches."""
        buffered = len(self.outcomes)
        # while a batch is still being handed over, its outcomes wait for two batches worth
        # of them: the claim's size (grown to the round trip: they then go with the next
        # claim, not one round trip each --batch-size jobs), twice, since the last jobs of
        # the batch before finish after its claim went ahead and are written with the next
        # (at one batch's worth they were written alone once a batch)
        if not buffered or (self.pending and buffered < 2 * max(self.batch_size,
                                                                self.claims.last_size)) \
                or self._holding():
            return False
        if idle and self.phase is Phase.CLAIMING and self._may_finish():
            self._finish()  # the completions and the end of the run: one round trip
            return True
        if idle and self.phase is Phase.CLAIMING and self.claims.can_combine() \
                and not self._vacuum_due() and self._check_limits() is None:
            if not self._fill_window():
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
        follow-up may be due again within the run: those take the loop's path), and no
        retry of the run is due within --retry-linger (the tail lingers for it)."""
        o = self.outcomes
        return (self.finish is not None and not o.ahead and not self.pending
                and not self.claims.last_full and self.claims.due is not None
                and not self.claims.due and bool(o.ok) and not o.failed and not o.snoozed
                and not o.tally.followups_due and not any(x.job.followups for x in o.ok)
                and not self._vacuum_due() and self._check_limits() is None
                and not self.tail.soon())

    def _finish(self) -> None:
        """The successes and finish_run (if_drained) in one statement: DONE when it ran
        (nothing due), else the loop claims on (finish_run goes again at the end)."""
        assert self.finish is not None
        went, self.fin = self.outcomes.with_finish(self.finish)
        if not went:  # written alone: finish_run is the run's own statement at its end
            self.finish = None
        self._show_progress()
        if self.fin is not None:
            self.phase = Phase.DONE

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

    def _fill_window(self) -> bool:
        """Nothing runs and claims may go ahead: as many as the claims' window holds go out
        at once, the successes with the first (the loop reads them back, the first at
        once), so that the round trip that brings the next claim brings those behind it
        too (10 ms away the pipeline was full one round trip later). False: none went."""
        if self.handlers.in_flight() or not self._may_send_ahead():
            return False
        while self._may_send_ahead():
            self.outcomes.send_ahead(self.claims.next(ahead=True))
        return True

    def _claim(self, *, with_successes: bool = False) -> None:
        batch: Batch
        self.tail.seen = datetime.now(timezone.utc)
        if with_successes and self.claims.can_combine():
            claim = self.claims.next()
            if claim.size <= 0:  # --max-jobs reached
                self.outcomes.write()
                batch, progressed = [], False
            else:
                rows = self.outcomes.with_claim(claim)
                batch, progressed = self.claims.after_combined(claim, rows)
        else:
            batch, progressed = self.claims.claim()
        self.pending.take(batch)
        if with_successes:
            self._show_progress()
        if not progressed:
            self.phase = Phase.DRAINED

    def _settle(self) -> Batch:
        """Read every claim in flight (so that the connection can run another statement)
        and count them; an error is raised once all are counted."""
        read, error = self.outcomes.settle()
        batch = [pair for claim, rows in read for pair in self.claims.after_ahead(claim, rows)]
        if error is not None:
            raise error
        return batch

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
        full = self.pending.full()
        claiming = self.phase is Phase.CLAIMING
        if busy and full and self.handlers.wait_sequential(0.05):
            self._collect(0)
        elif busy and full and not (self.pace.refilling() and self.pace.claim_due(claiming)):
            self._collect(0.05, self.pace.wanted(busy, claiming, self.phase is Phase.DRAINED))
        else:
            self._collect(0)
        idle = not self.pending and not self.handlers.in_flight()
        if idle:
            self.clock.finish(time.monotonic())
        return idle

    def _collect(self, block_for: float, want: int = 1) -> None:
        for outcome, r in self.handlers.wait(block_for, want):
            self.outcomes.add(outcome, lost=r.lost)

    def _release(self, take_back: bool) -> None:
        """Give back the claimed jobs that did not start (with ``take_back``, also those
        queued to handler threads but not picked up yet), without using up an attempt."""
        self.pending.take(self._settle())
        self.pending.release(self.q, self.report, take_back=take_back)

    def _show_progress(self) -> None:
        if self.progress is not None:
            self.progress.show(may_count=not self.outcomes.ahead)
