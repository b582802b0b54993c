"""``drainer audit``: sample pg_stat_activity and name what keeps a serverless compute awake.

The rules are those of a compute's activity monitor as the Japanese article describes it
(it looks at the client sessions every 0.5 s):

- a session that is not idle (running a query, idle in transaction) is activity now;
- an idle session is activity as of its last state change (when its last query ended);
- a running autovacuum worker and a replication connection (walsender) keep it awake;
- a new connection is activity when it starts, even before its first query.

So an idle connection on its own lets the compute suspend (its last state change gets
older), while a client that polls more often than the idle timeout keeps it up all day.

By default every client backend of the server is examined, whatever its database: they
all run on the same compute, and any of them keeps it awake. ``--only-database``,
``--only-user`` and ``--only-application`` narrow that down. The audit's own session is
left out (it is activity too, while the audit runs: run it from where you would look).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import re
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from drainer.db import QUERIES
from drainer.settings import parse_duration
from drainer.waking import (
    IdleTimeout,
    covered_seconds,
    fmt_seconds,
    idle_timeout_of,
    polls_faster_than_idle,
)

if TYPE_CHECKING:
    import psycopg

    from drainer.settings import Settings

logger = logging.getLogger(__name__)

# The audit's statements are in sql/queries.sql (audit_*); they read the server's
# statistics views, not the jobs table, so they take no identifiers.
SAMPLE_SQL = QUERIES["audit_sample"]
COUNTERS_SQL = QUERIES["audit_session_counts"]
#: PostgreSQL version from which the session counters are used.
COUNTERS_MIN_SERVER = 150000

#: The platforms' monitors look every 0.5 s; so does the audit.
SAMPLE_INTERVAL_S = 0.5
DEFAULT_DURATION_S = 60.0
#: Query text kept per sample, and shown in the table.
QUERY_CHARS = 300
SHOWN_QUERY_CHARS = 60
#: A session "polls" when at least this many queries were seen...
POLL_MIN_QUERIES = 3
#: ...and its last one is no older than this many periods (it is still polling).
POLL_STILL_GOING_PERIODS = 2.0
#: A client "reconnects" when at least this many of its connections began during the audit.
RECONNECT_MIN_NEW = 2

#: What pg_stat_activity shows instead of another role's query without pg_read_all_stats.
HIDDEN_QUERY = "<insufficient privilege>"

_NON_IDLE = {"active", "idle in transaction", "idle in transaction (aborted)",
             "fastpath function call"}
_HEALTH_CHECK = re.compile(r"^\s*(select\s+(1|true|'ok'|version\(\)|now\(\))\s*)?;?\s*$", re.I)


@dataclass(frozen=True)
class SessionFilter:
    """Which sessions the audit looks at (None: all). Application names are LIKE patterns."""

    databases: Sequence[str] | None = None
    users: Sequence[str] | None = None
    application_names: Sequence[str] | None = None
    pids: Sequence[int] | None = None

    def params(self) -> dict[str, Any]:
        def lst(v: Sequence[Any] | None) -> list[Any] | None:
            return None if v is None else list(v)

        return {"databases": lst(self.databases), "users": lst(self.users),
                "applications": lst(self.application_names), "pids": lst(self.pids),
                "query_chars": QUERY_CHARS}

    def as_dict(self) -> dict[str, Any]:
        return {k: (None if v is None else list(v)) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class SessionRow:
    """One row of pg_stat_activity in one sample."""

    pid: int
    backend_start: datetime | None
    backend_type: str
    datname: str | None
    usename: str | None
    application_name: str | None
    client_addr: str | None
    state: str | None
    state_change: datetime | None
    query_start: datetime | None
    xact_start: datetime | None
    query: str | None


@dataclass(frozen=True)
class Sample:
    """What pg_stat_activity showed at one instant (server clock), and the number of
    sessions ever opened per database (None when the counters are not used)."""

    at: datetime
    rows: tuple[SessionRow, ...]
    sessions: dict[str, int] | None = None


@dataclass
class Activity:
    """The raw samples of one audit, for :func:`judge` (or a benchmark) to read.

    ``counters`` says whether ``Sample.sessions`` is filled, or why not.
    """

    samples: list[Sample]
    started_at: datetime
    ended_at: datetime
    interval_s: float
    filters: SessionFilter
    counters: str = "off"


def sample_activity(settings: Settings, *, duration: float = DEFAULT_DURATION_S,
                    interval: float = SAMPLE_INTERVAL_S, filters: SessionFilter | None = None,
                    stop: threading.Event | None = None,
                    conn: psycopg.Connection[Any] | None = None) -> Activity:
    """Sample pg_stat_activity every ``interval`` seconds for ``duration`` seconds.

    Opens one connection (application_name ``<name>-audit``) unless ``conn`` is given,
    and leaves its own session out. ``stop`` ends the sampling early (a benchmark can
    sample for exactly as long as it runs something).
    """
    from drainer import db

    filters = filters or SessionFilter()
    stop = stop or threading.Event()
    own = conn is None
    if conn is None:
        conn = db.connect(settings, purpose="audit")
    samples: list[Sample] = []
    params = filters.params()
    try:
        counters = _counters_mode(conn, filters)
        use_counters = counters == "on"
        if use_counters:
            conn.execute(QUERIES["audit_flush_counters"])  # our own connect, counted now
        begin = time.monotonic()
        k = 0
        while True:
            samples.append(_take_sample(conn, params, use_counters))
            k += 1
            if stop.is_set():
                break
            next_at = begin + k * interval
            if next_at - begin > duration + 1e-9:
                break
            if stop.wait(max(0.0, next_at - time.monotonic())):
                samples.append(_take_sample(conn, params, use_counters))
                break
    finally:
        if own:
            conn.close()
    return Activity(samples, samples[0].at, samples[-1].at, interval, filters, counters)


def _counters_mode(conn: psycopg.Connection[Any], filters: SessionFilter) -> str:
    if filters.users or filters.application_names or filters.pids:
        return "off: pg_stat_database cannot be filtered by user, application or pid"
    if conn.info.server_version < COUNTERS_MIN_SERVER:
        return "unavailable: needs PostgreSQL 15 (pg_stat_force_next_flush)"
    return "on"


def _take_sample(conn: psycopg.Connection[Any], params: dict[str, Any],
                 counters: bool) -> Sample:
    # one transaction a sample: one snapshot, and exactly one transaction of our own
    with conn.transaction():
        rows = conn.execute(SAMPLE_SQL, params).fetchall()
        sessions: dict[str, int] | None = None
        at: datetime | None = rows[0][0] if rows else None
        if counters:
            crow = conn.execute(COUNTERS_SQL, params).fetchall()
            sessions = {r[1]: int(r[2] or 0) for r in crow}
            at = at or (crow[0][0] if crow else None)
        if at is None:
            one = conn.execute(QUERIES["audit_clock"]).fetchone()
            assert one is not None
            at = one[0]
    assert at is not None
    return Sample(at, tuple(SessionRow(*r[1:]) for r in rows), sessions)


# -- judging --------------------------------------------------------------------------------------


@dataclass
class SessionFinding:
    """One backend (pid + backend_start) and whether it keeps the compute awake, and why."""

    pid: int
    application_name: str | None
    user: str | None
    database: str | None
    client_addr: str | None
    backend_type: str
    backend_start: str | None
    state: str | None
    query: str | None
    keeps_awake: bool
    reason: str
    poll_interval_s: float | None
    queries_seen: int
    first_seen: str
    last_seen: str
    connected_at_end: bool
    last_activity_at: str | None


@dataclass
class ClientFinding:
    """A client (database, user, application, address) that opened new connections again
    and again during the audit: each new connection is activity."""

    application_name: str | None
    user: str | None
    database: str | None
    client_addr: str | None
    connections: int
    new_connections: int
    reconnect_interval_s: float | None
    keeps_awake: bool
    reason: str
    pids: list[int]


@dataclass
class UnseenFinding:
    """Connections to one database that opened and closed between two samples: only the
    database's session counter saw them. Each is activity (when it was counted)."""

    database: str
    connections: int
    interval_s: float | None
    keeps_awake: bool
    reason: str
    counted_at: list[str]


