"""The audit's rules on made-up samples (the real sessions are in tests/integration)."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from drainer.audit import Activity, Sample, SessionFilter, SessionRow, judge
from drainer.cli.status import render_audit
from drainer.waking import IdleTimeout, covered_seconds

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
IDLE3 = IdleTimeout(3.0, "--idle-timeout")


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def row(pid: int, state: str | None = "idle", *, changed: float = -3600.0,
        query: str = "SELECT * FROM orders", started: float = -7200.0,
        kind: str = "client backend", app: str = "app", xact: float | None = None
        ) -> SessionRow:
    return SessionRow(pid, at(started), kind, "db", "alice", app, "10.0.0.5", state,
                      at(changed), at(changed - 0.01), None if xact is None else at(xact),
                      query)


def activity(per_sample: dict[float, list[SessionRow]]) -> Activity:
    samples = [Sample(at(t), tuple(rows)) for t, rows in sorted(per_sample.items())]
    return Activity(samples, samples[0].at, samples[-1].at, 0.5, SessionFilter())


def ticks(duration: float = 6.0) -> list[float]:
    return [i * 0.5 for i in range(int(duration / 0.5) + 1)]


def test_an_idle_session_lets_the_compute_suspend() -> None:
    r = judge(activity({t: [row(1)] for t in ticks()}), IDLE3)
    assert r.could_suspend
    (s,) = r.sessions
    assert not s.keeps_awake and s.reason.startswith("idle for")
    # quiet since its last state change, an hour before the audit began
    assert r.longest_quiet_gap_s == 3606.0
    assert r.awake_s == 0.0
    # the headline is the window's: not "quiet for 60.1 min" over 6 s of sampling
    assert r.verdict.startswith("could suspend: quiet for the whole 6.0 s window (and since "
                                "11:00:00 before it: 60.1 min), longer than the 3.0 s"), \
        r.verdict
    assert "longest quiet gap: 60.1 min (from 2026-11-30T11:00:00+00:00, before the " \
        "window)" in render_audit(r)
    # shorter than the idle timeout, the window alone cannot say it: the quiet before it
    r = judge(activity({t: [row(1)] for t in ticks()}), IdleTimeout(300.0, "--idle-timeout"))
    assert r.could_suspend and "quiet for the whole 6.0 s window (and since 11:00:00 " \
        "before it: 60.1 min), longer than the 5.0 min idle timeout" in r.verdict, r.verdict


def test_a_poller_keeps_it_awake() -> None:
    per: dict[float, list[SessionRow]] = {}
    for t in ticks():
        last_poll = math.floor(t - 0.25) + 0.25  # polls at k + 0.25 s, 10 ms each
        per[t] = [row(1, changed=last_poll + 0.01), row(2)]
    r = judge(activity(per), IDLE3)
    assert not r.could_suspend
    poller = next(s for s in r.sessions if s.pid == 1)
    assert poller.keeps_awake and poller.reason == "polls about every 1.0 s"
    assert r.longest_quiet_gap_s < 3
    assert "1 of 2 session(s)" in r.verdict


def test_a_poller_slower_than_the_idle_timeout_does_not() -> None:
    per = {t: [row(1, changed=4.0 * math.floor((t - 0.25) / 4) + 0.26)] for t in ticks(12)}
    r = judge(activity(per), IDLE3)
    (s,) = r.sessions
    assert not s.keeps_awake and "slower than the idle timeout" in s.reason
    assert r.could_suspend and r.longest_quiet_gap_s >= 3


def test_health_checks_are_named() -> None:
    per = {t: [row(1, changed=math.floor(t - 0.25) + 0.26, query="SELECT 1")]
           for t in ticks()}
    (s,) = judge(activity(per), IDLE3).sessions
    assert s.keeps_awake and s.reason == "health checks about every 1.0 s"


def test_idle_in_transaction_keeps_it_awake_for_as_long_as_it_lasts() -> None:
    per = {t: [row(1, "idle in transaction", changed=0.0, xact=0.0)] for t in ticks()}
    r = judge(activity(per), IDLE3)
    (s,) = r.sessions
    assert s.keeps_awake and s.reason == "idle in transaction 6 s"
    assert not r.could_suspend and r.awake_s == 6.0


def test_an_active_query_keeps_it_awake() -> None:
    per = {t: [row(1, "active", changed=-10.0, query="SELECT pg_sleep(60)")] for t in ticks()}
    (s,) = judge(activity(per), IDLE3).sessions
    assert s.keeps_awake and s.reason.startswith("active query")
    assert s.query == "SELECT pg_sleep(60)"


def test_autovacuum_and_replication_count() -> None:
    av = row(7, "active", kind="autovacuum worker", app="",
             query="autovacuum: VACUUM public.jobs")
    ws = row(8, "active", kind="walsender", app="sub1", query="START_REPLICATION")
    r = judge(activity({t: [av, ws] for t in ticks()}), IDLE3)
    reasons = {s.pid: (s.keeps_awake, s.reason) for s in r.sessions}
    assert reasons == {7: (True, "autovacuum"), 8: (True, "replication")}
    assert not r.could_suspend


def test_a_finished_autovacuum_no_longer_counts() -> None:
    av = row(7, "active", kind="autovacuum worker", app="", query="autovacuum: VACUUM x")
    per = {t: ([av] if t < 1 else []) for t in ticks(6)}
    r = judge(activity(per), IDLE3)
    (s,) = r.sessions
    assert not s.keeps_awake and s.reason == "autovacuum (finished)"
    assert r.could_suspend and r.longest_quiet_gap_s >= 5


def test_reconnecting_clients_show_up() -> None:
    # a client that connects every 1.5 s, runs one query and stays 0.6 s
    per: dict[float, list[SessionRow]] = {t: [] for t in ticks()}
    for k in range(4):
        start = 0.2 + 1.5 * k
        for t in per:
            if start <= t <= start + 0.6:
                per[t].append(row(100 + k, changed=start + 0.02, started=start,
                                  app="cron-poller"))
    r = judge(activity(per), IDLE3)
    (c,) = r.reconnecting_clients
    assert c.keeps_awake and c.reason.startswith("reconnects about every 1.5 s")
    assert c.new_connections == 4 and len(c.pids) == 4
    assert not r.could_suspend
    table = render_audit(r)
    assert "4 pids" in table and "(reconnecting)" in table


def test_sessions_that_together_leave_no_quiet_gap() -> None:
    # four sessions, two queries each, one after the other: none of them polls, none is
    # busy at the end, yet the compute never gets 3 s of quiet in 8 s
    per: dict[float, list[SessionRow]] = {}
    for t in ticks(8):
        rows = []
        for k in range(4):
            queries = [q for q in (2 * k + 0.2, 2 * k + 1.2) if q <= t]
            rows.append(row(10 + k, changed=queries[-1] if queries else -600.0))
        per[t] = rows
    r = judge(activity(per), IDLE3)
    assert not any(s.keeps_awake for s in r.sessions)
    assert r.longest_quiet_gap_s == 600.2  # before the audit began: quiet for 10 min
    assert not r.could_suspend and "several sessions" in r.verdict
    assert "longest 1.0 s" in r.verdict


def test_quiet_gap_and_suspend_estimate() -> None:
    # one query at 1.0 s, nothing else: quiet for 5 s afterwards
    per = {t: [row(1, changed=(1.0 if t >= 1.0 else -100.0))] for t in ticks()}
    r = judge(activity(per), IDLE3)
    assert r.could_suspend
    assert r.longest_quiet_gap_s == 101.0  # before the query: quiet since -100 s
    assert r.last_activity_at == at(1.0).isoformat()
    assert r.suspend_estimate_at == at(4.0).isoformat()
    assert r.awake_s == 3.0
    assert r.verdict.startswith("could suspend: quiet for 5.0 s of the 6.0 s window "
                                "(12:00:01 .. 12:00:06), longer than"), r.verdict
    # an idle timeout only the quiet before the window reaches: said to be before it
    r = judge(activity(per), IdleTimeout(60.0, "--idle-timeout"))
    assert r.could_suspend and r.verdict.startswith(
        "could suspend: quiet since 11:58:20 (before the window) until 12:00:01: 101 s, "
        "longer than the 60 s idle timeout"), r.verdict


def test_always_on_compute() -> None:
    r = judge(activity({t: [row(1)] for t in ticks()}), IdleTimeout(0.0, "--platform "
                                                                     "always-on"))
    assert not r.could_suspend and "never suspends" in r.verdict


def test_long_queries_are_shortened_in_the_report() -> None:
    long_q = "SELECT " + ", ".join(f"column_{i}" for i in range(40)) + "\n FROM t"
    r = judge(activity({t: [replace(row(1), query=long_q)] for t in ticks()}), IDLE3)
    q = r.sessions[0].query
    assert q is not None and len(q) == 60 and q.endswith("…") and "\n" not in q


def test_covered_seconds_merges_overlaps() -> None:
    assert covered_seconds([0, 1, 10], 3, 0, 20) == 7
    assert covered_seconds([0, 1, 10], 3, 2, 11) == 3
    assert covered_seconds([], 3, 0, 20) == 0


def test_sessions_hidden_from_an_unprivileged_user_are_said_to_be() -> None:
    # what PostgreSQL 15 shows: pid, database and user, nothing else
    hidden = SessionRow(5, None, "unknown", "db", "bob", "", None, None, None, None, None,
                        "<insufficient privilege>")
    r = judge(activity({t: [hidden] for t in ticks()}), IDLE3)
    (s,) = r.sessions
    assert s.reason.startswith("hidden") and not s.keeps_awake
    assert "pg_read_all_stats" in r.verdict
    assert r.awake_s == 0.0


def test_connections_between_samples_are_counted() -> None:
    # a client connecting every 2 s for a few ms: never in a sample, only in the counter
    samples = []
    for t in ticks(8):
        opened = int((t + 1.75) // 2)  # connections at 0.25, 2.25, 4.25, 6.25
        samples.append(Sample(at(t), (), {"app": 100 + opened, "other": 7}))
    act = Activity(samples, samples[0].at, samples[-1].at, 0.5, SessionFilter(), "on")
    r = judge(act, IDLE3)
    (u,) = r.unseen_connections
    assert u.database == "app" and u.connections == 4
    assert u.keeps_awake and u.reason == "4 short connections between samples, about " \
        "every 2.0 s"
    assert u.counted_at[0] == at(0.5).isoformat()  # the sample after it
    assert not r.could_suspend
    assert "(unseen)" in render_audit(r)
    # with a 1 s idle timeout the same client lets the compute suspend between connections
    r1 = judge(act, IdleTimeout(1.0, "--idle-timeout"))
    assert r1.could_suspend and not r1.unseen_connections[0].keeps_awake


def test_connections_the_samples_saw_are_not_counted_twice() -> None:
    samples = []
    for t in ticks(4):
        rows = (row(9, changed=1.1, started=1.0),) if 1.0 <= t <= 2.0 else ()
        samples.append(Sample(at(t), rows, {"db": 50 + (1 if t >= 1.5 else 0)}))
    r = judge(Activity(samples, samples[0].at, samples[-1].at, 0.5, SessionFilter(), "on"),
              IDLE3)
    assert r.unseen_connections == []
    assert len(r.sessions) == 1
