"""Put jobs in the table, inside the caller's transaction."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import chain, islice
from json.encoder import encode_basestring_ascii
from typing import Any, overload

import psycopg
from psycopg import sql
from psycopg.pq import Format
from psycopg.types.json import Jsonb

from drainer import otel
from drainer.db import QUERIES, identifiers
from drainer.job import DEFAULT_MAX_ATTEMPTS, RUN_AT_MAX, RUN_AT_MIN
from drainer.settings import DEFAULT_SCHEMA, DEFAULT_TABLE


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


def _q(name: str, schema: str, table: str) -> sql.Composed:
    return sql.SQL(QUERIES[name]).format(**identifiers(schema, table))


def check_run_at(run_at: datetime | None) -> None:
    """ValueError for a run_at the table refuses (before 1970-01-01 or after 9999-01-01)."""
    if run_at is None:
        return
    when = run_at if run_at.tzinfo else run_at.replace(tzinfo=timezone.utc)
    if not RUN_AT_MIN <= when <= RUN_AT_MAX:
        raise ValueError(f"run_at must be between {RUN_AT_MIN.date()} and "
                         f"{RUN_AT_MAX.date()} UTC, not {run_at.isoformat()}")


def _check(queue: str, max_attempts: int) -> None:
    if not queue:
        raise ValueError("queue must be a non-empty string")
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")


def _params(queue: str, payload: Any, run_at: datetime | None, priority: int,
            max_attempts: int, dedup_key: str | None) -> dict[str, Any]:
    """The checked parameters of the ``enqueue`` statement (one job)."""
    _check(queue, max_attempts)
    check_run_at(run_at)
    return {"queue": queue, "payload": Jsonb(payload), "run_at": run_at, "priority": priority,
            "max_attempts": max_attempts, "dedup_key": dedup_key,
            "trace_context": _trace_context()}


def _trace_context() -> Jsonb | None:
    """The current span's W3C trace context, to store with the job (None: no span, or
    OpenTelemetry not in use: then nothing is imported)."""
    carrier = otel.producer_context()
    return None if carrier is None else Jsonb(carrier)


@overload
def enqueue(
    conn: psycopg.Connection[Any], queue: str, payload: Any, *, run_at: datetime | None = ...,
    priority: int = ..., max_attempts: int = ..., dedup_key: str | None = ...,
    schema: str = ..., table: str = ...,
) -> int | None: ...


@overload
def enqueue(
    conn: psycopg.AsyncConnection[Any], queue: str, payload: Any, *,
    run_at: datetime | None = ..., priority: int = ..., max_attempts: int = ...,
    dedup_key: str | None = ..., schema: str = ..., table: str = ...,
) -> Coroutine[Any, Any, int | None]: ...


def enqueue(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    queue: str,
    payload: Any,
    *,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    dedup_key: str | None = None,
    schema: str = DEFAULT_SCHEMA,
    table: str = DEFAULT_TABLE,
) -> int | Coroutine[Any, Any, int | None] | None:
    """Insert one job and return its id, or None when ``dedup_key`` is already queued/running.

    Runs on ``conn`` as it is: inside the caller's open transaction the job commits or
    rolls back with the caller's data (the point of a table queue). With a
    ``psycopg.AsyncConnection`` it returns the awaitable of :func:`enqueue_async`, as
    psycopg's own methods do: ``await enqueue(aconn, ...)``.
    """
    if isinstance(conn, psycopg.AsyncConnection):
        return enqueue_async(conn, queue, payload, run_at=run_at, priority=priority,
                             max_attempts=max_attempts, dedup_key=dedup_key, schema=schema,
                             table=table)
    row = conn.execute(_q("enqueue", schema, table), _params(
        queue, payload, run_at, priority, max_attempts, dedup_key)).fetchone()
    return None if row is None else int(row[0])


async def enqueue_async(
    conn: psycopg.AsyncConnection[Any],
    queue: str,
    payload: Any,
    *,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    dedup_key: str | None = None,
    schema: str = DEFAULT_SCHEMA,
    table: str = DEFAULT_TABLE,
) -> int | None:
    """:func:`enqueue` on a ``psycopg.AsyncConnection``: the same statement, awaited."""
    cur = await conn.execute(_q("enqueue", schema, table), _params(
        queue, payload, run_at, priority, max_attempts, dedup_key))
    row = await cur.fetchone()
    return None if row is None else int(row[0])


def _spec(job: JobSpec | Mapping[str, Any]) -> JobSpec:
    if isinstance(job, JobSpec):
        return job
    return JobSpec(**job)


def _atomic(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> Any:
    """A transaction on an autocommit connection; else the caller's, as it is.

    (``conn.transaction()`` on an idle non-autocommit connection would start a
    transaction and commit it: the jobs would no longer roll back with the caller.)
    ``nullcontext`` is also an async context manager: the async path uses this too.
    """
    return conn.transaction() if conn.autocommit else nullcontext()


_ROW_TYPES = ["text", "jsonb", "timestamptz", "int4", "int4", "text"]
_STAGE_TYPES = ["int8", *_ROW_TYPES, "jsonb"]


@dataclass(slots=True)
class _Bulk:
    """What ``enqueue_many`` will write, checked before anything is sent.

    ``path``: "now" (COPY of jobs due now, run_at by default), "copy" (COPY of every
    column), "stage" (COPY into a staging table, then INSERT ... ON CONFLICT).
    """

    specs: list[JobSpec]
    path: str
    needs_now: bool = False
    trace: Jsonb | None = None  # the producer's trace context, the same for every job

    def rows(self, now: datetime | None = None) -> list[tuple[Any, ...]]:
        """The six-column rows of the "copy" path (run_at filled with ``now``); a seventh,
        the trace context, when there is one."""
        if self.trace is not None:
            return [(*r, self.trace) for r in self._rows(now)]
        return self._rows(now)

    def stage_rows(self) -> list[tuple[Any, ...]]:
        """The rows of the "stage" path: ord, the six columns, the trace context."""
        return [(i, *r, self.trace) for i, r in enumerate(self._rows(None))]

    def _rows(self, now: datetime | None) -> list[tuple[Any, ...]]:
        return [(s.queue, Jsonb(s.payload), s.run_at if s.run_at is not None else now,
                 s.priority, s.max_attempts, s.dedup_key) for s in self.specs]

    @property
    def copy_statement(self) -> str:
        return "enqueue_copy" if self.trace is None else "enqueue_copy_traced"

    @property
    def copy_types(self) -> list[str]:
        return _ROW_TYPES if self.trace is None else [*_ROW_TYPES, "jsonb"]


def _bulk(jobs: Iterable[JobSpec | Mapping[str, Any]]) -> _Bulk | None:
    """Check the batch (the first bad job fails it) and pick its path; None when empty."""
    specs = [j if type(j) is JobSpec else _spec(j) for j in jobs]
    timed = keyed = False
    untimed = False
    for s in specs:
        if not s.queue or s.max_attempts < 1:
            _check(s.queue, s.max_attempts)  # raises the ValueError that names the problem
        if s.run_at is not None:
            check_run_at(s.run_at)
            timed = True
        else:
            untimed = True
        if s.dedup_key is not None:
            keyed = True
    if not specs:
        return None
    trace = _trace_context()
    if keyed:
        return _Bulk(specs, "stage", trace=trace)
    if trace is not None:
        # traced: the "copy" path, whose COPY has a trace_context column
        return _Bulk(specs, "copy", needs_now=untimed, trace=trace)
    if not timed:
        # The common bulk case: run_at is left out of the COPY, so the column default
        # (now(), the transaction's start, as SELECT now() would give) fills it, and
        # dedup_key stays NULL: four columns a row instead of six, no extra round trip.
        return _Bulk(specs, "now")
    # COPY does not apply column defaults to NULLs: run_at is filled with now().
    return _Bulk(specs, "copy", needs_now=untimed)


@overload
def enqueue_many(
    conn: psycopg.Connection[Any], jobs: Iterable[JobSpec | Mapping[str, Any]], *,
    schema: str = ..., table: str = ...,
) -> EnqueueResult: ...


@overload
def enqueue_many(
    conn: psycopg.Connection[Any], jobs: Iterable[Any], *, queue: str | None,
    run_at: datetime | None = ..., priority: int = ..., max_attempts: int = ...,
    dedup_key: str | None = ..., schema: str = ..., table: str = ...,
) -> EnqueueResult: ...


@overload
def enqueue_many(
    conn: psycopg.AsyncConnection[Any], jobs: Iterable[JobSpec | Mapping[str, Any]], *,
    schema: str = ..., table: str = ...,
) -> Coroutine[Any, Any, EnqueueResult]: ...


@overload
def enqueue_many(
    conn: psycopg.AsyncConnection[Any], jobs: Iterable[Any], *, queue: str | None,
    run_at: datetime | None = ..., priority: int = ..., max_attempts: int = ...,
    dedup_key: str | None = ..., schema: str = ..., table: str = ...,
) -> Coroutine[Any, Any, EnqueueResult]: ...


def enqueue_many(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    jobs: Iterable[Any],
    *,
    queue: str | None = None,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    dedup_key: str | None = None,
    schema: str = DEFAULT_SCHEMA,
    table: str = DEFAULT_TABLE,
) -> EnqueueResult | Coroutine[Any, Any, EnqueueResult]:
    """Insert many jobs through COPY, in the caller's transaction.

    ``jobs`` holds JobSpecs (or mappings of their fields); with ``queue=``, it holds
    payloads instead, one job each on that queue, all with the same ``run_at``,
    ``priority``, ``max_attempts`` and ``dedup_key`` (the options of :func:`enqueue`).

    Jobs without a dedup_key go straight into the table; when any job has one, the
    batch is staged in a temporary table (dropped at commit) and inserted with
    ON CONFLICT DO NOTHING, so duplicates are skipped and counted. With a
    ``psycopg.AsyncConnection`` it returns the awaitable of :func:`enqueue_many_async`.
    """
    if isinstance(conn, psycopg.AsyncConnection):
        return enqueue_many_async(conn, jobs, queue=queue, run_at=run_at, priority=priority,
                                  max_attempts=max_attempts, dedup_key=dedup_key,
                                  schema=schema, table=table)
    cur = conn.cursor()
    if queue is not None:
        form = _Payloads.of(queue, jobs, run_at, priority, max_attempts, dedup_key, cur)
        if form is None:
            return EnqueueResult(0, 0)
        if isinstance(form, _Payloads):
            with _atomic(conn), cur.copy(_q("enqueue_copy_now", schema, table)) as copy:
                copy.set_types(_NOW_TYPES)
                write = copy.write
                for chunk in form:
                    write(chunk)
            return EnqueueResult(form.written, 0)
        jobs = form
    else:
        _no_options(run_at, priority, max_attempts, dedup_key)
    if conn.autocommit:
        streamed = _streamable(jobs)
        if isinstance(streamed, _Due):
            with conn.transaction():
                with cur.copy(_q("enqueue_copy_now", schema, table)) as copy:
                    done = _write_now(copy, streamed, text=_stock_text_copy(cur))
                if streamed.rest is None:
                    return EnqueueResult(done, 0)
                rest = _bulk(streamed.rest)
                assert rest is not None  # it holds the job that ended the COPY
                result = _write_bulk(cur, rest, schema, table)
            return EnqueueResult(done + result.enqueued, result.skipped_duplicates)
        jobs = streamed
    bulk = _bulk(jobs)
    if bulk is None:
        return EnqueueResult(0, 0)
    with _atomic(conn):
        return _write_bulk(cur, bulk, schema, table)


def _write_bulk(cur: psycopg.Cursor[Any], bulk: _Bulk, schema: str,
                table: str) -> EnqueueResult:
    """Write a checked batch, in the transaction open on ``cur``'s connection."""
    specs = bulk.specs
    if bulk.path == "now":
        with cur.copy(_q("enqueue_copy_now", schema, table)) as copy:
            _write_now(copy, specs, text=_stock_text_copy(cur))
        return EnqueueResult(len(specs), 0)
    if bulk.path == "copy":
        now = cur.execute(QUERIES["enqueue_now"]).fetchone() if bulk.needs_now else None
        with cur.copy(_q(bulk.copy_statement, schema, table)) as copy:
            copy.set_types(bulk.copy_types)
            for r in bulk.rows(now[0] if now else None):
                copy.write_row(r)
        return EnqueueResult(len(specs), 0)
    cur.execute(QUERIES["enqueue_stage"])
    with cur.copy(QUERIES["enqueue_stage_copy"]) as copy:
        copy.set_types(_STAGE_TYPES)
        for r in bulk.stage_rows():
            copy.write_row(r)
    cur.execute(_q("enqueue_stage_insert", schema, table))
    inserted = cur.rowcount
    cur.execute(QUERIES["enqueue_stage_drop"])
    return EnqueueResult(inserted, len(specs) - inserted)