@dataclass
class AuditResult:
    """The verdict of an audit: could the compute suspend, and what keeps it awake."""

    could_suspend: bool
    verdict: str
    idle_timeout_s: float
    idle_timeout_source: str
    started_at: str
    ended_at: str
    duration_s: float
    samples: int
    longest_quiet_gap_s: float
    longest_quiet_gap_from: str | None
    longest_quiet_gap_to: str | None
    last_activity_at: str | None
    suspend_estimate_at: str | None
    awake_s: float
    sessions: list[SessionFinding]
    reconnecting_clients: list[ClientFinding]
    unseen_connections: list[UnseenFinding]
    counters: str
    filters: dict[str, Any]
    activity_times: list[str] = field(default_factory=list, repr=False)

    @property
    def keeping_awake(self) -> list[SessionFinding | ClientFinding | UnseenFinding]:
        return [*(s for s in self.sessions if s.keeps_awake),
                *(c for c in self.reconnecting_clients if c.keeps_awake),
                *(u for u in self.unseen_connections if u.keeps_awake)]

    def as_dict(self, *, with_activity_times: bool = False) -> dict[str, Any]:
        out = asdict(self)
        if not with_activity_times:
            out.pop("activity_times")
        return out


@dataclass
class _Track:
    first: SessionRow
    first_seen: datetime
    last: SessionRow
    last_seen: datetime
    seen: int = 0
    query_starts: set[datetime] = field(default_factory=set)
    activity: set[datetime] = field(default_factory=set)
    non_idle: dict[str, float] = field(default_factory=dict)  # state -> longest seen, s


