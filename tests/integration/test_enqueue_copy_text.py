"""enqueue_many's own COPY text: the bytes psycopg's write_row sends, or write_row itself."""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.copy import Writer
from psycopg.types.json import set_json_dumps

from drainer.errors import JobRejected
from drainer.producer import JobSpec, enqueue_many
from drainer.producer._bulk import plan
from drainer.producer._copy_text import (
    CHUNK_ROWS,
    NOW_TYPES,
    NowText,
    Payloads,
    queue_field,
    stock_text_copy,
)
from drainer.producer._steps import Copy, write
from drainer.settings import Settings


class _Capture(Writer):
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: Any) -> None:
        self.data += data


def _copy_bytes(conn: psycopg.Connection[Any], specs: Sequence[JobSpec],
                text: bool) -> bytes | tuple[type[BaseException], str]:
    """What enqueue_many's COPY sends for ``specs`` (nothing reaches the server)."""
    out = _Capture()
    try:
        with psycopg.Copy(conn.cursor(), binary=False, writer=out) as copy:
            rows = NowText(specs, text)
            write(copy, Copy("", NOW_TYPES, rows.rows(), rows))
    except Exception as exc:
        return type(exc), str(exc)
    return bytes(out.data)


class Prio(enum.IntEnum):
    HIGH = 7


_TEXT = st.text(st.characters(blacklist_categories=()), max_size=8)
_QUEUES = (st.sampled_from(["emails", "a\tb", "new\nline", "cr\r", "back\\slash", "\\.", "\\N",
                            "\b\v\f", "caf\u00e9 \u2603 \U0001f600", "nul\x00byte",
                            "lone \ud800"]) | _TEXT.filter(bool))
_PAYLOADS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8) | st.just({1, 2})
_INTS = st.integers(-2**31, 2**31 - 1) | st.integers() | st.booleans() | st.sampled_from(
    [Prio.HIGH, 2.0, "3", None])
_SPECS = st.builds(JobSpec, queue=_QUEUES, payload=_PAYLOADS, priority=_INTS,
                   max_attempts=_INTS)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(_SPECS, max_size=6))
def test_own_text_is_what_write_row_sends(conn: psycopg.Connection[Any],
                                          specs: list[JobSpec]) -> None:
    # the same bytes, or the same error, whichever rows need psycopg's formatting
    assert _copy_bytes(conn, specs, text=True) == _copy_bytes(conn, specs, text=False)


_LOOP: list[Any] = []
_LOOP.append(_LOOP)


@pytest.mark.parametrize("odd", [
    JobSpec("lone \ud800", 2), JobSpec("nul\x00", 2), JobSpec("a", 2, priority=True),
    JobSpec("a", 2, max_attempts=Prio.HIGH), JobSpec("a", 2, priority=2.0),  # type: ignore[arg-type]
    JobSpec("a", 2, max_attempts="3"),  # type: ignore[arg-type]
    JobSpec("a", 2, priority=None),  # type: ignore[arg-type]
    JobSpec(["a"], 2),  # type: ignore[arg-type]
    JobSpec("a", {1}), JobSpec("a", _LOOP), JobSpec("a", float("nan")),
    JobSpec("a", 2, priority=-2**40),
])
def test_an_odd_job_after_others_gets_what_write_row_gives(conn: psycopg.Connection[Any],
                                                           odd: JobSpec) -> None:
    specs = [JobSpec("first", 1), odd, JobSpec("last", 3)]
    assert _copy_bytes(conn, specs, text=True) == _copy_bytes(conn, specs, text=False)


def test_own_text_covers_a_plain_batch_in_chunks(conn: psycopg.Connection[Any]) -> None:
    specs = [JobSpec("q", {"n": i, "s": "x\\y"}) for i in range(3 * CHUNK_ROWS + 5)]
    rows = NowText(specs, text=True)
    chunks = list(rows)
    assert len(chunks) == 4 and rows.stopped is None and rows.written == len(specs)
    assert list(rows.rows()) == []  # no row was left for write_row
    assert "".join(chunks).encode() == _copy_bytes(conn, specs, text=False)
    assert stock_text_copy(conn.cursor())


