"""The compute's idle timeout, how long wakes keep it awake, and the known-work wake policy.

Everything here is pure: times are passed in (epoch seconds), nothing connects, so the
rules can be tested with any clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from drainer.errors import ConfigError

if TYPE_CHECKING:
    from drainer.drain.report import RunReport
    from drainer.settings import Settings

logger = logging.getLogger(__name__)

#: Idle timeout (seconds) after which each platform suspends a compute with no activity
#: (``--platform``).
PLATFORM_IDLE_TIMEOUTS: dict[str, float] = {
    "neon": 300.0,  # Neon: 5 minutes by default
    "aurora": 300.0,  # Aurora Serverless v2 at 0 ACU: SecondsUntilAutoPause default
    "relyt": 600.0,  # Relyt One, the platform of 'Postgres as a job queue': ~10 min
    "supabase": 300.0,  # branches / self-hosted scale-to-zero: set --idle-timeout to yours
    "always-on": 0.0,  # a compute that never suspends
}

#: Idle timeout assumed when neither --idle-timeout nor --platform is given: the default of
#: Neon and of Aurora Serverless v2 (SecondsUntilAutoPause).
ASSUMED_IDLE_TIMEOUT_S = PLATFORM_IDLE_TIMEOUTS["neon"]

DAY_S = 86400.0

#: Without --max-runtime, a run stops claiming after this fraction of the shortest time
#: between two wakes, so it ends well before the next wake.
DEFAULT_MAX_RUNTIME_FRACTION = 0.5
#: ... and never more than an hour (a weekly cron does not want 3.5-day drains).
DEFAULT_MAX_RUNTIME_CAP_S = 3600.0

#: ``--wake-policy``: ``always`` drains at every tick; ``known-work`` only for a reason.
WAKE_POLICIES = ("always", "known-work")
#: With known-work, the longest time without a run (``--max-sleep``): the safety net for
#: jobs inserted with no trigger.
DEFAULT_MAX_SLEEP_S = 6 * 3600.0


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


def polls_faster_than_idle(period_s: float, idle: IdleTimeout, *,
                           inclusive: bool = False) -> bool:
    """Whether activity every ``period_s`` seconds keeps the compute awake all day.

    The rule of 'Postgres as a job queue': any poll more often than the idle timeout
    keeps the compute up 24 h a day. A compute that never suspends is always awake.
    ``inclusive`` counts a period equal to the idle timeout as keeping it awake too (what
    ``drainer schedule`` refuses: a wake exactly at the timeout finds the compute still
    up).
    """
    if idle.never_suspends:
        return True
    return period_s <= idle.seconds if inclusive else period_s < idle.seconds


def max_runtime_for(gap_s: float, max_runtime: float | None, gap_name: str) -> float:
    """The max runtime of one run between wakes ``gap_s`` apart (``gap_name`` says which).

    Without ``max_runtime``: a fraction of the gap, at least 1 s, at most an hour; a given
    one must be shorter than the gap (ConfigError).
    """
    if max_runtime is None:
        return min(DEFAULT_MAX_RUNTIME_CAP_S, max(1.0, gap_s * DEFAULT_MAX_RUNTIME_FRACTION))
    if max_runtime >= gap_s:
        raise ConfigError(f"--max-runtime {fmt_seconds(max_runtime)} must be shorter than "
                          f"{gap_name}")
    return max_runtime


def covered_seconds(starts: Iterable[float], length: float, window_start: float,
                    window_end: float) -> float:
    """Length of the union of ``[s, s + length]`` for every start, clipped to the window.

    With ``length`` = drain time + idle timeout and the wake times as starts, this is how
    long the compute stays up in the window by the rules of 'Postgres as a job queue'
    (one wake keeps it up while draining, then for the idle timeout; wakes closer than
    that merge).
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
                f"{fmt_count(self.wakes_per_day)} "
                f"wake{'' if fmt_count(self.wakes_per_day) == '1' else 's'} a day → at least "
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


# -- the known-work wake policy -------------------------------------------------------------------


@dataclass
class WakeState:
    """What the process knows about the queue, to tell whether a tick has a reason to wake.

    Kept in memory only: a new process knows nothing, so its first tick drains in full.
    Times are epoch seconds. ``last_end`` is when the last run (or failed attempt) ended;
    a job the last run saw waiting (``next_due_at``: a retry, a delayed job, a snooze, a
    lease left running) wakes the tick at which it is due. ``idle_s`` says whether the
    compute is still up then (the log says so).
    """

    idle_s: float
    max_sleep_s: float
    completed: int = 0
    last_end: float | None = None
    remaining_due: int = 0
    next_due_at: float | None = None
    triggers: int = 0
    triggers_served: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def note_trigger(self) -> None:
        with self._lock:
            self.triggers += 1

    def run_started(self) -> int:
        """Call when a run starts; pass the result to :meth:`run_ended`."""
        with self._lock:
            return self.triggers

    def run_ended(self, report: RunReport, triggers_at_start: int, at: float) -> None:
        """A run completed: it saw every trigger that came before it started."""
        nxt = datetime.fromisoformat(report.next_due_at) if report.next_due_at else None
        with self._lock:
            self.completed += 1
            self.last_end = at
            self.remaining_due = report.remaining_due
            self.next_due_at = nxt.timestamp() if nxt is not None else None
            self.triggers_served = max(self.triggers_served, triggers_at_start)

    def run_failed(self, at: float) -> None:
        """A run failed (database unreachable...): what was known stays, so it is retried."""
        with self._lock:
            self.last_end = at

    def decide(self, now: float) -> tuple[bool, str]:
        """(wake?, why) for a tick at ``now``."""
        with self._lock:
            if self.completed == 0:
                if self.last_end is None:
                    return True, "start: one full drain (a new process knows nothing)"
                return True, "no complete drain yet (the last attempt failed)"
            assert self.last_end is not None
            pending = self.triggers - self.triggers_served
            if pending > 0:
                return True, (f"trigger: {pending} trigger{'' if pending == 1 else 's'} "
                              "since the last complete drain")
            if self.remaining_due > 0:
                return True, (f"due work left: the last run stopped with "
                              f"{self.remaining_due} due job"
                              f"{'' if self.remaining_due == 1 else 's'}")
            if self.next_due_at is not None and self.next_due_at <= now:
                # at once: while the compute is still up from the last run (within the idle
                # timeout) the wake costs no resume and keeps it up no longer than holding
                # the retry to the idle timeout would (that suspends it, then resumes it);
                # after, it resumes for the retry either way
                awake = now < self.last_end + self.idle_s
                return True, (f"retry due: a job the last run saw waiting came due at "
                              f"{_clock(self.next_due_at)}"
                              f"{' (the compute still up: no resume)' if awake else ''}")
            asleep = now - self.last_end
            if asleep >= self.max_sleep_s:
                return True, (f"safety net: {fmt_seconds(asleep)} since the last run "
                              f"(--max-sleep {fmt_seconds(self.max_sleep_s)})")
            nxt = ("" if self.next_due_at is None else
                   f"next job due {_clock(self.next_due_at)}; ")
            return False, (f"no known work: no trigger since the last drain, none left due; "
                           f"{nxt}safety net at "
                           f"{_clock(self.last_end + self.max_sleep_s)}")


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")