def _activity_of(row: SessionRow, at: datetime) -> datetime | None:
    """When this row says the compute last had activity from this session."""
    if row.query == HIDDEN_QUERY and row.state is None:
        return None  # another role's session we may not look into
    if row.backend_type != "client backend":
        return at  # autovacuum worker, walsender: activity now
    if row.state in _NON_IDLE:
        return at
    if row.state == "idle":
        return row.state_change
    return row.backend_start  # state unknown: still starting, or hidden from us


def shorten(query: str | None, limit: int = SHOWN_QUERY_CHARS) -> str | None:
    """The query on one line, cut to ``limit`` characters."""
    if query is None:
        return None
    text = " ".join(query.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def _period(times: Sequence[datetime]) -> float | None:
    ts = sorted(times)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(ts)]
    gaps = [g for g in gaps if g > 0]
    return statistics.median(gaps) if gaps else None


@dataclass(frozen=True)
class _Repeats:
    """Activity that came again and again (queries, reconnects, short connections): its
    median period, and whether it was still going at the end of the audit."""

    period: float | None
    going: bool

    @classmethod
    def of(cls, times: Sequence[datetime], end: datetime, min_count: int) -> _Repeats:
        period = _period(times) if len(times) >= min_count else None
        going = period is not None and (end - max(times)).total_seconds() <= max(
            POLL_STILL_GOING_PERIODS * period, period + 1.0)
        return cls(period, going)

    def keeps_awake(self, idle: IdleTimeout) -> bool:
        """The article's rule: a poll more often than the idle timeout keeps it up all day."""
        return (self.going and self.period is not None
                and polls_faster_than_idle(self.period, idle))


def _fmt_every(s: float) -> str:
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"


