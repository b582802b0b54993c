"""Ask for a drain after a commit: POST to the drain URL (a failed trigger loses nothing)."""

from __future__ import annotations

import asyncio
import http.client
import logging
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

from drainer._redact import redact

if TYPE_CHECKING:
    import psycopg

    from drainer.job import QueueRef
    from drainer.producer import EnqueueResult
    from drainer.settings import Settings

logger = logging.getLogger(__name__)

#: Seconds a producer waits for the trigger's answer: short, the job is already committed.
TRIGGER_TIMEOUT_S = 2.0


def fire(settings: Settings, timeout: float = TRIGGER_TIMEOUT_S) -> bool:
    """POST to ``settings.trigger_url``; True when it answered 2xx.

    Never raises: the job is committed either way and the next scheduled drain takes it.
    """
    url = settings.trigger_url
    if not url:
        return False
    request = urllib.request.Request(url, data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
    if settings.trigger_token is not None:
        request.add_header("Authorization",
                           f"Bearer {settings.trigger_token.get_secret_value()}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status: int = response.status
            ok = 200 <= status < 300
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        logger.warning("drain trigger to %s failed (the job is queued; the next drain takes "
                       "it): %s", redact(url), redact(str(exc)))
        return False
    if not ok:
        logger.warning("drain trigger to %s answered %s", redact(url), status)
    return ok


async def fire_async(settings: Settings, timeout: float = TRIGGER_TIMEOUT_S) -> bool:
    """:func:`fire` for async code: the POST runs in a worker thread, the event loop goes on.

    Never raises, and waits at most about ``timeout`` seconds for the answer.
    """
    if not settings.trigger_url:
        return False
    return await asyncio.to_thread(fire, settings, timeout)


#: Triggers fired by :func:`fire_after_commit` from a running event loop, kept until done.
_PENDING: set[asyncio.Task[bool]] = set()


def fire_after_commit(settings: Settings, timeout: float = TRIGGER_TIMEOUT_S) -> None:
    """Fire the trigger from a commit hook (SQLAlchemy's after_commit, Django's on_commit).

    In a thread with a running event loop (an async session, an ASGI app) the POST is a
    background task, so the loop never waits on it; elsewhere it runs here, with the
    short ``timeout``. Never raises: the job is committed either way.
    """
    if not settings.trigger_url:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        fire(settings, timeout=timeout)
        return
    task = loop.create_task(fire_async(settings, timeout=timeout))
    _PENDING.add(task)
    task.add_done_callback(_PENDING.discard)


async def wait_fired() -> None:
    """Wait for the triggers :func:`fire_after_commit` started in the background (tests,
    or an app's shutdown that wants them sent)."""
    while _PENDING:
        await asyncio.gather(*_PENDING)


class _Transaction:
    """What the sync and the async trigger transactions share: the count of jobs that
    asks for the trigger, and where they go."""

    def __init__(self, conn: Any, settings: Settings) -> None:
        self.conn = conn
        self.settings = settings
        self.enqueued = 0
        self.fired: bool | None = None
        """None until the block ends; then whether the trigger answered 2xx."""

    def mark(self, n: int = 1) -> None:
        """Ask for a drain after commit for jobs inserted some other way (plain SQL)."""
        self.enqueued += n

    def _where(self, options: dict[str, Any]) -> dict[str, Any]:
        """The producer's options, on this transaction's schema and table."""
        return {"schema": self.settings.schema_name, "table": self.settings.table, **options}

    def _one(self, job_id: int | None) -> int | None:
        if job_id is not None:
            self.enqueued += 1
        return job_id

    def _many(self, result: EnqueueResult) -> int:
        self.enqueued += result.enqueued
        return result.enqueued


def _check_idle(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
                name: str) -> None:
    from psycopg import pq

    if conn.info.transaction_status != pq.TransactionStatus.IDLE:
        raise ValueError(
            f"drainer.trigger.{name} needs a connection with no transaction open: the "
            "trigger must fire after the commit, which an outer transaction would delay"
        )


class TriggerTransaction(_Transaction):
    """The open transaction of :func:`transaction`: enqueue through it, or mark it."""

    conn: psycopg.Connection[Any]

    def enqueue(self, queue: QueueRef, payload: Any, **options: Any) -> int | None:
        """:func:`drainer.producer.enqueue` on this transaction's connection and table
        (``queue``: a name or a ``@task`` handler)."""
        from drainer.job import queue_of
        from drainer.producer import enqueue

        return self._one(enqueue(self.conn, queue_of(queue), payload, **self._where(options)))

    def enqueue_many(self, jobs: Iterable[Any], *, queue: QueueRef | None = None,
                     **options: Any) -> int:
        """:func:`drainer.producer.enqueue_many` on this transaction; returns jobs inserted
        (with ``queue=``, a name or a ``@task`` handler, ``jobs`` are its payloads)."""
        from drainer.job import queue_of
        from drainer.producer import enqueue_many

        return self._many(enqueue_many(self.conn, jobs,
                                       queue=None if queue is None else queue_of(queue),
                                       **self._where(options)))


@contextmanager
def transaction(conn: psycopg.Connection[Any], settings: Settings,
                timeout: float = TRIGGER_TIMEOUT_S) -> Iterator[TriggerTransaction]:
    """Run the block in a transaction; after it commits, fire one drain trigger.

    ::

        with drainer.trigger.transaction(conn, settings) as tx:
            conn.execute("INSERT INTO orders ...")
            tx.enqueue("emails", {"order": 42})

    Nothing fires when the block raises (the transaction rolls back) or enqueued
    nothing; many enqueues fire one trigger. The trigger is a POST with a short timeout
    that never raises: when it fails the job is still committed and the next scheduled
    drain takes it. ``conn`` must have no transaction open (otherwise the commit would
    not be ours to see): raises ValueError.
    """
    from psycopg import AsyncConnection

    if isinstance(conn, AsyncConnection):
        raise TypeError("drainer.trigger.transaction needs a psycopg.Connection; for a "
                        "psycopg.AsyncConnection use `async with "
                        "drainer.trigger.transaction_async(conn, settings) as tx`")
    _check_idle(conn, "transaction")
    tx = TriggerTransaction(conn, settings)
    committed = False
    with conn.transaction():
        yield tx
        committed = True  # the block ended normally; COMMIT errors raise out of the `with`
    # not committed: psycopg.Rollback raised in the block, rolled back and swallowed
    tx.fired = committed and tx.enqueued > 0 and fire(settings, timeout=timeout)


def enqueue_and_trigger(conn: psycopg.Connection[Any], settings: Settings, queue: str,
                        payload: Any, **options: Any) -> int | None:
    """Enqueue one job in its own transaction and fire the trigger once it committed."""
    with transaction(conn, settings) as tx:
        return tx.enqueue(queue, payload, **options)


class AsyncTriggerTransaction(_Transaction):
    """The open transaction of :func:`transaction_async`: enqueue through it, or mark it."""

    conn: psycopg.AsyncConnection[Any]

    async def enqueue(self, queue: QueueRef, payload: Any, **options: Any) -> int | None:
        """:func:`drainer.producer.enqueue_async` on this transaction's connection and table
        (``queue``: a name or a ``@task`` handler)."""
        from drainer.job import queue_of
        from drainer.producer import enqueue_async

        return self._one(await enqueue_async(self.conn, queue_of(queue), payload,
                                             **self._where(options)))

    async def enqueue_many(self, jobs: Iterable[Any], *, queue: QueueRef | None = None,
                           **options: Any) -> int:
        """:func:`drainer.producer.enqueue_many_async` on this transaction; returns jobs
        inserted (with ``queue=``, ``jobs`` are its payloads)."""
        from drainer.job import queue_of
        from drainer.producer import enqueue_many_async

        return self._many(await enqueue_many_async(
            self.conn, jobs, queue=None if queue is None else queue_of(queue),
            **self._where(options)))


@asynccontextmanager
async def transaction_async(conn: psycopg.AsyncConnection[Any], settings: Settings,
                            timeout: float = TRIGGER_TIMEOUT_S
                            ) -> AsyncIterator[AsyncTriggerTransaction]:
    """:func:`transaction` for a ``psycopg.AsyncConnection``::

        async with drainer.trigger.transaction_async(aconn, settings) as tx:
            await aconn.execute("INSERT INTO orders ...")
            await tx.enqueue("emails", {"order": 42})

    The same guarantees: one trigger after the commit, none on rollback or when nothing
    was enqueued, a short timeout, never raises (the POST runs in a worker thread, the
    event loop is not blocked). ``conn`` must have no transaction open: ValueError.
    """
    _check_idle(conn, "transaction_async")
    tx = AsyncTriggerTransaction(conn, settings)
    committed = False
    async with conn.transaction():
        yield tx
        committed = True
    tx.fired = committed and tx.enqueued > 0 and await fire_async(settings, timeout=timeout)


async def enqueue_and_trigger_async(conn: psycopg.AsyncConnection[Any], settings: Settings,
                                    queue: str, payload: Any, **options: Any) -> int | None:
    """Enqueue one job in its own transaction and fire the trigger once it committed."""
    async with transaction_async(conn, settings) as tx:
        return await tx.enqueue(queue, payload, **options)
