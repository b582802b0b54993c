"""A live progress line on a terminal during long drains."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, TextIO

from drainer.logs import is_tty

if TYPE_CHECKING:
    from drainer.drain.report import RunReport

#: Seconds a drain runs before the line appears (short drains print nothing).
SHOW_AFTER_S = 1.0
#: Shortest time between two redraws.
MIN_INTERVAL_S = 0.5


class ProgressLine:
    """Redraws one line on a terminal: claimed, done, retried, failed, rate, remaining due."""

    def __init__(self, stream: TextIO, min_interval: float = MIN_INTERVAL_S,
                 show_after: float = SHOW_AFTER_S) -> None:
        self.stream = stream
        self.min_interval = min_interval
        self.started = time.monotonic()
        self.next_draw = self.started + show_after
        self.shown = False
        self.last: RunReport | None = None

    def __call__(self, report: RunReport) -> None:
        self.last = report
        now = time.monotonic()
        if now < self.next_draw:
            return
        self.next_draw = now + self.min_interval
        self._draw(report, now)

    def _draw(self, report: RunReport, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        done = report.succeeded + report.retried + report.failed
        self.stream.write(
            f"\r\x1b[Kclaimed {report.claimed}  done {report.succeeded}  retried "
            f"{report.retried}  failed {report.failed}  {done / elapsed:,.0f} jobs/s  "
            f"due {report.remaining_due}"
        )
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        """Draw the final figures (the throttled line may lag behind the report that
        follows) and end the line, so that what follows starts on a line of its own."""
        if self.shown:
            if self.last is not None:
                self._draw(self.last, time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False


def progress_printer(min_interval: float = MIN_INTERVAL_S) -> ProgressLine | None:
    """A progress line on stderr, or None when stderr is no terminal."""
    if not is_tty():
        return None
    return ProgressLine(sys.stderr, min_interval)