def judge(activity: Activity, idle: IdleTimeout) -> AuditResult:
    """Apply the rules to the samples and say whether the compute could suspend."""
    start, end = activity.started_at, activity.ended_at
    tracks: dict[tuple[int, datetime | None], _Track] = {}
    last_sample_keys: set[tuple[int, datetime | None]] = set()
    for n, sample in enumerate(activity.samples):
        for row in sample.rows:
            key = (row.pid, row.backend_start)
            tr = tracks.get(key)
            if tr is None:
                tr = tracks[key] = _Track(row, sample.at, row, sample.at)
            tr.last, tr.last_seen = row, sample.at
            tr.seen += 1
            if row.query_start is not None and row.backend_type == "client backend":
                tr.query_starts.add(row.query_start)
            when = _activity_of(row, sample.at)
            if when is not None:
                tr.activity.add(when)
            if row.backend_start is not None and row.backend_start >= start:
                tr.activity.add(row.backend_start)
            if row.backend_type == "client backend" and row.state in _NON_IDLE:
                since = row.state_change or row.query_start or sample.at
                held = max(0.0, (sample.at - since).total_seconds())
                tr.non_idle[row.state or "?"] = max(tr.non_idle.get(row.state or "?", 0.0),
                                                    held)
            if n == len(activity.samples) - 1:
                last_sample_keys.add(key)

    sessions = [_judge_session(tr, tr_key in last_sample_keys, end, idle, activity.interval_s)
                for tr_key, tr in sorted(tracks.items(), key=lambda kv: kv[1].first_seen)]
    clients = _judge_clients(tracks, start, end, idle)
    unseen, unseen_times = _judge_unseen(activity, tracks, end, idle)

    instants = sorted({t for tr in tracks.values() for t in tr.activity} | unseen_times)
    gap, gap_from, gap_to = _longest_quiet_gap(instants, start, end)
    inside_gap = _longest_quiet_gap([t for t in instants if t > start], start, end)[0]
    last_activity = max((t for t in instants if t <= end), default=None)
    window = (end - start).total_seconds()
    awake = (window if idle.never_suspends else covered_seconds(
        [t.timestamp() for t in instants], idle.seconds, start.timestamp(), end.timestamp()))

    keeping = [*(s for s in sessions if s.keeps_awake), *(c for c in clients if c.keeps_awake),
               *(u for u in unseen if u.keeps_awake)]
    suspend_at: datetime | None = None
    if idle.never_suspends:
        could, verdict = False, (f"the compute never suspends ({idle.source}): nothing to "
                                 "keep asleep")
    elif keeping:
        could = False
        verdict = (f"keeps the compute awake: {len(keeping)} of "
                   f"{len(sessions) + len(clients) + len(unseen)} session(s)/clients "
                   f"with a {fmt_seconds(idle.seconds)} "
                   f"idle timeout ({idle.source}); longest quiet gap "
                   f"{fmt_seconds(gap)}")
    elif window >= idle.seconds and inside_gap < idle.seconds:
        could = False
        verdict = (f"keeps the compute awake: activity from several sessions left no quiet "
                   f"gap of {fmt_seconds(idle.seconds)} in {fmt_seconds(window)} of sampling "
                   f"(longest {fmt_seconds(inside_gap)})")
    else:
        could = True
        suspend_at = (last_activity or start) + timedelta(seconds=idle.seconds)
        if gap >= idle.seconds:
            verdict = (f"could suspend: quiet for {fmt_seconds(gap)}, longer than the "
                       f"{fmt_seconds(idle.seconds)} idle timeout ({idle.source})")
        else:
            verdict = (f"could suspend: nothing keeps it awake; with no new activity it "
                       f"suspends at about {suspend_at.isoformat(timespec='seconds')} "
                       f"({fmt_seconds(idle.seconds)} idle timeout, {idle.source})")
    hidden = sum(1 for s in sessions if s.reason.startswith("hidden"))
    if hidden:
        verdict += (f"; {hidden} session(s) of other roles were hidden from this user, "
                    "grant it pg_read_all_stats to judge them")
    return AuditResult(
        could_suspend=could, verdict=verdict, idle_timeout_s=idle.seconds,
        idle_timeout_source=idle.source, started_at=start.isoformat(),
        ended_at=end.isoformat(), duration_s=round(window, 3),
        samples=len(activity.samples), longest_quiet_gap_s=round(gap, 3),
        longest_quiet_gap_from=_iso(gap_from), longest_quiet_gap_to=_iso(gap_to),
        last_activity_at=_iso(last_activity), suspend_estimate_at=_iso(suspend_at),
        awake_s=round(awake, 3), sessions=sessions, reconnecting_clients=clients,
        unseen_connections=unseen, counters=activity.counters,
        filters=activity.filters.as_dict(),
        activity_times=[t.isoformat() for t in instants],
    )


