"""What an audit found: one finding per session, reconnecting client and unseen
connections, and the verdict."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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
