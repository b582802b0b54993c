"""Judging the samples by the activity monitor's rules (see :mod:`drainer.audit`)."""

from __future__ import annotations

import itertools
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from drainer.audit.findings import AuditResult, ClientFinding, SessionFinding, UnseenFinding
from drainer.audit.sampling import Activity, SessionRow
from drainer.waking import IdleTimeout, covered_seconds, fmt_seconds, polls_faster_than_idle

#: Query text shown in the findings.
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


#: A session: its pid and backend_start (a pid is reused by later sessions).
_Key = tuple[int, datetime | None]


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
        """The rule of 'Postgres as a job queue': a poll more often than the idle timeout
        keeps it up all day."""
        return (self.going and self.period is not None
                and polls_faster_than_idle(self.period, idle))


def _fmt_every(s: float) -> str:
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"


def judge(activity: Activity, idle: IdleTimeout) -> AuditResult:
    """Apply the rules to the samples and say whether the compute could suspend."""
    start, end = activity.started_at, activity.ended_at
    tracks, at_end = _tracks(activity)
    sessions = [_judge_session(tr, key in at_end, end, idle, activity.interval_s)
                for key, tr in sorted(tracks.items(), key=lambda kv: kv[1].first_seen)]
    clients = _judge_clients(tracks, start, end, idle)
    unseen, unseen_times = _judge_unseen(activity, tracks, end, idle)

    instants = sorted({t for tr in tracks.values() for t in tr.activity} | unseen_times)
    gap, gap_from, gap_to = _longest_quiet_gap(instants, start, end)
    inside_gap, inside_from, inside_to = _longest_quiet_gap(
        [t for t in instants if t > start], start, end)
    quiet = _Quiet(gap, gap_from, gap_to, inside_gap, inside_from, inside_to)
    last_activity = max((t for t in instants if t <= end), default=None)
    window = (end - start).total_seconds()
    awake = (window if idle.never_suspends else covered_seconds(
        [t.timestamp() for t in instants], idle.seconds, start.timestamp(), end.timestamp()))
    could, verdict, suspend_at = _verdict(
        idle, [*sessions, *clients, *unseen], quiet, start, end, last_activity)
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


def _tracks(activity: Activity) -> tuple[dict[_Key, _Track], set[_Key]]:
    """Each session seen in the samples, with what it did; and those of the last sample
    (still connected at the end)."""
    tracks: dict[_Key, _Track] = {}
    for sample in activity.samples:
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
            if row.backend_start is not None and row.backend_start >= activity.started_at:
                tr.activity.add(row.backend_start)
            if row.backend_type == "client backend" and row.state in _NON_IDLE:
                since = row.state_change or row.query_start or sample.at
                held = max(0.0, (sample.at - since).total_seconds())
                tr.non_idle[row.state or "?"] = max(tr.non_idle.get(row.state or "?", 0.0),
                                                    held)
    last = activity.samples[-1].rows if activity.samples else []
    return tracks, {(row.pid, row.backend_start) for row in last}


def _verdict(idle: IdleTimeout,
             findings: Sequence[SessionFinding | ClientFinding | UnseenFinding],
             quiet: _Quiet, start: datetime, end: datetime, last_activity: datetime | None
             ) -> tuple[bool, str, datetime | None]:
    """Whether the compute could suspend, why in one sentence, and when it would."""
    window = (end - start).total_seconds()
    keeping = [f for f in findings if f.keeps_awake]
    if idle.never_suspends:
        return False, (f"the compute never suspends ({idle.source}): nothing to keep "
                       "asleep"), None
    if keeping:
        return False, (f"keeps the compute awake: {len(keeping)} of {len(findings)} "
                       f"session(s)/clients with a {fmt_seconds(idle.seconds)} "
                       f"idle timeout ({idle.source}); longest quiet gap: "
                       f"{quiet.words(start, end, idle.seconds).removeprefix('for ')}"), None
    if window >= idle.seconds and quiet.capped < idle.seconds:
        return False, (f"keeps the compute awake: activity from several sessions left no "
                       f"quiet gap of {fmt_seconds(idle.seconds)} in {fmt_seconds(window)} "
                       f"of sampling (longest {fmt_seconds(quiet.capped)})"), None
    suspend_at = (last_activity or start) + timedelta(seconds=idle.seconds)
    if quiet.gap >= idle.seconds:
        return True, (f"could suspend: quiet {quiet.words(start, end, idle.seconds)}, "
                      f"longer than the {fmt_seconds(idle.seconds)} idle timeout "
                      f"({idle.source})"), suspend_at
    return True, (f"could suspend: nothing keeps it awake; with no new activity it "
                  f"suspends at about {suspend_at.isoformat(timespec='seconds')} "
                  f"({fmt_seconds(idle.seconds)} idle timeout, {idle.source})"), suspend_at


@dataclass(frozen=True)
class _Quiet:
    """The longest quiet gap, and the same capped to the window (its start as activity)."""

    gap: float
    since: datetime | None
    until: datetime | None
    capped: float
    capped_since: datetime | None
    capped_until: datetime | None

    def words(self, start: datetime, end: datetime, idle_s: float) -> str:
        """The quiet gap in the words of the window sampled: ``for 30 s of the 60 s window
        (12:00:30 .. 12:01:00)``. A gap that began before the window (an idle session's
        last state change an hour ago) is not said to be the window's: ``for the whole
        60 s window (and since 11:00:00 before it: 60.1 min)``, or, when only the part
        before the window is longer than the idle timeout, ``since 11:58:20 (before the
        window) until 12:00:01: 101 s``."""
        window = fmt_seconds((end - start).total_seconds())
        before = self.since is not None and self.since < start
        if self.capped_since == start and self.capped_until == end:
            extra = (f" (and since {_clock(self.since, start)} before it: "
                     f"{fmt_seconds(self.gap)})" if before and self.since else "")
            return f"for the whole {window} window{extra}"
        if self.capped >= idle_s or self.gap < idle_s or not before or self.since is None:
            where = (f" ({_clock(self.capped_since, start)} .. "
                     f"{_clock(self.capped_until, start)})"
                     if self.capped_since and self.capped_until else "")
            return f"for {fmt_seconds(self.capped)} of the {window} window{where}"
        until = f" until {_clock(self.until, start)}" if self.until else ""
        return (f"since {_clock(self.since, start)} (before the window){until}: "
                f"{fmt_seconds(self.gap)}")


def _clock(t: datetime, start: datetime) -> str:
    """``11:00:00`` on the window's day (in its time zone), else the ISO time."""
    local = t.astimezone(start.tzinfo)
    if local.date() == start.date():
        return local.strftime("%H:%M:%S")
    return local.isoformat(timespec="seconds")


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
        last_activity_at=_iso(last_act), activity_times=[t.isoformat() for t in
                                                         sorted(tr.activity)])


def _judge_clients(tracks: dict[_Key, _Track], start: datetime,
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


def _judge_unseen(activity: Activity, tracks: dict[_Key, _Track],
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
