"""What an audit found: one finding per session, reconnecting client and unseen
connections, the verdict, and the table ``drainer audit`` prints."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from drainer.waking import fmt_seconds


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
    #: every instant this session counted as activity (the timeline of ``audit --html``)
    activity_times: list[str] = field(default_factory=list, repr=False)


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
            for session in out["sessions"]:
                session.pop("activity_times", None)
        return out


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
    before = (result.longest_quiet_gap_from is not None
              and datetime.fromisoformat(result.longest_quiet_gap_from)
              < datetime.fromisoformat(result.started_at))
    out.append(f"longest quiet gap: {fmt_seconds(result.longest_quiet_gap_s)}"
               + (f" (from {result.longest_quiet_gap_from}"
                  f"{', before the window' if before else ''})"
                  if result.longest_quiet_gap_from else ""))
    out.append(result.verdict)
    return "\n".join(out) + "\n"