async def enqueue_many_async(
    conn: psycopg.AsyncConnection[Any],
    jobs: Iterable[Any],
    *,
    queue: str | None = None,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    dedup_key: str | None = None,
    schema: str = DEFAULT_SCHEMA,
    table: str = DEFAULT_TABLE,
) -> EnqueueResult:
    """:func:`enqueue_many` on a ``psycopg.AsyncConnection``: the same statements and COPY
    text, awaited."""
    cur = conn.cursor()
    if queue is not None:
        form = _Payloads.of(queue, jobs, run_at, priority, max_attempts, dedup_key, cur)
        if form is None:
            return EnqueueResult(0, 0)
        if isinstance(form, _Payloads):
            async with _atomic(conn), cur.copy(_q("enqueue_copy_now", schema, table)) as copy:
                copy.set_types(_NOW_TYPES)
                for chunk in form:
                    await copy.write(chunk)
            return EnqueueResult(form.written, 0)
        jobs = form
    else:
        _no_options(run_at, priority, max_attempts, dedup_key)
    if conn.autocommit:
        streamed = _streamable(jobs)
        if isinstance(streamed, _Due):
            async with conn.transaction():
                async with cur.copy(_q("enqueue_copy_now", schema, table)) as copy:
                    done = await _write_now_async(copy, streamed, text=_stock_text_copy(cur))
                if streamed.rest is None:
                    return EnqueueResult(done, 0)
                rest = _bulk(streamed.rest)
                assert rest is not None  # it holds the job that ended the COPY
                result = await _write_bulk_async(cur, rest, schema, table)
            return EnqueueResult(done + result.enqueued, result.skipped_duplicates)
        jobs = streamed
    bulk = _bulk(jobs)
    if bulk is None:
        return EnqueueResult(0, 0)
    async with _atomic(conn):
        return await _write_bulk_async(cur, bulk, schema, table)


