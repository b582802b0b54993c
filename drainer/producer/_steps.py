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

import psycopg

from drainer.errors import JobRejected

if TYPE_CHECKING:
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


def rejected(exc: psycopg.DataError | UnicodeEncodeError) -> JobRejected:
    """What a value the table cannot store was, in one line: psycopg's error (the server's
    or its own, raised before sending) says it in PostgreSQL's terms, without the field."""
    errors = psycopg.errors
    if isinstance(exc, UnicodeEncodeError):
        what = "a string holds a lone surrogate (\\ud800-\\udfff), which is not Unicode text"
    elif isinstance(exc, errors.UntranslatableCharacter):
        what = "a payload string or key holds \\u0000 (NUL), which jsonb cannot store"
    elif isinstance(exc, errors.InvalidTextRepresentation):
        what = ("the payload is not JSON that jsonb can store (NaN, Infinity, or a lone "
                "surrogate \\ud800-\\udfff in a string)")
    elif isinstance(exc, errors.NumericValueOutOfRange):
        what = "priority or max_attempts is out of range (a 32-bit integer)"
    elif "NUL" in str(exc):
        what = "the queue or dedup_key holds a NUL (0x00), which a text column cannot store"
    else:
        what = "a value the jobs table cannot store"
    text = " ".join(str(exc).split())
    return JobRejected(f"cannot enqueue: {what} ({type(exc).__name__}: {text})")


def run(cur: psycopg.Cursor[Any], steps: Steps[T]) -> T:
    """Run the steps of ``steps`` on ``cur``; what the body returns."""
    try:
        return _run(cur, steps)
    except (psycopg.DataError, UnicodeEncodeError) as exc:
        raise rejected(exc) from exc


def _run(cur: psycopg.Cursor[Any], steps: Steps[T]) -> T:
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
    try:
        return await _run_async(cur, steps)
    except (psycopg.DataError, UnicodeEncodeError) as exc:
        raise rejected(exc) from exc


async def _run_async(cur: psycopg.AsyncCursor[Any], steps: Steps[T]) -> T:
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
