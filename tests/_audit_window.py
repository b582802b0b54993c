"""An audit window the audit page's tests render: 60 s sampled every 0.5 s under a 10 s
idle timeout, a query at 5 s, a poller every second from 20 s to 30 s and an idle pool
connection throughout (awake 5-15 s and 19.9-40 s, asleep otherwise)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from drainer.audit import Activity, AuditResult, Sample, SessionFilter, SessionRow, judge
from drainer.waking import IdleTimeout

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
IDLE = IdleTimeout(10.0, "--idle-timeout")


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def _row(pid: int, changed: float, *, app: str = "app", state: str = "idle",
         started: float = -7200.0) -> SessionRow:
    return SessionRow(pid, at(started), "client backend", "db", "alice", app, "10.0.0.5",
                      state, at(changed), at(changed - 0.01), None, "SELECT 1")


def a_window() -> AuditResult:
    """The window of the module's docstring, judged."""
    samples = []
    for i in range(121):
        t = i * 0.5
        last = 5.0 if t >= 5 else -3600.0
        rows = [_row(1, last, app="report <cron>"), _row(2, -3600.0, app="pool")]
        if 20 <= t <= 30:
            rows.append(_row(3, float(int(t)) + 0.01, app="poller", started=19.9))
        samples.append(Sample(at(t), tuple(rows)))
    return judge(Activity(samples, samples[0].at, samples[-1].at, 0.5, SessionFilter()),
                 IDLE)
