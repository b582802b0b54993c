"""What each page of ``drainer ui`` reads: one short connection a page, closed before the
page is drawn, so that nobody looking means no session and no query.

Every function here opens one connection (or calls one library function that does), reads,
closes it, and returns plain values with a :class:`Read`: when the database was read and how
long the connection was open. Nothing is kept between two calls.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from drainer.errors import ConfigError

if TYPE_CHECKING:
    from drainer.audit import AuditResult
    from drainer.db import Queries
    from drainer.registry import Registry
    from drainer.settings import Settings

T = TypeVar("T")

#: Statuses of the jobs filter (the table's CHECK constraint).
STATUSES = ("queued", "running", "done", "failed", "cancelled")
#: Jobs on one page of the jobs list.
PAGE_SIZE = 50
#: Runs on one page of the runs list.
RUNS_PAGE_SIZE = 50
#: How many later ids the job page looks through for a done job's follow-ups.
FOLLOWUP_WINDOW = 10_000
#: Follow-ups listed at most.
FOLLOWUPS_SHOWN = 50
#: The awake page samples pg_stat_activity this long when asked to (seconds, at most).
MAX_SAMPLE_S = 60.0
#: ... and this long when no duration is given.
DEFAULT_SAMPLE_S = 10.0
#: Longest text filters accepted (queue, run id, error text).
MAX_FILTER_CHARS = 200


@dataclass(frozen=True)
class Read:
    """When a page read the database (``at``: its connection closed) and how long its one
    connection was open; ``at`` None: the page did not read it."""

    at: datetime | None
    held_s: float = 0.0

    @classmethod
    def nothing(cls) -> Read:
        return cls(None)


@dataclass(frozen=True)
class Snapshot(Generic[T]):
    """What a page read, and when."""

    data: T
    read: Read


@contextmanager
def _timed() -> Iterator[list[Read]]:
    """Measure the block (which opens and closes one connection) as the page's Read."""
    out: list[Read] = []
    started = time.monotonic()
    try:
        yield out
    finally:
        out.append(Read(datetime.now(timezone.utc), time.monotonic() - started))


@contextmanager
def one_connection(settings: Settings) -> Iterator[Queries]:
    """One connection (application_name ``<name>-ui``), the schema checked, closed on exit:
    a static site reads all its pages through one."""
    from drainer.db import Queries, connect
    from drainer.migrate import check_schema

    with connect(settings, purpose="ui") as conn:
        q = Queries(conn, settings.schema_name, settings.table)
        check_schema(q)
        yield q


@contextmanager
def _queries(settings: Settings, shared: Queries | None) -> Iterator[Queries]:
    """``shared`` when given (left open), else a connection of the call's own."""
    if shared is not None:
        yield shared
        return
    with one_connection(settings) as q:
        yield q


def _text(name: str, value: str | None) -> str | None:
    if value is None or not value.strip():
        return None
    if len(value) > MAX_FILTER_CHARS:
        raise ConfigError(f"{name}: at most {MAX_FILTER_CHARS} characters")
    return value.strip()


# -- queues ---------------------------------------------------------------------------------------


def queues(settings: Settings, registry: Registry | None = None) -> Snapshot[dict[str, Any]]:
    """``drainer status``'s figures (:func:`drainer.status.collect_status`: one connection)."""
    from drainer.status import collect_status

    with _timed() as read:
        status = collect_status(settings, registry)
    return Snapshot(status, read[0])


# -- jobs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobFilter:
    """The jobs page's filters and where its page starts (``before`` / ``after`` an id)."""

    queue: str | None = None
    status: str | None = None
    run_id: str | None = None
    error: str | None = None
    before: int | None = None
    after: int | None = None
    limit: int = PAGE_SIZE

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in STATUSES:
            raise ConfigError(f"status must be one of {', '.join(STATUSES)}")
        if self.before is not None and self.after is not None:
            raise ConfigError("give before or after, not both")
        if not 1 <= self.limit <= 500:
            raise ConfigError("limit must be 1 to 500")

    @classmethod
    def of(cls, *, queue: str | None = None, status: str | None = None,
           run_id: str | None = None, error: str | None = None, before: int | None = None,
           after: int | None = None, limit: int = PAGE_SIZE) -> JobFilter:
        """Blank text filters are no filter; longer than MAX_FILTER_CHARS is a ConfigError."""
        return cls(_text("queue", queue), _text("status", status), _text("run", run_id),
                   _text("error", error), before, after, limit)

    def params(self) -> dict[str, Any]:
        return {"queue": self.queue, "status": self.status, "run_id": self.run_id,
                "error": self.error, "before": self.before, "after": self.after}

    def first_page(self) -> JobFilter:
        return replace(self, before=None, after=None)


@dataclass(frozen=True)
class JobsPage:
    """One page of jobs, newest first; ``older`` / ``newer``: the filters of the next pages
    (None: there is none)."""

    rows: list[dict[str, Any]]
    filter: JobFilter
    older: JobFilter | None = None
    newer: JobFilter | None = None


