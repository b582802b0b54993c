"""The pace of claims: when concurrent handlers make a claim worth sending, how long the
loop waits for outcomes before its next step has work to do (:class:`Pace`), and whether a
drain that found nothing claims again before exiting (:class:`Tail`)."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from drainer.drain.claims import Claims
    from drainer.drain.handlers import Handlers
    from drainer.drain.limits import Limits
    from drainer.drain.outcomes import Outcomes
    from drainer.drain.pending import Pending
    from drainer.drain.report import RunReport, Tally


class Pace:
    """The claims' pace for one drain: one claim a batch when handlers are sequential; with
    concurrent handlers, one a share of free slots (see :meth:`refill_at`)."""

    def __init__(self, handlers: Handlers, claims: Claims, outcomes: Outcomes,
                 pending: Pending, batch_size: int) -> None:
        self.handlers = handlers
        self.claims = claims
        self.outcomes = outcomes
        self.pending = pending
        self.batch_size = batch_size

    def refilling(self) -> bool:
        """Claims wait for a share of free slots: concurrent handlers on a queue whose
        claims carry completions (not transaction mode, max_running or rate_limit: those
        claim in step, sized to the free handlers)."""
        return self.handlers.concurrency > 1 and self.claims.may_combine(self.claims.cursor)

    def refill_at(self) -> int:
        """Concurrent handlers: free slots (of ``concurrency`` handlers and as many jobs
        queued ahead of them) that make a claim worth sending: a quarter of the handlers, at
        least a batch, at most all of them. The jobs queued ahead keep the handlers busy
        while it is out, and the successes of those freed go with it (one statement, one
        round trip and one commit for hundreds of jobs at --concurrency 1000, not one for
        every few)."""
        c = self.handlers.concurrency
        return min(c, max(self.batch_size, c // 4))

    def claim_due(self, claiming: bool) -> bool:
        """Whether the next in-step claim goes out now: while claiming, nothing claimed waits
        to start and no claim is in flight; with concurrent handlers, once a share of their
        slots is free or none is busy."""
        if not claiming or self.pending or self.outcomes.ahead:
            return False
        h = self.handlers
        return not self.refilling() or not h.in_flight() or h.room() >= self.refill_at()

    def holding(self, claiming: bool) -> bool:
        """Concurrent handlers while claiming: the buffered outcomes wait for the next claim
        (:meth:`claim_due`), which writes them in the same statement (the loop also asks
        whether a vacuum or a limit is due)."""
        return (self.handlers.concurrency > 1 and claiming and not self.pending
                and not self.outcomes.ahead and bool(self.handlers.in_flight())
                and self.claims.can_combine())

    def wanted(self, busy: int, claiming: bool, drained: bool) -> int:
        """How many outcomes to wait for (up to 50 ms) before the next step has work to do:
        with concurrent handlers, those that make a claim due, or in the drained tail a
        share of what runs; else the first."""
        if not self.refilling():
            return 1
        if claiming and not self.pending and not self.outcomes.ahead:
            return max(1, self.refill_at() - self.handlers.room())
        if drained:
            return max(1, min(busy, self.refill_at()))
        return 1


class Tail:
    """Claim again when follow-ups due now were just inserted (the statement that inserted
    them could not claim them), when a max_running queue freed slots or a rate-limited
    queue's window has room again, or when a retry or snooze of this drain, or the next
    slot of a rate-limited queue, is due within ``linger`` seconds: waited for here, as
    the compute is up anyway and the next wake would cost a resume."""

    def __init__(self, claims: Claims, tally: Tally, limits: Limits, report: RunReport,
                 linger: float = 0.0) -> None:
        self.claims = claims
        self.tally = tally
        self.limits = limits
        self.report = report
        self.linger = linger  # seconds to wait for a retry due that soon
        #: when the last in-step claim was sent: what was due then, it saw
        self.seen: datetime | None = None

    def soon(self) -> bool:
        """Whether a retry or snooze of this drain that its last claim could not see is due
        within ``linger``: the drain does not end with the last completions then (it
        lingers in :meth:`again`)."""
        if self.linger <= 0:
            return False
        now = datetime.now(timezone.utc)
        due = self.tally.next_retry_at(now, self.seen)
        return due is not None and (due - now).total_seconds() <= self.linger

    def again(self) -> bool:
        if self.tally.followups_due:
            self.tally.followups_due = False
            return True
        if self.claims.limited.freed_slots():
            return True
        now = datetime.now(timezone.utc)
        if self.claims.limited.slot_open(now):
            return True
        if self.linger <= 0:
            return False
        due = min((t for t in (self.tally.next_retry_at(now, self.seen),
                               self.claims.limited.next_slot(now))
                   if t is not None), default=None)
        if due is None:
            return False
        wait = (due - now).total_seconds()
        if wait > self.linger:
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