def _longest_quiet_gap(instants: list[datetime], start: datetime, end: datetime
                       ) -> tuple[float, datetime | None, datetime | None]:
    """The longest stretch without activity that ends inside the window.

    It may begin before the window: an idle session whose last state change is an hour
    old says the compute has been quiet (as far as it goes) for an hour.
    """
    before = [t for t in instants if t <= start]
    inside = [t for t in instants if start < t <= end]
    anchor = before[-1] if before else start
    points = [anchor, *inside, end]
    best, best_from, best_to = 0.0, None, None
    for a, b in itertools.pairwise(points):
        g = (b - a).total_seconds()
        if g > best:
            best, best_from, best_to = g, a, b
    return best, best_from, best_to


def _judge_session(tr: _Track, at_end: bool, end: datetime, idle: IdleTimeout,
                   sample_interval: float) -> SessionFinding:
    row = tr.last
    polls = _Repeats.of(list(tr.query_starts), end, POLL_MIN_QUERIES)
    period = polls.period
    health = row.query is not None and bool(_HEALTH_CHECK.match(row.query))
    what = "health checks" if health else "polls"
    keeps, reason = False, ""
    if row.state is None and row.query == HIDDEN_QUERY:
        reason = "hidden: its state needs pg_read_all_stats (or a superuser) to be seen"
    elif row.backend_type == "autovacuum worker":
        keeps, reason = at_end, "autovacuum" if at_end else "autovacuum (finished)"
    elif row.backend_type == "walsender":
        keeps, reason = at_end, "replication" if at_end else "replication (ended)"
    elif at_end and row.state in ("idle in transaction", "idle in transaction (aborted)"):
        keeps = True
        reason = f"idle in transaction {tr.non_idle.get(row.state, 0.0):.0f} s"
    elif polls.going and period is not None:
        keeps = polls.keeps_awake(idle)
        if period <= sample_interval * 1.2:  # a new query at every sample: as fast as we see
            reason = f"{'health checks' if health else 'queries'} at least every " \
                     f"{_fmt_every(sample_interval)} (busy)"
        else:
            reason = f"{what} about every {_fmt_every(period)}"
        if not keeps:
            reason += " (slower than the idle timeout)"
    elif at_end and row.state in _NON_IDLE:
        keeps = True
        reason = "active query" if row.state == "active" else str(row.state)
        held = tr.non_idle.get(row.state or "?", 0.0)
        if held >= 1:
            reason += f" ({held:.0f} s)"
    else:
        was = [s for s in tr.non_idle if s != "active"]
        if was:
            reason = f"was {was[0]} {tr.non_idle[was[0]]:.0f} s (ended)"
        elif not at_end:
            reason = "disconnected"
        elif row.state == "idle" and row.state_change is not None:
            ago = (end - row.state_change).total_seconds()
            reason = f"idle for {fmt_seconds(ago)} (counts as of its last query)"
        else:
            reason = f"state {row.state or 'unknown'}"
    last_act = max(tr.activity) if tr.activity else None
    return SessionFinding(
        pid=row.pid, application_name=row.application_name, user=row.usename,
        database=row.datname, client_addr=row.client_addr, backend_type=row.backend_type,
        backend_start=_iso(row.backend_start), state=row.state, query=shorten(row.query),
        keeps_awake=keeps, reason=reason,
        poll_interval_s=None if period is None else round(period, 3),
        queries_seen=len(tr.query_starts), first_seen=tr.first_seen.isoformat(),
        last_seen=tr.last_seen.isoformat(), connected_at_end=at_end,
        last_activity_at=_iso(last_act))


