"""What a handler sees: the :class:`Job` it receives and what it may raise or enqueue.

A leaf: it imports nothing of drainer, so every part (the drain, the registry, the
producers, OpenTelemetry) can name these types without importing each other.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

if TYPE_CHECKING:
    import psycopg

#: A job's max_attempts when nothing sets one: the column's default (0001_jobs_table.sql).
DEFAULT_MAX_ATTEMPTS = 5
#: The run_at range the jobs table's CHECK accepts (migration 0002).
RUN_AT_MIN = datetime(1970, 1, 1, tzinfo=timezone.utc)
RUN_AT_MAX = datetime(9999, 1, 1, tzinfo=timezone.utc)
#: The largest handler return value kept in the job's result column (bytes of JSON,
#: ``--result-max-bytes``); a larger one fails the job with a ResultError.
DEFAULT_RESULT_MAX_BYTES = 64 * 1024
#: The range of the table's int columns (priority, max_attempts).
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
#: The longest wait sent to the database (seconds, about 9,500 years): run_at is kept under
#: RUN_AT_MAX by the statements; this keeps the interval itself representable.
MAX_WAIT_S = 3e11
#: A JSON ``\u0000`` escape (not an escaped backslash before "u0000"): jsonb refuses it.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def storable_text(value: str, what: str) -> None:
    """ValueError unless ``value`` is text PostgreSQL stores: no NUL, valid UTF-8."""
    if "\x00" in value:
        raise ValueError(f"{what} contains a NUL character, which PostgreSQL refuses")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} has text that is not valid UTF-8 (a lone surrogate)"
                         ) from None


def storable_json(value: Any, what: str) -> str:
    """``value`` as the JSON text a jsonb column takes; TypeError if it is not
    JSON-serialisable, ValueError if jsonb refuses it (NaN, a NUL, a lone surrogate)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        raise ValueError(f"{what} is not JSON-serialisable ({exc})") from None
    except TypeError as exc:
        raise TypeError(f"{what} is not JSON-serialisable ({exc})") from None
    if _JSON_NUL.search(text):
        raise ValueError(f"{what} contains a NUL character, which PostgreSQL's jsonb refuses")
    storable_text(text, what)
    return text


def storable_int(value: Any, what: str, low: int = INT_MIN) -> None:
    """ValueError unless ``value`` is an int the table's int columns hold (>= ``low``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    if not low <= value <= INT_MAX:
        raise ValueError(f"{what} must be between {low} and {INT_MAX}, got {value}")


class HasQueue(Protocol):
    """Anything that stands for a queue: a ``@task`` handler (its ``queue`` attribute)."""

    @property
    def queue(self) -> str: ...


#: A queue name, or a ``@task`` handler standing for its queue.
QueueRef = str | HasQueue


def queue_of(queue: QueueRef) -> str:
    """A queue name, or the queue of a ``@task`` handler (the contrib producers take both)."""
    if isinstance(queue, str):
        return queue
    name = getattr(queue, "queue", None)
    if not isinstance(name, str):
        raise TypeError(f"expected a queue name or a @task handler, got {queue!r}")
    return name


class CancelEvent(threading.Event):
    """A ``threading.Event`` whose lock and condition are made on first use.

    A drain makes one per job and almost never sets or waits on it: making the condition
    only when someone sets or waits (``is_set`` needs none) saves most of the event's cost
    per job. It behaves exactly as ``threading.Event``.
    """

    _made = threading.Lock()

    def __init__(self) -> None:  # not super().__init__(), which makes the condition
        self._flag = False
        self._lazy_cond: threading.Condition | None = None

    @property
    def _cond(self) -> threading.Condition:
        cond = self._lazy_cond
        if cond is None:
            with CancelEvent._made:
                if self._lazy_cond is None:
                    self._lazy_cond = threading.Condition(threading.Lock())
                cond = self._lazy_cond
        return cond


class JobCancelled(Exception):
    """Raised by ``job.raise_if_cancelled()`` when the job is no longer ours or shutdown began."""


class Snooze(Exception):
    """Raised by a handler (or ``job.snooze(seconds)``): "not yet, run me again in
    ``seconds``". The job goes back to queued with run_at moved on, and the attempt the
    claim counted is given back: a snooze uses no attempt."""

    def __init__(self, seconds: float) -> None:
        seconds = float(seconds)
        if not seconds >= 0:  # NaN too
            raise ValueError("Snooze needs a number of seconds >= 0")
        super().__init__(f"snoozed for {seconds:g}s")
        self.seconds = seconds


@dataclass(frozen=True)
class Retry:
    """A task's retry policy: a failed job waits ``least(cap, base * 2^attempts)`` seconds
    (times ``1 + jitter * random()``), and fails for good after ``max_attempts``. A wait
    past run_at's range (``cap=float("inf")``, a huge base) runs at its end (9999-01-01).

    ``None`` keeps the setting (``retry_base``, ``retry_cap``; ``max_attempts``: the
    task's, else the job's own)."""

    base: float | None = None
    cap: float | None = None
    jitter: float = 0.0
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        for name in ("base", "cap"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"Retry({name}=...) must be positive")
        if not 0 <= self.jitter <= 10:  # NaN too
            raise ValueError("Retry(jitter=...) must be between 0 and 10")
        if self.max_attempts is not None:
            storable_int(self.max_attempts, "Retry(max_attempts=...)", low=1)


@dataclass
class FollowUp:
    """A job a handler enqueued with ``job.enqueue``: inserted with the job's success."""

    queue: str
    payload: Any
    run_at: datetime | None = None
    priority: int = 0
    max_attempts: int | None = None
    dedup_key: str | None = None

    def check(self) -> None:
        """ValueError (TypeError: a payload JSON cannot hold) unless the table can store
        this follow-up: checked before it joins its parent's completion statement, which
        one bad row would fail for the whole batch."""
        if not isinstance(self.queue, str) or not self.queue:
            raise ValueError("a follow-up needs a queue")
        storable_text(self.queue, "a follow-up's queue")
        storable_json(self.payload, "a follow-up's payload")
        if self.run_at is not None and (not isinstance(self.run_at, datetime)
                                        or self.run_at.tzinfo is None):
            raise ValueError("a follow-up's run_at must be a timezone-aware datetime")
        storable_int(self.priority, "a follow-up's priority")
        if self.max_attempts is not None:
            storable_int(self.max_attempts, "a follow-up's max_attempts", low=1)
        if self.dedup_key is not None:
            if not isinstance(self.dedup_key, str):
                raise ValueError("a follow-up's dedup_key must be a string")
            storable_text(self.dedup_key, "a follow-up's dedup_key")

    def as_json(self, parent: int) -> dict[str, Any]:
        # run_at clamped to the table's CHECK: before 1970 is due now, as is 1970
        return {"parent": parent, "queue": self.queue, "payload": self.payload,
                "run_at": None if self.run_at is None
                else min(max(self.run_at, RUN_AT_MIN), RUN_AT_MAX).isoformat(),
                "priority": self.priority, "max_attempts": self.max_attempts,
                "dedup_key": self.dedup_key}


