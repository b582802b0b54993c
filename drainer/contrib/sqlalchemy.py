"""Enqueue from SQLAlchemy 2: into the session's transaction, on the session's own connection.

::

    from drainer.contrib.sqlalchemy import enqueue

    with Session(engine) as session, session.begin():
        session.add(Order(id=42))
        enqueue(session, "emails", {"order": 42})            # commits with the order

    async with AsyncSession(async_engine) as session, session.begin():
        session.add(Order(id=43))
        await enqueue(session, "emails", {"order": 43})

The engine must use the psycopg driver (``postgresql+psycopg://``): the job is written
through the psycopg connection SQLAlchemy already checked out for the transaction, so there
is no second pool and no second transaction. With ``trigger=settings`` (a
:class:`drainer.settings.Settings` with ``trigger_url``) one drain trigger is fired after the
session commits (SQLAlchemy's ``after_commit`` event), none after a rollback; in an async
session the POST is a background task on the running loop.

SQLAlchemy's asyncio extension needs greenlet, which SQLAlchemy 2.1 no longer installs:
this module never imports it, so a synchronous Session works without greenlet (an
AsyncSession exists only where the extension, and so greenlet, was imported).
"""

from __future__ import annotations

import sys
from collections.abc import Coroutine, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias, overload

import psycopg
from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from drainer import producer
from drainer.job import DEFAULT_MAX_ATTEMPTS, QueueRef, queue_of
from drainer.producer import EnqueueResult, JobSpec
from drainer.settings import DEFAULT_SCHEMA, DEFAULT_TABLE
from drainer.trigger import fire_after_commit

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from typing_extensions import TypeIs

    from drainer.settings import Settings

__all__ = ["enqueue", "enqueue_async", "enqueue_many", "enqueue_many_async"]

SyncTarget: TypeAlias = "Session | Connection"
AsyncTarget: TypeAlias = "AsyncSession | AsyncConnection"

_PENDING_KEY = "drainer.trigger.pending"
_LISTENING_KEY = "drainer.trigger.listening"


def _is_async(target: SyncTarget | AsyncTarget) -> TypeIs[AsyncTarget]:
    """Whether ``target`` is an AsyncSession or an AsyncConnection, without importing
    SQLAlchemy's asyncio extension (and greenlet) to ask: one exists only once it is."""
    extension = sys.modules.get("sqlalchemy.ext.asyncio")
    return extension is not None and isinstance(
        target, extension.AsyncSession | extension.AsyncConnection)


def _psycopg(raw: Any, what: str) -> Any:
    driver = getattr(raw, "driver_connection", None)
    if not isinstance(driver, psycopg.Connection | psycopg.AsyncConnection):
        raise TypeError(
            f"drainer.contrib.sqlalchemy needs the psycopg driver (postgresql+psycopg://); "
            f"this {what} has {type(driver).__module__}.{type(driver).__qualname__}"
        )
    return driver


def _sync_conn(target: SyncTarget) -> psycopg.Connection[Any]:
    """The psycopg connection of ``target``'s transaction (begun if none is)."""
    if isinstance(target, Session):
        conn = target.connection()  # autobegins the session's transaction
    elif isinstance(target, Connection):
        conn = target
        if not conn.in_transaction():
            conn.begin()  # the caller's commit() commits it, rollback() rolls it back
    else:
        raise TypeError(f"expected a Session or a Connection, got {type(target).__name__}")
    driver: psycopg.Connection[Any] = _psycopg(conn.connection, type(target).__name__)
    return driver


async def _async_conn(target: AsyncTarget) -> psycopg.AsyncConnection[Any]:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(target, AsyncSession):
        conn = await target.connection()
    elif isinstance(target, AsyncConnection):
        conn = target
        if not conn.in_transaction():
            await conn.begin()
    else:
        raise TypeError(
            f"expected an AsyncSession or an AsyncConnection, got {type(target).__name__}")
    raw = await conn.get_raw_connection()
    driver: psycopg.AsyncConnection[Any] = _psycopg(raw, type(target).__name__)
    return driver


def _on_commit(session: Session) -> None:
    pending: dict[int, Settings] = session.info.pop(_PENDING_KEY, {})
    for settings in pending.values():
        fire_after_commit(settings)


def _on_rollback(session: Session) -> None:
    session.info.pop(_PENDING_KEY, None)


def _session_of(target: SyncTarget | AsyncTarget, settings: Settings | None
                ) -> Session | None:
    """The Session whose commit fires the trigger; None without ``trigger=``.

    Checked before anything is written: a Connection has no after-commit event.
    """
    if settings is None:
        return None
    if _is_async(target):
        from sqlalchemy.ext.asyncio import AsyncSession

        if isinstance(target, AsyncSession):
            return target.sync_session
    if isinstance(target, Session):
        return target
    raise TypeError(
        "trigger= needs a Session or an AsyncSession (SQLAlchemy has no after-commit "
        "event on a Connection): enqueue through a session, or call "
        "drainer.trigger.fire(settings) after your commit"
    )


def _want_trigger(session: Session | None, settings: Settings | None) -> None:
    """Ask for one trigger after ``session`` commits (nothing on rollback)."""
    if session is None or settings is None:
        return
    if not session.info.get(_LISTENING_KEY):
        event.listen(session, "after_commit", _on_commit)
        event.listen(session, "after_rollback", _on_rollback)
        session.info[_LISTENING_KEY] = True
    session.info.setdefault(_PENDING_KEY, {})[id(settings)] = settings