def _judge_clients(tracks: dict[tuple[int, datetime | None], _Track], start: datetime,
                   end: datetime, idle: IdleTimeout) -> list[ClientFinding]:
    groups: dict[tuple[Any, ...], list[_Track]] = defaultdict(list)
    for tr in tracks.values():
        r = tr.first
        if r.backend_type != "client backend":
            continue
        groups[(r.datname, r.usename, r.application_name, r.client_addr)].append(tr)
    out: list[ClientFinding] = []
    for (datname, usename, app, addr), members in groups.items():
        starts = sorted(tr.first.backend_start for tr in members
                        if tr.first.backend_start is not None)
        new = [s for s in starts if s >= start]
        if len(new) < RECONNECT_MIN_NEW:
            continue
        reconnects = _Repeats.of(new, end, RECONNECT_MIN_NEW)
        period, recent = reconnects.period, reconnects.going
        keeps = reconnects.keeps_awake(idle)
        every = "" if period is None else f" about every {_fmt_every(period)}"
        reason = f"reconnects{every} ({len(new)} new connections)"
        if period is not None and not keeps and recent:
            reason += " (slower than the idle timeout)"
        elif not recent:
            reason += " (stopped)"
        out.append(ClientFinding(
            application_name=app, user=usename, database=datname, client_addr=addr,
            connections=len(members), new_connections=len(new),
            reconnect_interval_s=None if period is None else round(period, 3),
            keeps_awake=keeps, reason=reason,
            pids=sorted({tr.first.pid for tr in members})))
    return out


def _judge_unseen(activity: Activity, tracks: dict[tuple[int, datetime | None], _Track],
                  end: datetime, idle: IdleTimeout
                  ) -> tuple[list[UnseenFinding], set[datetime]]:
    """Connections the session counters saw and the samples did not, per database.

    New sessions counted since the first sample, minus the new backends the samples
    showed: what is left opened and closed between two samples (a cron job's psql, a
    client that connects for each poll). Each is placed at the sample that counted it.
    """
    with_counts = [s for s in activity.samples if s.sessions is not None]
    if len(with_counts) < 2:
        return [], set()
    first = with_counts[0]
    assert first.sessions is not None
    start = first.at
    new_backends = sorted(
        (tr.first_seen, tr.first.datname) for tr in tracks.values()
        if tr.first.backend_start is not None and tr.first.backend_start > start
        and tr.first.backend_type == "client backend")
    out: list[UnseenFinding] = []
    times: set[datetime] = set()
    for dbname in sorted(first.sessions):
        base = first.sessions[dbname]
        high = 0
        counted: list[datetime] = []
        for sample in with_counts[1:]:
            assert sample.sessions is not None
            opened = sample.sessions.get(dbname, base) - base
            seen = sum(1 for at, d in new_backends if d == dbname and at <= sample.at)
            unseen = max(0, opened - seen)
            if unseen > high:
                counted.extend([sample.at] * (unseen - high))
                high = unseen
        if not counted:
            continue
        distinct = sorted(set(counted))
        short = _Repeats.of(distinct, end, RECONNECT_MIN_NEW)
        period, recent = short.period, short.going
        keeps = short.keeps_awake(idle)
        n = len(counted)
        reason = (f"{n} short connection{'' if n == 1 else 's'} between samples"
                  + ("" if period is None else f", about every {_fmt_every(period)}"))
        if period is not None and not keeps:
            reason += " (slower than the idle timeout)" if recent else " (stopped)"
        out.append(UnseenFinding(dbname, len(counted), None if period is None else
                                 round(period, 3), keeps, reason,
                                 [t.isoformat() for t in distinct]))
        times.update(distinct)
    return out, times


def audit(settings: Settings, *, duration: float = DEFAULT_DURATION_S,
          filters: SessionFilter | None = None, idle: IdleTimeout | None = None,
          stop: threading.Event | None = None) -> AuditResult:
    """Sample for ``duration`` seconds and judge (the library form of ``drainer audit``)."""
    activity = sample_activity(settings, duration=duration, filters=filters, stop=stop)
    return judge(activity, idle or idle_timeout_of(settings))


