"""``@task``: register a handler for a queue, and look handlers up."""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar, overload

from drainer.errors import ConfigError
from drainer.queue_limits import Rate, parse_rate

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterable

    import psycopg

    from drainer.recurring import Definition


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


#: The latest run_at the jobs table accepts (its CHECK, migration 0002).
MAX_RUN_AT = datetime(9999, 1, 1, tzinfo=timezone.utc)


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
    (times ``1 + jitter * random()``), and fails for good after ``max_attempts``.

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
        if not 0 <= self.jitter <= 10:
            raise ValueError("Retry(jitter=...) must be between 0 and 10")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError("Retry(max_attempts=...) must be at least 1")


@dataclass
class FollowUp:
    """A job a handler enqueued with ``job.enqueue``: inserted with the job's success."""

    queue: str
    payload: Any
    run_at: datetime | None = None
    priority: int = 0
    max_attempts: int | None = None
    dedup_key: str | None = None

    def as_json(self, parent: int) -> dict[str, Any]:
        return {"parent": parent, "queue": self.queue, "payload": self.payload,
                "run_at": None if self.run_at is None else min(self.run_at, MAX_RUN_AT)
                .isoformat(), "priority": self.priority, "max_attempts": self.max_attempts,
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
        if isinstance(queue, str) and not queue:
            raise ValueError("a follow-up needs a queue")
        if run_at is not None and run_at.tzinfo is None:
            raise ValueError("run_at must be timezone-aware")
        try:
            json.dumps(payload, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"a follow-up's payload must be JSON-serialisable: {exc}") from None
        self.followups.append(FollowUp(queue_of(queue), payload, run_at, priority,
                                       max_attempts, dedup_key))

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


Handler = Callable[[Job], Any]

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class TaskHandler(Protocol[R_co]):
    """What ``@task`` returns: the handler itself, callable as before, plus producers bound
    to its queue, so that Python code enqueues by the handler and cannot misspell a queue::

        @task("emails")
        def send_email(job: Job) -> None: ...

        send_email.enqueue(conn, {"to": "a@example.com"})          # psycopg.Connection
        await send_email.enqueue_async(aconn, {"to": "a@example.com"})  # AsyncConnection
    """

    queue: str

    def __call__(self, job: Job, /) -> R_co: ...

    @property
    def enqueue(self) -> BoundEnqueue: ...

    @property
    def enqueue_async(self) -> BoundEnqueueAsync: ...

    @property
    def enqueue_many(self) -> BoundEnqueueMany: ...


#: A queue name, or a ``@task`` handler standing for its queue.
QueueRef = str | TaskHandler[Any]


def queue_of(queue: QueueRef) -> str:
    """A queue name, or the queue of a ``@task`` handler (the contrib producers take both)."""
    if isinstance(queue, str):
        return queue
    name = getattr(queue, "queue", None)
    if not isinstance(name, str):
        raise TypeError(f"expected a queue name or a @task handler, got {queue!r}")
    return name


class _Bound:
    """A producer bound to one task: its queue, and its max_attempts as the default."""

    __slots__ = ("max_attempts", "queue")

    def __init__(self, queue: str, max_attempts: int | None) -> None:
        self.queue = queue
        self.max_attempts = max_attempts

    def _options(self, options: dict[str, Any]) -> dict[str, Any]:
        if "queue" in options:
            raise TypeError(f"the queue is the task's own ({self.queue!r}): pass no queue=")
        if self.max_attempts is not None:
            options.setdefault("max_attempts", self.max_attempts)
        return options

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of queue {self.queue!r}>"


class BoundEnqueue(_Bound):
    """``task.enqueue(conn, payload, **options)``: :func:`drainer.producer.enqueue` on the
    task's queue (an AsyncConnection gives the awaitable, as there)."""

    __slots__ = ()

    @overload
    def __call__(self, conn: psycopg.Connection[Any], payload: Any,
                 **options: Any) -> int | None: ...

    @overload
    def __call__(self, conn: psycopg.AsyncConnection[Any], payload: Any,
                 **options: Any) -> Coroutine[Any, Any, int | None]: ...

    def __call__(self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
                 payload: Any, **options: Any) -> Any:
        from drainer.producer import enqueue

        return enqueue(conn, self.queue, payload, **self._options(options))


class BoundEnqueueAsync(_Bound):
    """``await task.enqueue_async(aconn, payload, **options)``."""

    __slots__ = ()

    def __call__(self, conn: psycopg.AsyncConnection[Any], payload: Any,
                 **options: Any) -> Coroutine[Any, Any, int | None]:
        from drainer.producer import enqueue_async

        return enqueue_async(conn, self.queue, payload, **self._options(options))


class BoundEnqueueMany(_Bound):
    """``task.enqueue_many(conn, payloads, schema=..., table=...)``: one job per payload on
    the task's queue, through :func:`drainer.producer.enqueue_many` (COPY)."""

    __slots__ = ()

    def __call__(self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
                 payloads: Iterable[Any], **options: Any) -> Any:
        from drainer.producer import enqueue_many

        return enqueue_many(conn, payloads, queue=self.queue, **self._options(options))


@dataclass(frozen=True)
class Task:
    """A registered handler and its options."""

    queue: str
    func: Handler
    timeout: float | None = None
    lease: float | None = None
    max_attempts: int | None = None
    transaction: bool = False
    retry: Retry | None = None
    retry_on: tuple[type[BaseException], ...] | None = None
    discard_on: tuple[type[BaseException], ...] = ()
    max_running: int | None = None
    #: At most this many jobs of the queue claimed in any period (drainer.queue_limits).
    rate_limit: Rate | None = None

    def discards(self, exc: BaseException) -> bool:
        """Whether a failure with ``exc`` fails the job at once (no retry)."""
        if isinstance(exc, self.discard_on):
            return True
        return self.retry_on is not None and not isinstance(exc, self.retry_on)

    @property
    def attempts_limit(self) -> int | None:
        """The task's max_attempts (its Retry's first), None: the job's own."""
        if self.retry is not None and self.retry.max_attempts is not None:
            return self.retry.max_attempts
        return self.max_attempts

    @functools.cached_property
    def is_async(self) -> bool:
        """Whether the handler is ``async def`` (asked once per task, not once per job)."""
        return inspect.iscoroutinefunction(self.func)

    @property
    def name(self) -> str:
        return f"{getattr(self.func, '__module__', '?')}.{getattr(self.func, '__qualname__', '?')}"


class Registry:
    """Queue name -> Task."""

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}
        #: Recurring definitions by key (drainer.recurring).
        self.schedules: dict[str, Definition] = {}

    def task(
        self,
        queue: str,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        max_attempts: int | None = None,
        transaction: bool = False,
        cron: str | None = None,
        timezone: str | None = None,
        catch_up: str | None = None,
        retry: Retry | None = None,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
        discard_on: type[BaseException] | tuple[type[BaseException], ...] = (),
        max_running: int | None = None,
        rate_limit: str | Rate | None = None,
    ) -> Callable[[Callable[[Job], R]], TaskHandler[R]]:
        """Register the decorated function as the handler of ``queue``.

        Returns the function itself, with ``.enqueue``, ``.enqueue_async`` and
        ``.enqueue_many`` bound to ``queue`` (see :class:`TaskHandler`).

        With ``cron`` (and optionally ``timezone``, ``catch_up``), the queue also gets a
        recurring job keyed by the queue name (see :mod:`drainer.recurring`); a bad cron
        expression or time zone raises ConfigError here, when the app loads.
        """
        if not queue or not isinstance(queue, str):
            raise ValueError("a task needs a non-empty queue name")
        for name, value in (("timeout", timeout), ("lease", lease)):
            if value is not None and value <= 0:
                raise ValueError(f"task {queue!r}: {name} must be positive")
        if max_attempts is not None and max_attempts < 1:
            raise ValueError(f"task {queue!r}: max_attempts must be at least 1")
        if max_running is not None and max_running < 1:
            raise ValueError(f"task {queue!r}: max_running must be at least 1")
        if max_running is not None and transaction:
            raise ValueError(f"task {queue!r}: max_running does not apply to transaction=True")
        rate = None
        if rate_limit is not None:
            try:
                rate = parse_rate(rate_limit)
            except ValueError as exc:
                raise ValueError(f"task {queue!r}: {exc}") from None
            if transaction:
                raise ValueError(f"task {queue!r}: rate_limit does not apply to "
                                 "transaction=True")
        if retry is not None and not isinstance(retry, Retry):
            raise TypeError(f"task {queue!r}: retry= takes a drainer.Retry(...)")
        retry_types = None if retry_on is None else _types(queue, "retry_on", retry_on)
        discard_types = _types(queue, "discard_on", discard_on)
        if max_attempts is None and retry is not None:
            max_attempts = retry.max_attempts

        def register(func: Callable[[Job], R]) -> TaskHandler[R]:
            existing = self.tasks.get(queue)
            if existing is not None and existing.func is not func:
                raise ValueError(
                    f"queue {queue!r} already has a handler: {existing.name}"
                )
            if transaction and inspect.iscoroutinefunction(func):
                raise ValueError(f"task {queue!r}: transaction=True needs a sync handler")
            self.tasks[queue] = Task(queue, func, timeout, lease, max_attempts, transaction,
                                     retry, retry_types, discard_types, max_running, rate)
            if definition is not None and self.schedules.get(definition.key) != definition:
                self.add_recurring(definition)
            # The producers are attributes of the function itself: calling it, inspecting
            # it (async or not), pickling it by name all stay as they were.
            bound: Any = func
            try:
                bound.queue = queue
                bound.enqueue = BoundEnqueue(queue, max_attempts)
                bound.enqueue_async = BoundEnqueueAsync(queue, max_attempts)
                bound.enqueue_many = BoundEnqueueMany(queue, max_attempts)
            except (AttributeError, TypeError):
                pass  # a bound method or a builtin takes no attributes: registered as it is
            handler: TaskHandler[R] = bound
            return handler

        definition = None
        if cron is not None:
            from drainer.recurring import DEFAULT_CATCH_UP, define

            definition = define(queue, cron, timezone=timezone,
                                catch_up=catch_up or DEFAULT_CATCH_UP,
                                max_attempts=max_attempts)
        elif timezone is not None or catch_up is not None:
            raise ValueError(f"task {queue!r}: timezone and catch_up need cron=")

        return register

    def add_recurring(self, definition: Definition) -> None:
        """Add a recurring definition; ConfigError if its key is taken."""
        existing = self.schedules.get(definition.key)
        if existing is not None:
            raise ConfigError(
                f"recurring key {definition.key!r} is used twice ({existing.describe()}; "
                f"{definition.describe()}): give one of them another key=")
        self.schedules[definition.key] = definition

    def recurring(self, queue: str, cron: str, **kwargs: Any) -> Definition:
        """Declare a recurring job in this registry (see :func:`drainer.recurring.recurring`)."""
        from drainer.recurring import recurring

        return recurring(queue, cron, registry=self, **kwargs)

    def get(self, queue: str) -> Task | None:
        return self.tasks.get(queue)

    def queues(self) -> list[str]:
        return sorted(self.tasks)

    def clear(self) -> None:
        self.tasks.clear()
        self.schedules.clear()


