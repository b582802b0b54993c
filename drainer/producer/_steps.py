"""The statements of an enqueue as steps of one body, and the sync and async drivers.

A body is a generator: it yields each statement to run (:class:`Execute`, :class:`Copy`),
gets its result back and returns what the enqueue returns. :func:`run` drives it on a
``psycopg.Cursor``, :func:`run_async` on a ``psycopg.AsyncCursor``, so the checks, the
choice of statements and the rows are written once for both APIs (psycopg's own protocol
code is written the same way: generators in ``psycopg.generators``, waited on by ``wait``
and ``wait_async``). Only the drivers differ, by their ``await``.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

    #: A statement of queries.sql, as it is or with its identifiers filled in.
    Query = str | sql.Composed

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Execute:
    """Run ``query``; the body gets back its first row (``fetch``) or its rowcount."""

    query: Query
    params: Any = None
    fetch: bool = False


@dataclass(frozen=True, slots=True)
class Copy:
    """COPY ``statement`` FROM STDIN with ``types``: the COPY text ``chunks`` as they are,
    then ``rows`` through ``write_row`` (both read while the COPY is open). The body gets
    back None."""

    statement: Query
    types: Sequence[str]
    rows: Iterable[tuple[Any, ...]]
    chunks: Iterable[str] = ()


#: An enqueue's body: yields its steps, is sent each one's result, returns a T.
Steps = Generator[Execute | Copy, Any, T]


def run(cur: psycopg.Cursor[Any], steps: Steps[T]) -> T:
    """Run the steps of ``steps`` on ``cur``; what the body returns."""
    result: Any = None
    while True:
        try:
            step = steps.send(result)
        except StopIteration as done:
            value: T = done.value
            return value
        if isinstance(step, Execute):
            cur.execute(step.query, step.params)
            result = cur.fetchone() if step.fetch else cur.rowcount
        else:
            with cur.copy(step.statement) as copy:
                write(copy, step)
            result = None


async def run_async(cur: psycopg.AsyncCursor[Any], steps: Steps[T]) -> T:
    """:func:`run` on an async cursor: the same steps, awaited."""
    result: Any = None
    while True:
        try:
            step = steps.send(result)
        except StopIteration as done:
            value: T = done.value
            return value
        if isinstance(step, Execute):
            await cur.execute(step.query, step.params)
            result = await cur.fetchone() if step.fetch else cur.rowcount
        else:
            async with cur.copy(step.statement) as copy:
                copy.set_types(step.types)
                for chunk in step.chunks:
                    await copy.write(chunk)
                for row in step.rows:
                    await copy.write_row(row)
            result = None


def write(copy: psycopg.Copy, step: Copy) -> None:
    """Send the chunks and rows of ``step`` into the open ``copy``."""
    copy.set_types(step.types)
    send = copy.write
    for chunk in step.chunks:
        send(chunk)
    write_row = copy.write_row
    for row in step.rows:
        write_row(row)


def atomic(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> Any:
    """A transaction on an autocommit connection; else the caller's, as it is.

    (``conn.transaction()`` on an idle non-autocommit connection would start a
    transaction and commit it: the jobs would no longer roll back with the caller.)
    ``nullcontext`` is also an async context manager: the async API uses this too.
    """
    return conn.transaction() if conn.autocommit else nullcontext()
