"""What stops a drain: a stop request (a signal), the deadline, --max-jobs.

Questions only: nothing here changes the run report; the loop records the answer
(:func:`record`) in one place.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from drainer.drain.report import RunReport

#: ``stopped_by`` values, in the order they are checked.
SIGNAL = "signal"
MAX_RUNTIME = "max_runtime"
MAX_JOBS = "max_jobs"


@dataclass(frozen=True)
class Limits:
    """The limits of one drain. ``deadline`` is a ``time.monotonic()`` instant."""

    stop: threading.Event
    deadline: float | None = None
    max_jobs: int | None = None

    def stopped_by(self, claimed: int, now: float | None = None) -> str | None:
        """Which limit says stop claiming now (None: none does)."""
        if self.stop.is_set():
            return SIGNAL
        if self.deadline is not None and (time.monotonic() if now is None else now) \
                >= self.deadline:
            return MAX_RUNTIME
        if self.max_jobs is not None and claimed >= self.max_jobs:
            return MAX_JOBS
        return None

    def must_release(self, now: float | None = None) -> bool:
        """Shutdown or the deadline: claimed jobs that have not started go back at once.

        (--max-jobs only stops claiming: what was claimed within the limit still runs.)
        """
        return self.stop.is_set() or (self.deadline is not None and (
            time.monotonic() if now is None else now) >= self.deadline)


def record(report: RunReport, stopped_by: str | None) -> None:
    """Note the first limit that stopped the run (a later one does not replace it)."""
    if stopped_by is None:
        return
    report.stopped_by = report.stopped_by or stopped_by
    if stopped_by != SIGNAL:
        report.deadline_hit = True
