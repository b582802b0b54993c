"""Auto-refresh of ``drainer ui``'s pages: off by default, and never so often that an open
browser tab keeps the compute awake.

A page that reloads itself is a poll: one more often than the compute's idle timeout keeps
a serverless database up 24 hours a day (the rule of "Postgres as a job queue"). So the
shortest refresh is just over the idle timeout (the settings' ``--idle-timeout`` or
``--platform``), as ``drainer schedule`` refuses wakes that come as often as the timeout,
unless ``--allow-always-on`` says the compute may stay up (or it never suspends).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from drainer.waking import IdleTimeout, fmt_seconds, polls_faster_than_idle

#: The shortest refresh on a compute that may stay awake (a page load is not free).
MIN_REFRESH_S = 5.0


@dataclass(frozen=True)
class RefreshPolicy:
    """Which auto-refresh intervals a page may take."""

    idle: IdleTimeout
    allow_always_on: bool = False

    @property
    def minimum(self) -> float:
        """The shortest interval allowed (seconds)."""
        if self.idle.never_suspends or self.allow_always_on:
            return MIN_REFRESH_S
        return math.floor(self.idle.seconds) + 1.0

    def choose(self, requested: float | None) -> tuple[float | None, str | None]:
        """The interval a page refreshes at (None: off) and a note when it is not the one
        asked for."""
        if requested is None or requested <= 0:
            return None, None
        if requested >= self.minimum:
            return requested, None
        if not self.idle.never_suspends and not self.allow_always_on and \
                polls_faster_than_idle(requested, self.idle, inclusive=True):
            return self.minimum, (
                f"every {fmt_seconds(requested)} would keep the compute awake (idle timeout "
                f"{fmt_seconds(self.idle.seconds)}, {self.idle.source}): refreshing every "
                f"{fmt_seconds(self.minimum)} instead; start drainer ui with "
                "--allow-always-on to allow it")
        return self.minimum, f"refreshing every {fmt_seconds(self.minimum)} at the most"

    def offers(self) -> list[float]:
        """The intervals a page offers: the shortest allowed (in whole minutes when it is
        longer than one), twice and six times that."""
        base = self.minimum if self.minimum < 60 else math.ceil(self.minimum / 60) * 60.0
        return [base, base * 2, base * 6]


def parse_refresh(text: str | None) -> float | None:
    """The ``refresh`` query parameter: seconds (``600``, ``10m``); blank or 0: off;
    anything else: off too (a page is still shown, without a refresh)."""
    from drainer.settings import parse_duration

    if text is None or not text.strip():
        return None
    try:
        value = float(parse_duration(text))
    except (TypeError, ValueError):
        return None
    return value if value > 0 and math.isfinite(value) else None
