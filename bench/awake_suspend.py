"""bench.awake through bench.suspend: workloads as plans, the least possible awake time,
wasted resumes and latency after due, and the table they make.

The least possible awake time of a workload (for an idle timeout T): the union, over the
instants ``d`` at which jobs come due (enqueued, delayed to, retried at when each first
attempt ran at its due time, recurring occurrences), of ``[d, d + drain + T]``, with the
producer floor (the union over producer sessions of ``[opened, closed + T]``): a drainer
that ran every job at its due time, in one drain of ``drain`` seconds, and let the compute
suspend T later, could not keep the compute up less; wakes due within T of each other
form one group, which the union merges.

A resume is wasted when nothing came of it: in its awake period (the end of its cold
start to its suspend) no producer session ran (application_name ``bench-producer``), no
handler ran (the apps' attempt log) and no job finished (the table's ``finished_at``: a
drain that resumes the compute to write the outcomes of handlers that ran while it slept
is not wasted). A drainer that reconnects after a cut to wait, a safety-net drain that
finds nothing, a poll: wasted. The simulator sees sessions, not jobs, so the count is
made here from what the benchmark knows.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from bench.suspend import Period
from drainer.cron import iter_fire_times

PRODUCER = "bench-producer"


@dataclass(frozen=True)
class Burst:
    """One producer's transaction: ``at`` and ``delay`` are fractions of the window."""

    name: str
    at: float
    jobs: int
    triggered: bool
    failing: int = 0  # the first ``failing`` jobs fail their first attempt
    delayed: int = 0  # the last ``delayed`` jobs have run_at = now + delay x window
    delay: float = 0.0
    sleep: float = 0.0  # seconds each handler waits (the long workload)

    def describe(self, window: float) -> str:
        parts = [f"{self.name} at {self.at * window:.0f} s: {self.jobs} jobs "
                 f"{'+ trigger' if self.triggered else 'plain SQL, no trigger'}"]
        if self.failing:
            parts.append(f"{self.failing} failing once")
        if self.delayed:
            parts.append(f"{self.delayed} delayed {self.delay * window:.0f} s")
        if self.sleep:
            parts.append(f"handlers of {self.sleep:g} s")
        return ", ".join(parts)


#: --workload hard: bursts of 200 (10% failing once, some delayed), plain-SQL inserts, and
#: a recurring definition (HARD_CRON) beside them.
HARD_WORKLOAD = (
    Burst("A", 20 / 300, 200, True, failing=20),
    Burst("P", 60 / 300, 20, False),
    Burst("B", 110 / 300, 200, True, failing=20, delayed=20, delay=30 / 300),
    Burst("C", 200 / 300, 200, True, failing=20, delayed=20, delay=45 / 300),
)
HARD_CRON = "*/2 * * * *"
#: --workload long: 10 handlers of 60 s that do not touch the database, run at once
#: (the drainer contenders get --concurrency 10).
LONG_WORKLOAD = (Burst("L", 10 / 420, 10, True, sleep=60.0),)
LONG_CONCURRENCY = 10


def due_instants(bursts: Sequence[Burst], start: float, window: float, retry_wait: float,
                 cron: str | None = None) -> list[float]:
    """When the workload's jobs come due (time.time()), each first attempt assumed to run
    at its due time: enqueued or delayed to, retried at, recurring occurrences; and, for
    handlers that wait (``sleep``: the long workload), when they end: their outcomes are
    written then (the compute may sleep while they work, not while they are written)."""
    out: list[float] = []
    for b in bursts:
        at = start + b.at * window
        immediate = b.jobs - b.delayed
        starts = ([at] if immediate else []) + ([at + b.delay * window] if b.delayed else [])
        out += starts
        if b.sleep:
            out += [s + b.sleep for s in starts]
        if b.failing:
            out.append(at + b.sleep + retry_wait)
            if b.sleep:
                out.append(at + 2 * b.sleep + retry_wait)
    if cron:
        after = datetime.fromtimestamp(start, timezone.utc)
        for t in iter_fire_times(cron, timezone.utc, after):
            if t.timestamp() > start + window:
                break
            out.append(t.timestamp())
    return sorted(out)


def union_seconds(intervals: Iterable[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] covered by the intervals."""
    total, cur = 0.0, None
    for a, b in sorted((max(a, start), min(b, end)) for a, b in intervals):
        if b <= a:
            continue
        if cur is not None and a <= cur[1]:
            cur = (cur[0], max(cur[1], b))
            continue
        if cur is not None:
            total += cur[1] - cur[0]
        cur = (a, b)
    return total + (cur[1] - cur[0] if cur is not None else 0.0)


def least_awake(due: Sequence[float], producers: Iterable[tuple[float, float]], drain: float,
                idle: float, start: float, end: float) -> float:
    """The least possible awake seconds in [start, end] (see the module)."""
    return union_seconds([(d, d + drain + idle) for d in due]
                         + [(a, b + idle) for a, b in producers], start, end)


def read_attempts(path: Path) -> list[tuple[float, float]]:
    """(started, ended) of every handler call the app recorded."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2:
            out.append((float(parts[0]), float(parts[1])))
    return out


def wasted(periods: Sequence[Period], attempts: Sequence[tuple[float, float]],
           finished: Sequence[float], start: float, end: float) -> list[Period]:
    """The resumes in [start, end] that nothing came of (see the module)."""
    out = []
    for p in periods:
        if p.cause is None or not start <= p.resumed_at <= end:
            continue
        a = p.ready_at if p.ready_at is not None else p.resumed_at
        b = p.suspended_at if p.suspended_at is not None else end
        if any(s.application_name == PRODUCER for s in p.sessions):
            continue
        if any(s <= b and e >= a for s, e in attempts):
            continue
        if any(a <= f <= b for f in finished):  # outcomes of handlers that ran while it slept
            continue
        out.append(p)
    return out


@dataclass
class Latency:
    """Seconds from due to finished: ``finished_at - max(run_at, created_at)``."""

    median: float | None
    p95: float | None
    max: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Latency:
        if not values:
            return cls(None, None, None)
        ordered = sorted(values)
        p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
        return cls(round(statistics.median(ordered), 3), round(p95, 3), round(ordered[-1], 3))

    def text(self) -> str:
        if self.median is None:
            return "—"
        return f"{self.median:.2f} / {self.p95:.2f} / {self.max:.2f}"