async def _write_bulk_async(cur: psycopg.AsyncCursor[Any], bulk: _Bulk, schema: str,
                            table: str) -> EnqueueResult:
    """:func:`_write_bulk` on an async cursor."""
    specs = bulk.specs
    if bulk.path == "now":
        async with cur.copy(_q("enqueue_copy_now", schema, table)) as copy:
            await _write_now_async(copy, specs, text=_stock_text_copy(cur))
        return EnqueueResult(len(specs), 0)
    if bulk.path == "copy":
        now = None
        if bulk.needs_now:
            await cur.execute(QUERIES["enqueue_now"])
            now = await cur.fetchone()
        async with cur.copy(_q(bulk.copy_statement, schema, table)) as copy:
            copy.set_types(bulk.copy_types)
            for r in bulk.rows(now[0] if now else None):
                await copy.write_row(r)
        return EnqueueResult(len(specs), 0)
    await cur.execute(QUERIES["enqueue_stage"])
    async with cur.copy(QUERIES["enqueue_stage_copy"]) as copy:
        copy.set_types(_STAGE_TYPES)
        for r in bulk.stage_rows():
            await copy.write_row(r)
    await cur.execute(_q("enqueue_stage_insert", schema, table))
    inserted = cur.rowcount
    await cur.execute(QUERIES["enqueue_stage_drop"])
    return EnqueueResult(inserted, len(specs) - inserted)