@overload
def enqueue(target: SyncTarget, queue: QueueRef, payload: Any, *, run_at: datetime | None = ...,
            priority: int = ..., max_attempts: int = ..., dedup_key: str | None = ...,
            schema: str = ..., table: str = ..., trigger: Settings | None = ...
            ) -> int | None: ...


@overload
def enqueue(target: AsyncTarget, queue: QueueRef, payload: Any, *, run_at: datetime | None = ...,
            priority: int = ..., max_attempts: int = ..., dedup_key: str | None = ...,
            schema: str = ..., table: str = ..., trigger: Settings | None = ...
            ) -> Coroutine[Any, Any, int | None]: ...


def enqueue(target: SyncTarget | AsyncTarget, queue: QueueRef, payload: Any, *,
            run_at: datetime | None = None, priority: int = 0,
            max_attempts: int = DEFAULT_MAX_ATTEMPTS, dedup_key: str | None = None,
            schema: str = DEFAULT_SCHEMA, table: str = DEFAULT_TABLE,
            trigger: Settings | None = None) -> int | Coroutine[Any, Any, int | None] | None:
    """:func:`drainer.producer.enqueue` in the transaction of a Session or a Connection.

    ``queue`` is a queue name or a ``@task`` handler (its queue: no name to misspell).
    Returns the job's id (None for a dedup_key already queued or running). With an
    AsyncSession or an AsyncConnection it returns the awaitable of :func:`enqueue_async`.
    """
    options: dict[str, Any] = {"run_at": run_at, "priority": priority,
                               "max_attempts": max_attempts, "dedup_key": dedup_key,
                               "schema": schema, "table": table}
    if _is_async(target):
        return enqueue_async(target, queue, payload, trigger=trigger, **options)
    session = _session_of(target, trigger)
    job_id = producer.enqueue(_sync_conn(target), queue_of(queue), payload, **options)
    if job_id is not None:
        _want_trigger(session, trigger)
    return job_id


async def enqueue_async(target: AsyncTarget, queue: QueueRef, payload: Any, *,
                        trigger: Settings | None = None, **options: Any) -> int | None:
    """:func:`enqueue` for an AsyncSession or an AsyncConnection (same options)."""
    session = _session_of(target, trigger)
    job_id = await producer.enqueue_async(await _async_conn(target), queue_of(queue), payload,
                                          **options)
    if job_id is not None:
        _want_trigger(session, trigger)
    return job_id


@overload
def enqueue_many(target: SyncTarget, jobs: Iterable[JobSpec | Mapping[str, Any]], *,
                 schema: str = ..., table: str = ..., trigger: Settings | None = ...
                 ) -> EnqueueResult: ...


@overload
def enqueue_many(target: SyncTarget, jobs: Iterable[Any], *, queue: QueueRef | None,
                 schema: str = ..., table: str = ..., trigger: Settings | None = ...,
                 **options: Any) -> EnqueueResult: ...


@overload
def enqueue_many(target: AsyncTarget, jobs: Iterable[JobSpec | Mapping[str, Any]], *,
                 schema: str = ..., table: str = ..., trigger: Settings | None = ...
                 ) -> Coroutine[Any, Any, EnqueueResult]: ...


@overload
def enqueue_many(target: AsyncTarget, jobs: Iterable[Any], *, queue: QueueRef | None,
                 schema: str = ..., table: str = ..., trigger: Settings | None = ...,
                 **options: Any) -> Coroutine[Any, Any, EnqueueResult]: ...


def enqueue_many(target: SyncTarget | AsyncTarget, jobs: Iterable[Any], *,
                 queue: QueueRef | None = None, schema: str = DEFAULT_SCHEMA,
                 table: str = DEFAULT_TABLE, trigger: Settings | None = None, **options: Any
                 ) -> EnqueueResult | Coroutine[Any, Any, EnqueueResult]:
    """:func:`drainer.producer.enqueue_many` (COPY) in the transaction of ``target``;
    with ``queue=`` (a name or a ``@task`` handler), ``jobs`` are payloads on that queue,
    with the ``options`` of :func:`enqueue`."""
    if _is_async(target):
        return enqueue_many_async(target, jobs, queue=queue, schema=schema, table=table,
                                  trigger=trigger, **options)
    session = _session_of(target, trigger)
    result = producer.enqueue_many(_sync_conn(target), jobs,
                                   queue=None if queue is None else queue_of(queue),
                                   schema=schema, table=table, **options)
    if result.enqueued:
        _want_trigger(session, trigger)
    return result


async def enqueue_many_async(target: AsyncTarget, jobs: Iterable[Any], *,
                             queue: QueueRef | None = None, schema: str = DEFAULT_SCHEMA,
                             table: str = DEFAULT_TABLE, trigger: Settings | None = None,
                             **options: Any) -> EnqueueResult:
    """:func:`enqueue_many` for an AsyncSession or an AsyncConnection."""
    session = _session_of(target, trigger)
    result = await producer.enqueue_many_async(
        await _async_conn(target), jobs, queue=None if queue is None else queue_of(queue),
        schema=schema, table=table, **options)
    if result.enqueued:
        _want_trigger(session, trigger)
    return result