@dataclass
class Job:
    """What a handler receives: one claimed job and the means to act on its lease."""

    id: int
    queue: str
    payload: Any
    attempt: int
    max_attempts: int
    deadline: datetime | None
    """When the handler's time is up: its timeout, else its lease (extended by heartbeats)."""
    cancelled: threading.Event = field(default_factory=CancelEvent)
    """Set when the lease was lost (reaped, cancelled) or shutdown began: stop soon."""
    conn: psycopg.Connection[Any] | None = None
    """The claim's connection, inside its transaction (``transaction=True`` tasks only)."""
    fence: int = 0
    """The claim's token (grows at every claim of the job, never reset; ``attempt`` is the
    attempts count, which ``drainer retry`` resets)."""
    trace_context: dict[str, str] | None = None
    """The producer's W3C trace context (``traceparent``, ``tracestate``) when it enqueued
    inside an OpenTelemetry span, else None (the ``trace_context`` column)."""
    _extend: Callable[[Job, float | None], bool] | None = field(default=None, repr=False)
    followups: list[FollowUp] = field(default_factory=list, repr=False)
    """Jobs enqueued by the handler with :meth:`enqueue`, inserted with its success."""

    def snooze(self, seconds: float) -> NoReturn:
        """Put the job back to queued for ``seconds``, using no attempt (raises Snooze)."""
        raise Snooze(seconds)

    def enqueue(self, queue: QueueRef, payload: Any, *, run_at: datetime | None = None,
                priority: int = 0, max_attempts: int | None = None,
                dedup_key: str | None = None) -> None:
        """Enqueue a follow-up job: inserted in the same statement (and transaction) as
        this job's success, so never if the job fails, is lost or cancelled. A follow-up
        due now on a queue this drain runs is claimed by the same drain."""
        followup = FollowUp(queue_of(queue), payload, run_at, priority, max_attempts,
                            dedup_key)
        followup.check()
        self.followups.append(followup)

    def extend(self, seconds: float | None = None) -> bool:
        """Push this job's lease to now + ``seconds`` (default: the task's lease).

        Returns False, and sets ``cancelled``, when the job is no longer ours: stop work.
        """
        if self._extend is None:
            return not self.cancelled.is_set()
        return self._extend(self, seconds)

    def raise_if_cancelled(self) -> None:
        if self.cancelled.is_set():
            raise JobCancelled(f"job {self.id} was cancelled")

    @property
    def scheduled_for(self) -> datetime | None:
        """The fire time a recurring job's occurrence is for (None for other jobs): the
        payload's ``scheduled_for`` (drainer.recurring.SCHEDULED_FOR_KEY), parsed."""
        value = self.payload.get("scheduled_for") if isinstance(self.payload, dict) else None
        if not isinstance(value, str):
            return None
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            return None
        return when if when.tzinfo is not None else None
