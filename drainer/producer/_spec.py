"""What a producer hands over (JobSpec), what it gets back, and the checks of every job."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from drainer import otel
from drainer.db import QUERIES, identifiers
from drainer.job import DEFAULT_MAX_ATTEMPTS, RUN_AT_MAX, RUN_AT_MIN


@dataclass(frozen=True, slots=True, init=False)
class JobSpec:
    """One job to enqueue in bulk."""

    queue: str
    payload: Any
    run_at: datetime | None = None
    priority: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    dedup_key: str | None = None

    def __init__(self, queue: str, payload: Any, run_at: datetime | None = None,
                 priority: int = 0, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                 dedup_key: str | None = None) -> None:
        # What the generated frozen __init__ does, through the slots' own setters rather
        # than object.__setattr__ once a field: bulk producers build one JobSpec per job.
        q, p, r, pr, m, d = _JOBSPEC_SETTERS
        q(self, queue)
        p(self, payload)
        r(self, run_at)
        pr(self, priority)
        m(self, max_attempts)
        d(self, dedup_key)


#: The slot setters of JobSpec's fields, in order (they bypass the frozen __setattr__).
_JOBSPEC_SETTERS: tuple[Callable[[JobSpec, Any], None], ...] = tuple(
    getattr(JobSpec, f).__set__ for f in
    ("queue", "payload", "run_at", "priority", "max_attempts", "dedup_key"))


@dataclass(frozen=True)
class EnqueueResult:
    enqueued: int
    skipped_duplicates: int


def spec(job: JobSpec | Mapping[str, Any]) -> JobSpec:
    """``job`` as a JobSpec (a mapping of its fields made one: a misspelt key is a
    TypeError that names it)."""
    return job if isinstance(job, JobSpec) else JobSpec(**job)




def check_run_at(run_at: datetime | None) -> None:
    """ValueError for a run_at the table refuses (before 1970-01-01 or after 9999-01-01)."""
    if run_at is None:
        return
    when = run_at if run_at.tzinfo else run_at.replace(tzinfo=timezone.utc)
    if not RUN_AT_MIN <= when <= RUN_AT_MAX:
        raise ValueError(f"run_at must be between {RUN_AT_MIN.date()} and "
                         f"{RUN_AT_MAX.date()} UTC, not {run_at.isoformat()}")


def check(queue: str, max_attempts: int) -> None:
    """ValueError for an empty queue or a max_attempts below 1."""
    if not queue:
        raise ValueError("queue must be a non-empty string")
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")


def trace_context() -> Jsonb | None:
    """The current span's W3C trace context, to store with the job (None: no span, or
    OpenTelemetry not in use: then nothing is imported)."""
    carrier = otel.producer_context()
    return None if carrier is None else Jsonb(carrier)


def statement(name: str, schema: str, table: str) -> sql.Composed:
    """The named statement of queries.sql on ``schema``.``table``."""
    return sql.SQL(QUERIES[name]).format(**identifiers(schema, table))