def _rows(conn: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    return conn.execute(sql.SQL("SELECT queue, payload, priority, max_attempts FROM {} "
                                "ORDER BY id").format(sql.Identifier(schema, "jobs"))).fetchall()


def test_awkward_queues_and_payloads_round_trip(migrated: Settings,
                                                conn: psycopg.Connection[Any]) -> None:
    jobs = [
        ("a\tb\nc\rd\\e", {"tab": "\t", "nl": "\n", "bs": "\\", "quote": '"', "nul": "\\u0000"}),
        ("\\.", "\\."), ("\\N", None), ("caf\u00e9", {"\u2603": ["\U0001f600", "\u2028"]}),
        ("\b\v\f", [2**70, -1.5, True, {}, []]),
    ]
    specs = [JobSpec(q, p, priority=i - 2, max_attempts=i + 1)
             for i, (q, p) in enumerate(jobs)]
    assert enqueue_many(conn, specs, schema=migrated.schema_name).enqueued == len(specs)
    assert _rows(conn, migrated.schema_name) == [
        (q, p, i - 2, i + 1) for i, (q, p) in enumerate(jobs)]


def test_a_row_psycopg_must_format_takes_the_rest_in_order(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    specs = [JobSpec("a", 1), JobSpec("a", 2, priority=True), JobSpec("a", 3, priority=Prio.HIGH),
             JobSpec("b", 4, max_attempts=2)]
    enqueue_many(conn, specs, schema=migrated.schema_name)
    assert _rows(conn, migrated.schema_name) == [
        ("a", 1, 0, 5), ("a", 2, 1, 5), ("a", 3, 7, 5), ("b", 4, 0, 2)]


def test_bad_values_are_one_line_errors_and_nothing_is_written(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    """What the table cannot store is a JobRejected (a ValueError) naming it, never
    psycopg's raw error; what is not JSON at all stays json's TypeError."""
    schema = migrated.schema_name
    with pytest.raises(JobRejected, match="NUL"):
        enqueue_many(conn, [JobSpec("a", 1), JobSpec("a\x00b", 2)], schema=schema)
    with pytest.raises(TypeError, match="Object of type set is not JSON serializable"):
        enqueue_many(conn, [JobSpec("a", 1), JobSpec("a", {1})], schema=schema)
    with pytest.raises(JobRejected, match="integer expected, got 'float'"):
        enqueue_many(conn, [JobSpec("a", 1), JobSpec("a", 2, priority=1.0)],  # type: ignore[arg-type]
                     schema=schema)
    with pytest.raises(JobRejected, match="out of range"):
        enqueue_many(conn, [JobSpec("a", 1, priority=2**31)], schema=schema)
    assert _rows(conn, schema) == []


def test_a_connections_json_dumps_is_used(migrated: Settings, pg_url: str) -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        set_json_dumps(lambda obj: json.dumps(obj, default=str), conn)
        assert not stock_text_copy(conn.cursor())
        enqueue_many(conn, [JobSpec("a", {"at": when})], schema=migrated.schema_name)
        assert _rows(conn, migrated.schema_name) == [("a", {"at": str(when)}, 0, 5)]


_PLAIN_QUEUES = _QUEUES.filter(lambda q: queue_field(q) is not None)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(queue=_PLAIN_QUEUES, payloads=st.lists(_PAYLOADS.filter(lambda p: p != {1, 2}),
                                              min_size=1, max_size=6),
       priority=st.integers(-2**31, 2**31 - 1), max_attempts=st.integers(1, 2**31 - 1))
def test_payloads_on_one_queue_are_what_write_row_sends(
        conn: psycopg.Connection[Any], queue: str, payloads: list[Any], priority: int,
        max_attempts: int) -> None:
    # enqueue_many(conn, payloads, queue=...): the bytes of the same JobSpecs
    steps = plan(conn.cursor(), payloads, queue, None, priority, max_attempts, None, "s", "t")
    assert steps is not None
    step = next(steps)
    assert isinstance(step, Copy) and isinstance(step.chunks, Payloads)  # no JobSpec built
    form = step.chunks
    out = _Capture()
    with psycopg.Copy(conn.cursor(), binary=False, writer=out) as copy:
        write(copy, step)
    specs = [JobSpec(queue, p, priority=priority, max_attempts=max_attempts) for p in payloads]
    assert bytes(out.data) == _copy_bytes(conn, specs, text=False)
    assert form.written == len(payloads)