# -- jobs due now, checked as the COPY pulls them ---------------------------------------------

_END: Any = object()


def _streamable(jobs: Iterable[JobSpec | Mapping[str, Any]]
                ) -> _Due | Iterable[JobSpec | Mapping[str, Any]]:
    """A :class:`_Due` over ``jobs`` when they can be checked while the COPY runs (no
    trace context, a first job due now without a dedup_key); else the jobs, for
    :func:`_bulk` (the first one, already read, put back in front).

    Only on an autocommit connection, where enqueue_many opens the transaction: a bad job
    met once rows were sent aborts the COPY and rolls that transaction back, so nothing is
    written and the caller gets the same ValueError as before. In the caller's transaction
    the whole batch is still checked before anything is sent (an aborted COPY would leave
    the caller's transaction failed).
    """
    it = iter(jobs)
    first = next(it, _END)
    if first is _END:
        return ()
    spec = first if type(first) is JobSpec else _spec(first)
    if spec.run_at is not None or spec.dedup_key is not None or _trace_context() is not None:
        return chain((spec,), it)
    return _Due(spec, it)


class _Due:
    """The caller's jobs due now, each checked as it is read (a mapping made a JobSpec),
    for the COPY of :func:`_write_now`: the batch is never held in a list of its own, and
    building it (a generator of JobSpecs) overlaps with the server inserting the rows.

    Iteration stops at the first job with a run_at or a dedup_key: ``rest`` is then that
    job followed by those not read yet, for :func:`_bulk` in the same transaction. A bad
    job raises the ValueError that names it.
    """

    __slots__ = ("first", "jobs", "rest")

    def __init__(self, first: JobSpec, jobs: Iterator[JobSpec | Mapping[str, Any]]) -> None:
        _check(first.queue, first.max_attempts)
        self.first = first
        self.jobs = jobs
        self.rest: Iterator[JobSpec | Mapping[str, Any]] | None = None

    def __iter__(self) -> Iterator[JobSpec]:
        yield self.first
        jobs = self.jobs
        for j in jobs:
            s = j if type(j) is JobSpec else _spec(j)
            if not s.queue or s.max_attempts < 1:
                _check(s.queue, s.max_attempts)  # raises the ValueError that names it
            if s.run_at is not None or s.dedup_key is not None:
                self.rest = chain((s,), jobs)
                return
            yield s