def _jobs_page(q: Queries, f: JobFilter) -> JobsPage:
    params = {**f.params(), "limit": f.limit + 1}
    if f.after is not None:
        rows = q.fetch_dicts("ui_jobs_newer", params)
        more_newer = len(rows) > f.limit
        rows = rows[:f.limit][::-1]
        older = replace(f, before=rows[-1]["id"], after=None) if rows else None
        newer = replace(f, after=rows[0]["id"]) if rows and more_newer else None
        return JobsPage(rows, f, older, newer)
    rows = q.fetch_dicts("ui_jobs_older", params)
    more_older = len(rows) > f.limit
    rows = rows[:f.limit]
    older = replace(f, before=rows[-1]["id"]) if rows and more_older else None
    newer = replace(f, before=None, after=rows[0]["id"]) if rows and f.before else None
    return JobsPage(rows, f, older, newer)


def jobs(settings: Settings, f: JobFilter, shared: Queries | None = None
         ) -> Snapshot[JobsPage]:
    with _timed() as read, _queries(settings, shared) as q:
        page = _jobs_page(q, f)
    return Snapshot(page, read[0])


@dataclass(frozen=True)
class JobView:
    """One job whole, and what is known of the jobs it enqueued."""

    job: dict[str, Any] | None
    followups: list[dict[str, Any]] = field(default_factory=list)
    #: jobs completed by the statement that completed this one (None: not a done job)
    completed_with: int | None = None


def job(settings: Settings, job_id: int, shared: Queries | None = None
        ) -> Snapshot[JobView]:
    with _timed() as read, _queries(settings, shared) as q:
        rows = q.fetch_dicts("ui_job", {"id": job_id})
        view = JobView(rows[0] if rows else None)
        if view.job is not None and view.job["status"] == "done" and view.job["finished_at"]:
            found = q.fetch_dicts("ui_job_followups", {
                "id": job_id, "finished_at": view.job["finished_at"],
                "window": FOLLOWUP_WINDOW, "limit": FOLLOWUPS_SHOWN})
            view = replace(view, followups=found, completed_with=int(
                found[0]["completed_with"]) if found else None)
    return Snapshot(view, read[0])


# -- runs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunsPage:
    rows: list[dict[str, Any]]
    page: int
    more: bool


def runs(settings: Settings, page: int = 1, shared: Queries | None = None
         ) -> Snapshot[RunsPage]:
    if page < 1:
        raise ConfigError("page must be at least 1")
    with _timed() as read, _queries(settings, shared) as q:
        rows = q.fetch_dicts("ui_runs", {"run_id": None, "limit": RUNS_PAGE_SIZE + 1,
                                         "offset": (page - 1) * RUNS_PAGE_SIZE})
    return Snapshot(RunsPage(rows[:RUNS_PAGE_SIZE], page, len(rows) > RUNS_PAGE_SIZE),
                    read[0])


@dataclass(frozen=True)
class RunView:
    summary: dict[str, Any] | None
    jobs: JobsPage


def run(settings: Settings, run_id: str, f: JobFilter | None = None,
        shared: Queries | None = None) -> Snapshot[RunView]:
    """One run's summary and a page of its jobs (``f``: the page; its run_id is this run)."""
    f = replace(f or JobFilter(), run_id=run_id)
    with _timed() as read, _queries(settings, shared) as q:
        rows = q.fetch_dicts("ui_runs", {"run_id": run_id, "limit": 1, "offset": 0})
        page = _jobs_page(q, f)
    return Snapshot(RunView(rows[0] if rows else None, page), read[0])


# -- recurring ------------------------------------------------------------------------------------


def recurring(settings: Settings, registry: Registry | None = None,
              shared: Queries | None = None) -> Snapshot[list[dict[str, Any]]]:
    """Every series in the table and in the app (``registry``: its definitions give the
    schedule and the next fire time of a series with no queued occurrence)."""
    from drainer.recurring import series_status
    from drainer.registry import default_registry

    registry = registry or default_registry
    with _timed() as read, _queries(settings, shared) as q:
        rows = q.fetch_dicts("ui_recurring")
    by_key = {r["key"]: r for r in rows}
    series = series_status(rows, registry.schedules.values(), registry.tasks,
                           datetime.now(timezone.utc))
    extra = ("next_id", "last_id", "last_run_id", "done", "failed", "occurrences")
    out = [{**s, **{k: by_key.get(s["key"], {}).get(k) for k in extra}} for s in series]
    return Snapshot(out, read[0])


# -- the awake timeline ---------------------------------------------------------------------------


def sample_seconds(text: str | None) -> float:
    """The awake page's sampling duration: 1 to MAX_SAMPLE_S seconds (30s, 1m accepted)."""
    from drainer.settings import parse_duration

    if text is None or not text.strip():
        return DEFAULT_SAMPLE_S
    try:
        seconds = float(parse_duration(text))
    except ValueError as exc:
        raise ConfigError(f"seconds: {exc}") from None
    if not 1 <= seconds <= MAX_SAMPLE_S:
        raise ConfigError(f"seconds: 1 to {MAX_SAMPLE_S:.0f}")
    return seconds


def awake(settings: Settings, seconds: float) -> Snapshot[AuditResult]:
    """Sample pg_stat_activity for ``seconds`` (``drainer audit``: one connection) and judge
    what kept the compute awake, by the settings' idle timeout."""
    from drainer.audit import audit
    from drainer.waking import idle_timeout_of

    with _timed() as read:
        result = audit(settings, duration=seconds, idle=idle_timeout_of(settings))
    return Snapshot(result, read[0])
