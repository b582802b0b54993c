"""The compute's idle timeout, and how long a schedule of wakes keeps the compute awake."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from drainer.settings import PLATFORM_IDLE_TIMEOUTS

if TYPE_CHECKING:
    from drainer.settings import Settings

logger = logging.getLogger(__name__)

#: Idle timeout assumed when neither --idle-timeout nor --platform is given: the default of
#: Neon and of Aurora Serverless v2 (SecondsUntilAutoPause).
ASSUMED_IDLE_TIMEOUT_S = PLATFORM_IDLE_TIMEOUTS["neon"]

DAY_S = 86400.0


@dataclass(frozen=True)
class IdleTimeout:
    """The idle timeout in seconds (0: the compute never suspends) and where it came from."""

    seconds: float
    source: str

    @property
    def assumed(self) -> bool:
        return self.source.startswith("assumed")

    @property
    def never_suspends(self) -> bool:
        return self.seconds <= 0


def idle_timeout_of(settings: Settings) -> IdleTimeout:
    """--idle-timeout, else the --platform preset, else the assumed 300 s (said so)."""
    if settings.idle_timeout is not None:
        return IdleTimeout(settings.idle_timeout, "--idle-timeout")
    if settings.platform is not None:
        return IdleTimeout(PLATFORM_IDLE_TIMEOUTS[settings.platform],
                           f"--platform {settings.platform}")
    return IdleTimeout(ASSUMED_IDLE_TIMEOUT_S,
                       "assumed: Neon/Aurora default; set --idle-timeout or --platform")


def covered_seconds(starts: Iterable[float], length: float, window_start: float,
                    window_end: float) -> float:
    """Length of the union of ``[s, s + length]`` for every start, clipped to the window.

    With ``length`` = drain time + idle timeout and the wake times as starts, this is how
    long the compute stays up in the window by the article's rules (one wake keeps it up
    while draining, then for the idle timeout; wakes closer than that merge).
    """
    total = 0.0
    cur_start: float | None = None
    cur_end = 0.0
    for s in sorted(starts):
        a, b = max(s, window_start), min(s + length, window_end)
        if b <= a:
            continue
        if cur_start is None or a > cur_end:
            if cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = a, b
        else:
            cur_end = max(cur_end, b)
    if cur_start is not None:
        total += cur_end - cur_start
    return total


@dataclass(frozen=True)
class AwakeEstimate:
    """How long a schedule keeps the compute awake a day: per wake ≈ drain time + idle timeout.

    ``low`` counts drains as instant; ``high`` counts every drain as running its full
    ``max_runtime`` (None when there is no bound).
    """

    idle_timeout_s: float
    idle_timeout_source: str
    wakes_per_day: float
    max_drain_s: float | None
    low_s_per_day: float
    high_s_per_day: float | None

    @property
    def low_share(self) -> float:
        return min(1.0, self.low_s_per_day / DAY_S)

    @property
    def high_share(self) -> float | None:
        return None if self.high_s_per_day is None else min(1.0, self.high_s_per_day / DAY_S)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["low_share"] = round(self.low_share, 6)
        out["high_share"] = None if self.high_share is None else round(self.high_share, 6)
        return out

    def describe(self) -> str:
        """One line for people."""
        if self.idle_timeout_s <= 0:
            return (f"awake estimate: the compute never suspends ({self.idle_timeout_source}): "
                    "awake 24 h a day whatever the schedule")
        head = (f"awake estimate: per wake ≈ drain time + {fmt_seconds(self.idle_timeout_s)} "
                f"idle timeout ({self.idle_timeout_source}); "
                f"{fmt_count(self.wakes_per_day)} wakes a day → at least "
                f"{fmt_seconds(self.low_s_per_day)} a day awake ({fmt_share(self.low_share)})")
        if self.high_s_per_day is not None and self.max_drain_s is not None:
            assert self.high_share is not None
            head += (f", at most {fmt_seconds(self.high_s_per_day)} "
                     f"({fmt_share(self.high_share)}) if every drain runs its full "
                     f"--max-runtime of {fmt_seconds(self.max_drain_s)}")
        return head


def estimate_from_wakes(wakes: list[float], start: float, window_s: float, idle: IdleTimeout,
                        max_drain_s: float | None) -> AwakeEstimate:
    """Estimate from the wake times (epoch seconds) in the window ``[start, start + window_s)``."""
    if not wakes:
        return AwakeEstimate(idle.seconds, idle.source, 0.0, max_drain_s, 0.0,
                             None if max_drain_s is None else 0.0)
    end = start + window_s
    scale = DAY_S / window_s
    if idle.never_suspends:
        return AwakeEstimate(idle.seconds, idle.source, len(wakes) * scale, max_drain_s,
                             DAY_S, DAY_S if max_drain_s is not None else None)
    low = covered_seconds(wakes, idle.seconds, start, end) * scale
    high = None
    if max_drain_s is not None:
        high = covered_seconds(wakes, idle.seconds + max_drain_s, start, end) * scale
    return AwakeEstimate(idle.seconds, idle.source, len(wakes) * scale, max_drain_s,
                         min(low, DAY_S), None if high is None else min(high, DAY_S))


def estimate_interval(interval_s: float, jitter_s: float, idle: IdleTimeout,
                      max_drain_s: float | None) -> AwakeEstimate:
    """Estimate for wakes every ``interval_s`` plus a random 0..``jitter_s`` delay."""
    gap = interval_s + jitter_s / 2  # APScheduler adds the jitter to the previous wake
    wakes = DAY_S / gap
    if idle.never_suspends:
        return AwakeEstimate(idle.seconds, idle.source, wakes, max_drain_s, DAY_S,
                             DAY_S if max_drain_s is not None else None)
    low = min(1.0, idle.seconds / gap) * DAY_S
    high = None if max_drain_s is None else min(1.0, (idle.seconds + max_drain_s) / gap) * DAY_S
    return AwakeEstimate(idle.seconds, idle.source, wakes, max_drain_s, low, high)


def fmt_seconds(s: float) -> str:
    """``0.4 s``, ``42 s``, ``5.0 min``, ``3.2 h``."""
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def fmt_share(share: float) -> str:
    if share >= 0.9995:
        return "100% of the day"
    pct = share * 100
    return f"{pct:.2f}% of the day" if pct < 1 else f"{pct:.1f}% of the day"


def fmt_count(n: float) -> str:
    return f"{n:.0f}" if n >= 10 or n == int(n) else f"{n:.1f}"