# -- the COPY text of jobs due now, written without psycopg's per-row formatting -------------

_NOW_TYPES = ("text", "jsonb", "int4", "int4")

# COPY's text format: the characters psycopg escapes in a field, and how.
_COPY_SPECIAL = re.compile(r"[\b\t\n\v\f\r\\]")
_COPY_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v", "\f": "\\f",
                 "\r": "\\r", "\\": "\\\\"}

#: Rows joined into one copy.write(): bounds the text held at once.
_CHUNK_ROWS = 256

_PSYCOPG_MODULES = ("psycopg.", "psycopg_c.", "psycopg_binary.")


def _stock_text_copy(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether psycopg would write the rows as _write_now_text does.

    True with psycopg's own dumpers for text and int4, ``json.dumps`` for jsonb (not a
    function set with ``set_json_dumps``) and a UTF-8 connection; otherwise the rows go
    through ``write_row`` as they always did.
    """
    if cur.connection.info.encoding != "utf-8":
        return False
    adapters = cur.adapters
    for name in ("text", "int4", "jsonb"):
        info = adapters.types.get(name)
        if info is None:
            return False
        dumper = adapters.get_dumper_by_oid(info.oid, Format.TEXT)
        if not dumper.__module__.startswith(_PSYCOPG_MODULES):
            return False
        if name == "jsonb" and getattr(dumper(object, cur), "dumps", None) is not json.dumps:
            return False
    return True


def _json_encoder() -> Callable[[Any], str]:
    """``json.dumps(obj)`` (every option at its default), with one encoder per batch.

    ``json.dumps`` builds the C encoder again for every call, most of its time on a small
    payload: this builds it once, with the arguments ``JSONEncoder().encode`` gives it.
    The circular-reference markers start empty for each batch.
    """
    encoder = json.JSONEncoder()
    try:
        from _json import make_encoder
    except ImportError:  # no C accelerator
        return encoder.encode
    encode = make_encoder({}, encoder.default, encode_basestring_ascii, None,
                          encoder.key_separator, encoder.item_separator, False, False, True)
    return lambda obj: "".join(encode(obj, 0))


def _now_row(s: JobSpec) -> tuple[Any, ...]:
    """One (queue, payload, priority, max_attempts) row for ``write_row``."""
    return (s.queue, Jsonb(s.payload), s.priority, s.max_attempts)


def _write_now(copy: psycopg.Copy, specs: Iterable[JobSpec], *, text: bool) -> int:
    """COPY rows of (queue, payload, priority, max_attempts): the text of :class:`_NowText`
    up to the first row that needs psycopg's own formatting; ``write_row`` takes that row
    and the rest. Returns how many rows were written.
    """
    copy.set_types(_NOW_TYPES)
    rows = iter(specs)
    done = 0
    if text:
        chunks = _NowText(rows)
        write = copy.write
        for chunk in chunks:
            write(chunk)
        done = chunks.written
        if chunks.stopped is None:
            return done
        rows = chain((chunks.stopped,), rows)
    write_row = copy.write_row
    for s in rows:
        write_row(_now_row(s))
        done += 1
    return done


async def _write_now_async(copy: psycopg.AsyncCopy, specs: Iterable[JobSpec], *,
                           text: bool) -> int:
    """:func:`_write_now` on an async COPY: the same chunks and rows."""
    copy.set_types(_NOW_TYPES)
    rows = iter(specs)
    done = 0
    if text:
        chunks = _NowText(rows)
        for chunk in chunks:
            await copy.write(chunk)
        done = chunks.written
        if chunks.stopped is None:
            return done
        rows = chain((chunks.stopped,), rows)
    for s in rows:
        await copy.write_row(_now_row(s))
        done += 1
    return done


def _write_now_text(copy: psycopg.Copy, specs: Iterable[JobSpec]) -> int:
    """Write the chunks of :class:`_NowText`; returns how many rows they held."""
    chunks = _NowText(iter(specs))
    write = copy.write
    for chunk in chunks:
        write(chunk)
    return chunks.written


class _NowText:
    """The COPY text of (queue, payload, priority, max_attempts) rows, in chunks.

    Iterating yields the bytes ``write_row`` would send for the same rows, joined in
    chunks of ``_CHUNK_ROWS``, for less than half its CPU time on small payloads (one
    JSON encoder for the batch, no per-field dumper calls). It stops at the first row it
    cannot format exactly so (a queue that is not a str, a priority or max_attempts that
    is not an int, ...): ``written`` then says how many rows were yielded and ``stopped``
    holds that row, for ``write_row`` to take it and the rest of ``rows``, with psycopg's
    own checks and errors. The sync and the async ``enqueue_many`` write the same chunks.
    """

    __slots__ = ("rows", "stopped", "written")

    def __init__(self, rows: Iterable[JobSpec]) -> None:
        self.rows = iter(rows)  # one iterator: each chunk goes on where the last stopped
        self.written = 0
        self.stopped: JobSpec | None = None

    def __iter__(self) -> Iterator[str]:
        dumps = _json_encoder()
        fields: dict[str, str | None] = {}  # queue -> _queue_field(queue)
        rows = self.rows
        while True:
            lines: list[str] = []
            append = lines.append
            for s in islice(rows, _CHUNK_ROWS):
                queue, priority, max_attempts = s.queue, s.priority, s.max_attempts
                field = None
                if type(queue) is str:
                    field = fields.get(queue)
                    if field is None:
                        field = fields[queue] = _queue_field(queue)
                if (field is None or type(priority) is not int
                        or type(max_attempts) is not int):
                    self.stopped = s
                    if lines:
                        self.written += len(lines)
                        yield "".join(lines)
                    return
                payload = dumps(s.payload)
                if "\\" in payload:  # json.dumps writes ASCII, no control characters: only \
                    payload = payload.replace("\\", "\\\\")
                append(f"{field}{payload}\t{priority}\t{max_attempts}\n")
            if not lines:
                return
            self.written += len(lines)
            yield "".join(lines)


def _queue_field(queue: str) -> str | None:
    """The queue's COPY text field and a tab; None when psycopg must format it."""
    if "\x00" in queue:
        return None  # psycopg raises its own error
    try:
        queue.encode()
    except UnicodeEncodeError:  # a lone surrogate: let psycopg raise its error
        return None
    return _COPY_SPECIAL.sub(lambda m: _COPY_ESCAPES[m.group()], queue) + "\t"


