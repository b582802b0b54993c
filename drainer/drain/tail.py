"""The drain's tail: when a claim found nothing, whether to claim again before exiting."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from drainer.drain.claims import Claims
    from drainer.drain.limits import Limits
    from drainer.drain.report import RunReport
    from drainer.drain.tally import Tally


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
        due = min((t for t in (self.tally.next_retry_at(now), self.claims.limited.next_slot(now))
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
