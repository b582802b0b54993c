"""A live progress line on a terminal during long drains."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from drainer.logs import is_tty

if TYPE_CHECKING:
    from drainer.drain import RunReport


def progress_printer(min_interval: float = 0.5) -> Callable[[RunReport], None] | None:
    """A callback that redraws one status line on stderr, or None when stderr is no TTY."""
    if not is_tty():
        return None
    started = time.monotonic()
    last = [0.0]

    def show(report: RunReport) -> None:
        now = time.monotonic()
        if now - last[0] < min_interval:
            return
        last[0] = now
        elapsed = max(now - started, 1e-9)
        done = report.succeeded + report.retried + report.failed
        sys.stderr.write(
            f"\r\x1b[Kclaimed {report.claimed}  done {report.succeeded}  retried "
            f"{report.retried}  failed {report.failed}  {done / elapsed:,.0f} jobs/s"
        )
        sys.stderr.flush()

    return show