# -- payloads on one queue: enqueue_many(conn, payloads, queue=...) ---------------------------


def _no_options(run_at: datetime | None, priority: int, max_attempts: int,
                dedup_key: str | None) -> None:
    """TypeError for job options given with JobSpecs (each carries its own)."""
    if (run_at is not None or priority != 0 or max_attempts != DEFAULT_MAX_ATTEMPTS
            or dedup_key is not None):
        raise TypeError("run_at, priority, max_attempts and dedup_key go with queue= "
                        "(jobs are then payloads); a JobSpec carries its own")


class _Payloads:
    """The COPY text of payloads on one queue, due now: the bytes :class:`_NowText` (and
    so ``write_row``) would send for ``JobSpec(queue, p, priority=..., max_attempts=...)``,
    in chunks of ``_CHUNK_ROWS``, with no JobSpec built. The queue, priority and
    max_attempts fields are the same on every row: only the payload is formatted.
    ``written`` counts the rows yielded so far.
    """

    __slots__ = ("head", "payloads", "tail", "written")

    def __init__(self, head: str, tail: str, payloads: Iterator[Any]) -> None:
        self.head = head
        self.tail = tail
        self.payloads = payloads
        self.written = 0

    @classmethod
    def of(cls, queue: str, payloads: Iterable[Any], run_at: datetime | None, priority: int,
           max_attempts: int, dedup_key: str | None,
           cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]
           ) -> _Payloads | Iterable[JobSpec] | None:
        """Check the options (the ValueError of a bad one, before anything is sent); None
        when there are no payloads; a :class:`_Payloads` for the common case (due now, no
        dedup_key, no trace context, int options, a queue COPY text can carry as it is,
        psycopg's own dumpers); else the JobSpecs, for the paths of JobSpecs."""
        _check(queue, max_attempts)
        check_run_at(run_at)
        it = iter(payloads)
        first = next(it, _END)
        if first is _END:
            return None
        it = chain((first,), it)
        head = _queue_field(queue) if type(queue) is str else None
        if (head is None or run_at is not None or dedup_key is not None
                or type(priority) is not int or type(max_attempts) is not int
                or _trace_context() is not None or not _stock_text_copy(cur)):
            return (JobSpec(queue, p, run_at, priority, max_attempts, dedup_key) for p in it)
        return cls(head, f"\t{priority}\t{max_attempts}\n", it)

    def __iter__(self) -> Iterator[str]:
        dumps = _json_encoder()
        head, tail = self.head, self.tail
        sep = tail + head
        payloads = self.payloads
        while True:
            texts: list[str] = []
            append = texts.append
            for p in islice(payloads, _CHUNK_ROWS):
                text = dumps(p)
                if "\\" in text:  # json.dumps writes ASCII, no control characters: only \
                    text = text.replace("\\", "\\\\")
                append(text)
            if not texts:
                return
            self.written += len(texts)
            yield head + sep.join(texts) + tail