# -- the command ----------------------------------------------------------------------------------


def format_table(result: AuditResult) -> str:
    """The human report: one row per session (reconnecting clients folded into one row)."""
    folded = {pid for c in result.reconnecting_clients for pid in c.pids}
    rows: list[list[str]] = []
    for c in sorted(result.reconnecting_clients, key=lambda c: not c.keeps_awake):
        rows.append([f"{len(c.pids)} pids", c.application_name or "", c.user or "",
                     c.database or "", c.client_addr or "local", "(reconnecting)",
                     "client backend", "YES" if c.keeps_awake else "no", c.reason, ""])
    for u in sorted(result.unseen_connections, key=lambda u: not u.keeps_awake):
        rows.append(["-", "(unseen)", "", u.database, "", "(short connections)", "",
                     "YES" if u.keeps_awake else "no", u.reason, ""])
    for s in sorted(result.sessions, key=lambda s: (not s.keeps_awake, s.pid)):
        if s.pid in folded and s.backend_type == "client backend":
            continue
        rows.append([str(s.pid), s.application_name or "", s.user or "", s.database or "",
                     s.client_addr or ("local" if s.backend_type == "client backend" else ""),
                     s.state or "", s.backend_type, "YES" if s.keeps_awake else "no",
                     s.reason, s.query or ""])
    head = ["PID", "APPLICATION", "USER", "DATABASE", "CLIENT", "STATE", "TYPE", "AWAKE",
            "WHY", "QUERY"]
    caps = [10, 32, 16, 16, 15, 20, 18, 5, 84, 48]
    table = [head, *rows]
    cells = [[c if len(c) <= cap else c[: cap - 1] + "…" for c, cap in zip(r, caps,
                                                                            strict=True)]
             for r in table]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in cells]
    out = [f"sampled pg_stat_activity {result.samples} times over "
           f"{fmt_seconds(result.duration_s)} ({result.started_at} .. {result.ended_at})"]
    if rows:
        out.extend(lines)
    else:
        out.append("no sessions seen (other than the audit's own)")
    if result.counters != "on":
        out.append(f"connections shorter than a sample: not counted ({result.counters})")
    out.append(f"longest quiet gap: {fmt_seconds(result.longest_quiet_gap_s)}"
               + (f" (from {result.longest_quiet_gap_from})"
                  if result.longest_quiet_gap_from else ""))
    out.append(result.verdict)
    return "\n".join(out) + "\n"


def _filters_from_args(args: argparse.Namespace) -> SessionFilter:
    pids = None
    if getattr(args, "only_pid", None):
        try:
            pids = [int(p) for v in args.only_pid for p in v.split(",") if p.strip()]
        except ValueError:
            from drainer.errors import ConfigError

            raise ConfigError("--only-pid takes process ids (numbers)") from None
    return SessionFilter(databases=getattr(args, "only_database", None) or None,
                         users=getattr(args, "only_user", None) or None,
                         application_names=getattr(args, "only_application", None) or None,
                         pids=pids)


def audit_command(args: argparse.Namespace, settings: Settings) -> int:
    """``drainer audit``: exit 0 if the compute could suspend, 1 if something keeps it up."""
    from drainer.errors import ConfigError

    try:
        duration = float(parse_duration(args.duration))
    except ValueError as exc:
        raise ConfigError(f"--duration: {exc}") from None
    if duration <= 0:
        raise ConfigError("--duration must be more than 0 seconds")
    idle = idle_timeout_of(settings)
    if idle.assumed:
        logger.warning("idle timeout unknown: assuming %s (%s)", fmt_seconds(idle.seconds),
                       idle.source)
    result = audit(settings, duration=duration, filters=_filters_from_args(args), idle=idle)
    if args.json:
        sys.stdout.write(json.dumps(result.as_dict(), default=str) + "\n")
    else:
        sys.stdout.write(format_table(result))
    sys.stdout.flush()
    return 0 if result.could_suspend else 1
