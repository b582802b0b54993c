"""Sampling pg_stat_activity (and the per-database session counters) every 0.5 s."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from drainer.db import QUERIES

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
#: Query text kept per sample.
QUERY_CHARS = 300


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
