"""Put jobs in the table, inside the caller's transaction."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from json.encoder import encode_basestring_ascii
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import Format
from psycopg.types.json import Jsonb

from drainer.db import QUERIES, identifiers
from drainer.settings import DEFAULT_MAX_ATTEMPTS, DEFAULT_SCHEMA, DEFAULT_TABLE


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


def _check(queue: str, max_attempts: int) -> None:
    if not queue:
        raise ValueError("queue must be a non-empty string")
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")


def enqueue(
    conn: psycopg.Connection[Any],
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
    """Insert one job and return its id, or None when ``dedup_key`` is already queued/running.

    Runs on ``conn`` as it is: inside the caller's open transaction the job commits or
    rolls back with the caller's data (the point of a table queue).
    """
    _check(queue, max_attempts)
    row = conn.execute(_q("enqueue", schema, table), {
        "queue": queue, "payload": Jsonb(payload), "run_at": run_at, "priority": priority,
        "max_attempts": max_attempts, "dedup_key": dedup_key,
    }).fetchone()
    return None if row is None else int(row[0])


def _spec(job: JobSpec | Mapping[str, Any]) -> JobSpec:
    if isinstance(job, JobSpec):
        return job
    return JobSpec(**job)


def _atomic(conn: psycopg.Connection[Any]) -> AbstractContextManager[Any]:
    """A transaction on an autocommit connection; else the caller's, as it is.

    (``conn.transaction()`` on an idle non-autocommit connection would start a
    transaction and commit it: the jobs would no longer roll back with the caller.)
    """
    return conn.transaction() if conn.autocommit else nullcontext()


def enqueue_many(
    conn: psycopg.Connection[Any],
    jobs: Iterable[JobSpec | Mapping[str, Any]],
    *,
    schema: str = DEFAULT_SCHEMA,
    table: str = DEFAULT_TABLE,
) -> EnqueueResult:
    """Insert many jobs through COPY, in the caller's transaction.

    Jobs without a dedup_key go straight into the table; when any job has one, the
    batch is staged in a temporary table (dropped at commit) and inserted with
    ON CONFLICT DO NOTHING, so duplicates are skipped and counted.
    """
    specs = [j if type(j) is JobSpec else _spec(j) for j in jobs]
    # One pass before anything is written: the first bad job fails the batch, and the
    # pass notes which COPY the batch needs.
    timed = keyed = False
    for s in specs:
        if not s.queue or s.max_attempts < 1:
            _check(s.queue, s.max_attempts)  # raises the ValueError that names the problem
        if s.run_at is not None:
            timed = True
        if s.dedup_key is not None:
            keyed = True
    if not specs:
        return EnqueueResult(0, 0)
    if not timed and not keyed:
        # The common bulk case: run_at is left out of the COPY, so the column default
        # (now(), the transaction's start, as SELECT now() would give) fills it, and
        # dedup_key stays NULL: four columns a row instead of six, no extra round trip.
        cur = conn.cursor()
        text = _stock_text_copy(cur)
        with _atomic(conn), cur.copy(_q("enqueue_copy_now", schema, table)) as copy:
            _write_now(copy, specs, text=text)
        return EnqueueResult(len(specs), 0)
    rows = [
        (s.queue, Jsonb(s.payload), s.run_at, s.priority, s.max_attempts, s.dedup_key)
        for s in specs
    ]
    types = ["text", "jsonb", "timestamptz", "int4", "int4", "text"]
    with _atomic(conn):
        cur = conn.cursor()
        if not keyed:
            if any(s.run_at is None for s in specs):
                # COPY does not apply column defaults to NULLs: fill run_at with now().
                now = cur.execute("SELECT now()").fetchone()
                assert now is not None
                rows = [r if r[2] is not None else (r[0], r[1], now[0], *r[3:]) for r in rows]
            with cur.copy(_q("enqueue_copy", schema, table)) as copy:
                copy.set_types(types)
                for r in rows:
                    copy.write_row(r)
            return EnqueueResult(len(rows), 0)
        cur.execute(QUERIES["enqueue_stage"])
        with cur.copy(QUERIES["enqueue_stage_copy"]) as copy:
            copy.set_types(["int8", *types])
            for i, r in enumerate(rows):
                copy.write_row((i, *r))
        cur.execute(_q("enqueue_stage_insert", schema, table))
        inserted = cur.rowcount
        cur.execute("DROP TABLE drainer_enqueue_stage")
    return EnqueueResult(inserted, len(rows) - inserted)


# -- the COPY text of jobs due now, written without psycopg's per-row formatting -------------

_NOW_TYPES = ("text", "jsonb", "int4", "int4")

# COPY's text format: the characters psycopg escapes in a field, and how.
_COPY_SPECIAL = re.compile(r"[\b\t\n\v\f\r\\]")
_COPY_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v", "\f": "\\f",
                 "\r": "\\r", "\\": "\\\\"}

#: Rows joined into one copy.write(): bounds the text held at once.
_CHUNK_ROWS = 256

_PSYCOPG_MODULES = ("psycopg.", "psycopg_c.", "psycopg_binary.")


def _stock_text_copy(cur: psycopg.Cursor[Any]) -> bool:
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


def _write_now(copy: psycopg.Copy, specs: Sequence[JobSpec], *, text: bool) -> None:
    """COPY rows of (queue, payload, priority, max_attempts).

    With ``text``, as COPY text joined in chunks: the bytes ``write_row`` would send, for
    less than half its CPU time on small payloads (one JSON encoder for the batch, no
    per-field dumper calls). Up to the first row that needs psycopg's own formatting;
    ``write_row`` takes that row and the rest.
    """
    copy.set_types(_NOW_TYPES)
    done = _write_now_text(copy, specs) if text else 0
    write = copy.write_row
    for s in islice(specs, done, None):
        write((s.queue, Jsonb(s.payload), s.priority, s.max_attempts))


def _queue_field(queue: str) -> str | None:
    """The queue's COPY text field and a tab; None when psycopg must format it."""
    if "\x00" in queue:
        return None  # psycopg raises its own error
    try:
        queue.encode()
    except UnicodeEncodeError:  # a lone surrogate: let psycopg raise its error
        return None
    return _COPY_SPECIAL.sub(lambda m: _COPY_ESCAPES[m.group()], queue) + "\t"


def _write_now_text(copy: psycopg.Copy, specs: Sequence[JobSpec]) -> int:
    """Write the COPY text of (queue, payload, priority, max_attempts) rows in chunks.

    The text is what ``write_row`` would send for the same rows. Returns how many rows
    were written: it stops at the first row it cannot format exactly so (a queue that
    is not a str, a priority or max_attempts that is not an int, ...) for ``write_row``
    to take that row and the rest, with psycopg's own checks and errors.
    """
    dumps = _json_encoder()
    fields: dict[str, str | None] = {}  # queue -> _queue_field(queue)
    written = 0
    rows = iter(specs)
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
            if field is None or type(priority) is not int or type(max_attempts) is not int:
                if lines:
                    copy.write("".join(lines))
                return written + len(lines)
            payload = dumps(s.payload)
            if "\\" in payload:  # json.dumps writes ASCII, no control characters: only \
                payload = payload.replace("\\", "\\\\")
            append(f"{field}{payload}\t{priority}\t{max_attempts}\n")
        if not lines:
            return written
        copy.write("".join(lines))
        written += len(lines)
