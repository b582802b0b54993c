"""enqueue_many: the path a batch takes (which COPY, or a staging table), and its steps."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from itertools import chain
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from drainer.db import QUERIES
from drainer.job import DEFAULT_MAX_ATTEMPTS
from drainer.producer._copy_text import NOW_TYPES, NowText, Payloads, queue_field, stock_text_copy
from drainer.producer._spec import (
    EnqueueResult,
    JobSpec,
    check,
    check_run_at,
    spec,
    statement,
    trace_context,
)
from drainer.producer._steps import Copy, Execute, Steps

if TYPE_CHECKING:
    import psycopg

Jobs = Iterable[JobSpec | Mapping[str, Any]]

_END: Any = object()
_ROW_TYPES = ["text", "jsonb", "timestamptz", "int4", "int4", "text"]
_STAGE_TYPES = ["int8", *_ROW_TYPES, "jsonb"]


def plan(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any], jobs: Iterable[Any],
         queue: str | None, run_at: datetime | None, priority: int, max_attempts: int,
         dedup_key: str | None, schema: str, table: str) -> Steps[EnqueueResult] | None:
    """The steps that write the batch, or None when it is empty.

    Whatever can be checked before anything is sent is checked here (the ValueError or
    TypeError that names the problem). On an autocommit connection, where enqueue_many
    opens the transaction, jobs due now are checked as the COPY reads them (see
    :func:`_streamable`); in the caller's transaction the whole batch is checked first.
    """
    text = stock_text_copy(cur)
    if queue is not None:
        check(queue, max_attempts)
        check_run_at(run_at)
        it = iter(jobs)
        first = next(it, _END)
        if first is _END:
            return None
        it = chain((first,), it)
        head = queue_field(queue) if type(queue) is str else None
        if (head is not None and text and run_at is None and dedup_key is None
                and type(priority) is int and type(max_attempts) is int
                and trace_context() is None):
            # payloads on one queue, due now: no JobSpec built, only the payload formatted
            return _copy_payloads(Payloads(head, f"\t{priority}\t{max_attempts}\n", it),
                                  schema, table)
        jobs = (JobSpec(queue, p, run_at, priority, max_attempts, dedup_key) for p in it)
    elif (run_at is not None or priority != 0 or max_attempts != DEFAULT_MAX_ATTEMPTS
            or dedup_key is not None):
        raise TypeError("run_at, priority, max_attempts and dedup_key go with queue= "
                        "(jobs are then payloads); a JobSpec carries its own")
    if cur.connection.autocommit:
        streamed = _streamable(jobs)
        if isinstance(streamed, _Due):
            return _copy_due(streamed, text, schema, table)
        jobs = streamed
    bulk = _bulk(jobs)
    return None if bulk is None else _write(bulk, text, schema, table)


def _copy_payloads(payloads: Payloads, schema: str, table: str) -> Steps[EnqueueResult]:
    yield Copy(statement("enqueue_copy_now", schema, table), NOW_TYPES, (), payloads)
    return EnqueueResult(payloads.written, 0)


def _copy_now(specs: Iterable[JobSpec], text: bool, schema: str, table: str) -> Steps[int]:
    """COPY jobs due now (run_at left to its default); how many were written."""
    rows = NowText(specs, text)
    yield Copy(statement("enqueue_copy_now", schema, table), NOW_TYPES, rows.rows(), rows)
    return rows.written


def _copy_due(due: _Due, text: bool, schema: str, table: str) -> Steps[EnqueueResult]:
    """The jobs due now as the COPY reads them; the rest, if any, by their own path in the
    same transaction."""
    done = yield from _copy_now(due, text, schema, table)
    if due.rest is None:
        return EnqueueResult(done, 0)
    rest = _bulk(due.rest)
    assert rest is not None  # it holds the job that ended the COPY
    result = yield from _write(rest, text, schema, table)
    return EnqueueResult(done + result.enqueued, result.skipped_duplicates)


def _write(bulk: _Bulk, text: bool, schema: str, table: str) -> Steps[EnqueueResult]:
    """Write a checked batch, in the transaction the driver holds open."""
    specs = bulk.specs
    if bulk.path == "now":
        yield from _copy_now(specs, text, schema, table)
        return EnqueueResult(len(specs), 0)
    if bulk.path == "copy":
        now = (yield Execute(QUERIES["enqueue_now"], fetch=True)) if bulk.needs_now else None
        yield Copy(statement(bulk.copy_statement, schema, table), bulk.copy_types,
                   bulk.rows(now[0] if now else None))
        return EnqueueResult(len(specs), 0)
    yield Execute(QUERIES["enqueue_stage"])
    yield Copy(QUERIES["enqueue_stage_copy"], _STAGE_TYPES, bulk.stage_rows())
    inserted: int = yield Execute(statement("enqueue_stage_insert", schema, table))
    yield Execute(QUERIES["enqueue_stage_drop"])
    return EnqueueResult(inserted, len(specs) - inserted)


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


def _bulk(jobs: Jobs) -> _Bulk | None:
    """Check the batch (the first bad job fails it) and pick its path; None when empty."""
    specs = [j if type(j) is JobSpec else spec(j) for j in jobs]
    timed = keyed = untimed = False
    for s in specs:
        if not s.queue or s.max_attempts < 1:
            check(s.queue, s.max_attempts)  # raises the ValueError that names the problem
        if s.run_at is not None:
            check_run_at(s.run_at)
            timed = True
        else:
            untimed = True
        if s.dedup_key is not None:
            keyed = True
    if not specs:
        return None
    trace = trace_context()
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


# -- jobs due now, checked as the COPY pulls them ---------------------------------------------


def _streamable(jobs: Jobs) -> _Due | Jobs:
    """A :class:`_Due` over ``jobs`` when they can be checked while the COPY runs (no
    trace context, a first job due now without a dedup_key); else the jobs, for
    :func:`_bulk` (the first one, already read, put back in front).

    Only on an autocommit connection, where enqueue_many opens the transaction: a bad job
    met once rows were sent aborts the COPY and rolls that transaction back, so nothing is
    written and the caller gets the ValueError that names the job. In the caller's
    transaction the whole batch is checked before anything is sent (an aborted COPY would
    leave the caller's transaction failed).
    """
    it = iter(jobs)
    first = next(it, _END)
    if first is _END:
        return ()
    s = first if type(first) is JobSpec else spec(first)
    if s.run_at is not None or s.dedup_key is not None or trace_context() is not None:
        return chain((s,), it)
    return _Due(s, it)


class _Due:
    """The caller's jobs due now, each checked as it is read (a mapping made a JobSpec),
    for the COPY of :func:`_copy_now`: the batch is never held in a list of its own, and
    building it (a generator of JobSpecs) overlaps with the server inserting the rows.

    Iteration stops at the first job with a run_at or a dedup_key: ``rest`` is then that
    job followed by those not read yet, for :func:`_bulk` in the same transaction. A bad
    job raises the ValueError that names it.
    """

    __slots__ = ("first", "jobs", "rest")

    def __init__(self, first: JobSpec, jobs: Iterator[JobSpec | Mapping[str, Any]]) -> None:
        check(first.queue, first.max_attempts)
        self.first = first
        self.jobs = jobs
        self.rest: Iterator[JobSpec | Mapping[str, Any]] | None = None

    def __iter__(self) -> Iterator[JobSpec]:
        yield self.first
        jobs = self.jobs
        for j in jobs:
            s = j if type(j) is JobSpec else spec(j)
            if not s.queue or s.max_attempts < 1:
                check(s.queue, s.max_attempts)  # raises the ValueError that names it
            if s.run_at is not None or s.dedup_key is not None:
                self.rest = chain((s,), jobs)
                return
            yield s