def _types(queue: str, name: str, value: type[BaseException] | tuple[type[BaseException], ...]
           ) -> tuple[type[BaseException], ...]:
    types = value if isinstance(value, tuple) else (value,)
    for t in types:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise TypeError(f"task {queue!r}: {name}= takes exception types, got {t!r}")
    return types


#: The registry ``@task`` writes to and ``run_once`` reads by default.
default_registry = Registry()
task = default_registry.task


def load_app(module: str) -> None:
    """Import the app module that registers handlers; ConfigError (exit 2) on failure."""
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: the current directory is importable
    try:
        importlib.import_module(module)
    except Exception as exc:
        logging.getLogger("drainer.registry").debug(
            "cannot import app module %r", module, exc_info=exc)
        detail = " ".join(str(exc).split()) or type(exc).__name__
        where = _where_it_failed(exc)
        raise ConfigError(
            f"cannot import app module {module!r}: {where}{type(exc).__name__}: {detail}"
            f"{_module_hint(module, exc)}"
        ) from None


def _module_hint(module: str, exc: Exception) -> str:
    """A file path given where a module name goes (``--app tasks.py``): say so."""
    if not (module.endswith(".py") or "/" in module or "\\" in module):
        return ""
    if isinstance(exc, ModuleNotFoundError) and exc.name and not module.startswith(exc.name):
        return ""  # a dependency of the app is missing, not the app itself
    parts = module.removesuffix(".py").replace("\\", "/").split("/")
    name = ".".join(p for p in parts if p not in ("", ".", ".."))
    return f" (--app takes a module name, as `python -m` does: {name!r}, not a file path)"


def _where_it_failed(exc: BaseException) -> str:
    """``file:line: `` of the app's line that raised (importlib's frames skipped), or ''."""
    import os
    import traceback

    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        path, line = exc.filename, exc.lineno
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if not f.filename.startswith("<") and "importlib" not in f.filename
                  and f.filename != __file__]
        if not frames or frames[-1].lineno is None:
            return ""
        path, line = frames[-1].filename, frames[-1].lineno
    try:
        rel = os.path.relpath(path)
        path = rel if not rel.startswith("..") else path
    except ValueError:  # another drive (Windows)
        pass
    return f"{path}:{line}: "
