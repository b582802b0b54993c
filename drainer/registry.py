"""Registering handlers: ``@task`` and ``drainer.recurring(...)`` declare into a
:class:`Registry`, where the drain looks a queue's handler up."""

from __future__ import annotations

import functools
import inspect
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

from drainer.errors import ConfigError
from drainer.job import Job, Retry
from drainer.queue_limits import Rate, parse_rate
from drainer.recurring import CATCH_UP_MAX, DEFAULT_CATCH_UP, Definition, define

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterable

    import psycopg


Handler = Callable[[Job], Any]

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class TaskHandler(Protocol[R_co]):
    """What ``@task`` returns: the handler itself, still a plain callable, plus producers bound
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
            return _with_producers(func, queue, max_attempts)

        definition = None
        if cron is not None:
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
        """Declare a recurring job in this registry (see :func:`recurring`)."""
        return recurring(queue, cron, registry=self, **kwargs)

    def get(self, queue: str) -> Task | None:
        return self.tasks.get(queue)

    def queues(self) -> list[str]:
        return sorted(self.tasks)

    def clear(self) -> None:
        self.tasks.clear()
        self.schedules.clear()


def _with_producers(func: Callable[[Job], R], queue: str, max_attempts: int | None
                    ) -> TaskHandler[R]:
    """The handler with its producers bound to ``queue``, as attributes of the function
    itself: calling it, inspecting it (async or not), pickling it by name work as on the
    undecorated function."""
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


def recurring(queue: str, cron: str, *, key: str | None = None,
              payload: Mapping[str, Any] | None = None, timezone: str | None = None,
              catch_up: str = DEFAULT_CATCH_UP, catch_up_max: int = CATCH_UP_MAX,
              priority: int = 0, max_attempts: int | None = None,
              registry: Registry | None = None) -> Definition:
    """``drainer.recurring(...)``: declare a recurring job on ``queue`` (in the default
    registry unless given one).

    ``key`` names the series (default: the queue name) and must be unique; ``payload`` is
    the payload of every occurrence (a dict; drainer adds
    :data:`drainer.recurring.SCHEDULED_FOR_KEY`); ``timezone`` is an IANA name (default
    UTC); ``catch_up`` is ``latest``, ``all`` or ``skip`` (see :mod:`drainer.recurring`).
    Raises ConfigError on a bad definition.
    """
    definition = define(queue, cron, key=key, payload=payload, timezone=timezone,
                        catch_up=catch_up, catch_up_max=catch_up_max, priority=priority,
                        max_attempts=max_attempts)
    (registry or default_registry).add_recurring(definition)
    return definition


class _DeclaringModule(types.ModuleType):
    """The module :mod:`drainer.recurring`, callable as :func:`recurring`.

    Importing a submodule makes it the package's attribute of that name, so once anything
    has imported ``drainer.recurring``, ``drainer.recurring`` is the module: calling it
    must declare a job all the same. The registry makes it callable, not the module
    itself, which keeps the definitions free of the registry.
    """

    def __call__(self, queue: str, cron: str, **kwargs: Any) -> Definition:
        return recurring(queue, cron, **kwargs)


sys.modules["drainer.recurring"].__class__ = _DeclaringModule
