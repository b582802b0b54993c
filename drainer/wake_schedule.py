"""When ``drainer schedule`` wakes, whether its wakes let the compute suspend, and how long
they keep it awake under each wake policy (pure: nothing here imports APScheduler or
connects, so ``--dry-run`` shows what would run).

A schedule is an interval or a cron expression (:mod:`drainer.cron` computes the fire
times, :mod:`drainer.scheduler` fires on them); the idle timeout and the estimate's rules
are :mod:`drainer.waking`'s.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import TYPE_CHECKING

from drainer.cron import CronExpr, iter_fire_times, next_fire_times, parse_cron
from drainer.errors import ConfigError
from drainer.recurring import occurrence_times
from drainer.waking import (
    AwakeEstimate,
    IdleTimeout,
    estimate_from_wakes,
    estimate_interval,
    fmt_seconds,
    max_runtime_for,
    polls_faster_than_idle,
)

if TYPE_CHECKING:
    from drainer.recurring import Definition

#: ``schedule --wake-policy known-work`` with no --interval or --cron looks at what it
#: knows this often: a look connects to nothing, and a retry or a recurring occurrence that
#: comes due is drained within this long.
KNOWN_WORK_TICK_S = 1.0

#: Cron schedules are examined over this window (gaps, wakes a day).
CRON_HORIZON_S = 7 * 86400.0
CRON_MAX_FIRES = 20_000

_UTC = timezone.utc
_TICK = timedelta(microseconds=1)


def _window(fires: Sequence[float], start: float) -> float:
    """The seconds from ``start`` that fire times found over the horizon stand for: the
    horizon, or up to the last one when the search stopped at CRON_MAX_FIRES."""
    if len(fires) >= CRON_MAX_FIRES:
        return (fires[-1] - start) or 1.0
    return CRON_HORIZON_S


@dataclass(frozen=True)
class WakeSchedule:
    """When to wake: every ``interval`` seconds (first wake at start) or on a cron expression.

    ``jitter`` delays each wake by a random 0..jitter seconds. With an interval, APScheduler
    counts the next wake from the previous (delayed) one, so two wakes are never closer
    than the interval; with cron, each wake is delayed from its cron time.
    """

    interval: float | None = None
    cron: str | None = None
    jitter: float = 0.0
    timezone: tzinfo | None = None
    #: Said after the schedule in :meth:`describe` (why these ticks, when drainer chose them).
    note: str = ""

    def __post_init__(self) -> None:
        if (self.interval is None) == (self.cron is None):
            raise ConfigError(
                "give either --interval SECONDS or --cron 'm h dom mon dow': when to wake and "
                "drain (--wake-policy known-work needs neither: it wakes for the work it "
                "knows of)" if self.interval is None else
                "give either --interval SECONDS or --cron 'm h dom mon dow', not both")
        if self.interval is not None and self.interval <= 0:
            raise ConfigError("--interval must be more than 0 seconds")
        if self.jitter < 0:
            raise ConfigError("--jitter must not be negative")
        if self.cron is not None:
            try:
                parse_cron(self.cron)
            except ValueError as exc:
                raise ConfigError(f"--cron {self.cron!r}: {exc}") from None

    @property
    def tz(self) -> tzinfo:
        if self.timezone is not None:
            return self.timezone
        from tzlocal import get_localzone

        return get_localzone()

    @property
    def cron_expr(self) -> CronExpr:
        assert self.cron is not None
        return parse_cron(self.cron)

    def describe(self) -> str:
        jit = f" + up to {fmt_seconds(self.jitter)} jitter" if self.jitter else ""
        note = f" ({self.note})" if self.note else ""
        if self.interval is not None:
            return f"every {fmt_seconds(self.interval)}{jit}, first wake at start{note}"
        return f"cron {self.cron!r} ({self.tz}){jit}{note}"

    def next_wakes(self, n: int, now: datetime | None = None) -> list[datetime]:
        """The next ``n`` wakes before jitter (with an interval, the first is ``now``)."""
        now = now or datetime.now(self.tz)
        if self.interval is not None:
            return [now + timedelta(seconds=self.interval * k) for k in range(n)]
        return next_fire_times(self.cron_expr, self.tz, now.astimezone(_UTC) - _TICK, n)

    def _cron_fires(self, now: datetime) -> list[float]:
        """Fire times (epoch seconds: aware datetimes of one zone subtract and compare by
        the wall clock, which a DST change makes wrong) in the horizon from ``now``."""
        end = now.timestamp() + CRON_HORIZON_S
        fires = (t.timestamp() for t in
                 iter_fire_times(self.cron_expr, self.tz, now.astimezone(_UTC) - _TICK))
        return list(itertools.islice(itertools.takewhile(lambda t: t < end, fires),
                                     CRON_MAX_FIRES))

    def min_gap(self, now: datetime | None = None) -> float:
        """The shortest time in seconds between two wakes (cron: over the next week)."""
        if self.interval is not None:
            return self.interval
        fires = self._cron_fires(now or datetime.now(self.tz))
        gaps = [b - a for a, b in itertools.pairwise(fires)]
        if not gaps:
            return CRON_HORIZON_S
        return max(0.0, min(gaps) - self.jitter)

    def estimate(self, idle: IdleTimeout, max_drain_s: float | None,
                 now: datetime | None = None) -> AwakeEstimate:
        """How long these wakes keep the compute awake a day (see drainer.waking)."""
        if self.interval is not None:
            return estimate_interval(self.interval, self.jitter, idle, max_drain_s)
        now = now or datetime.now(self.tz)
        fires = self._cron_fires(now)
        return estimate_from_wakes([f + self.jitter / 2 for f in fires], now.timestamp(),
                                   _window(fires, now.timestamp()), idle, max_drain_s)


def check_schedule(wakes: WakeSchedule, idle: IdleTimeout, max_runtime: float | None, *,
                   allow_always_on: bool, policy: str = "always",
                   max_sleep: float | None = None) -> float:
    """Refuse schedules that keep the compute awake; return the max runtime of one run.

    With ``known-work`` a tick that finds no reason does not connect, so ticks may come
    as often as you like; what wakes an idle compute is the safety net, so it is
    ``--max-sleep`` that must be longer than the idle timeout, and it bounds a run.
    """
    if policy == "known-work":
        assert max_sleep is not None
        if (not idle.never_suspends and not allow_always_on
                and polls_faster_than_idle(max_sleep, idle, inclusive=True)):
            raise ConfigError(
                f"--max-sleep {fmt_seconds(max_sleep)} is not longer than the "
                f"{fmt_seconds(idle.seconds)} idle timeout ({idle.source}): the safety net "
                "alone would keep the compute awake; use a longer --max-sleep, or pass "
                "--allow-always-on")
        return max_runtime_for(max_sleep, max_runtime, f"--max-sleep {fmt_seconds(max_sleep)}")
    gap = wakes.min_gap()
    # a compute that never suspends has nothing to keep asleep
    if (not idle.never_suspends and not allow_always_on
            and polls_faster_than_idle(gap, idle, inclusive=True)):
        limit = f"the {fmt_seconds(idle.seconds)} idle timeout ({idle.source})"
        if wakes.interval is not None:
            raise ConfigError(
                f"--interval {fmt_seconds(gap)} is not longer than {limit}: the compute "
                "would never suspend (awake 24 h a day); use a longer interval, or pass "
                "--allow-always-on")
        raise ConfigError(
            f"--cron {wakes.cron!r} wakes as often as every {fmt_seconds(gap)}, not longer "
            f"than {limit}: the compute would not suspend between those wakes; space them "
            "further apart, or pass --allow-always-on")
    return max_runtime_for(gap, max_runtime, f"the {fmt_seconds(gap)} between two wakes")


# -- the known-work policy's wakes ---------------------------------------------------------


def known_work_wakes(fires: Sequence[float], max_sleep_s: float, start: float, end: float
                     ) -> list[float]:
    """When ``schedule --wake-policy known-work`` wakes with no other work than the
    occurrences at ``fires``: at each one, and by the safety net (``--max-sleep`` after the
    last run) wherever they are further apart. The first wake is at ``start``."""
    wakes: list[float] = []
    last = start
    wakes.append(start)
    for f in [*sorted(f for f in fires if start < f < end), end]:
        while f - last > max_sleep_s:
            last += max_sleep_s
            if last < end:
                wakes.append(last)
        if f < end:
            wakes.append(f)
            last = f
    return wakes


def known_work_estimate(definitions: Iterable[Definition], queues: Sequence[str],
                        idle: IdleTimeout, max_sleep_s: float, max_drain_s: float | None,
                        now: datetime) -> AwakeEstimate:
    """``schedule --wake-policy known-work``'s awake estimate with the wakes the recurring
    definitions cause (one per occurrence; the safety net only in longer gaps), over the
    next week."""
    start = now.timestamp()
    end = now + timedelta(seconds=CRON_HORIZON_S)
    fires = occurrence_times(definitions, queues, now, end, CRON_MAX_FIRES)
    window = _window(fires, start)
    wakes = known_work_wakes(fires, max_sleep_s, start, start + window)
    return estimate_from_wakes(wakes[1:], start, window, idle, max_drain_s)


