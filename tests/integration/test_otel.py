"""OpenTelemetry (drainer[otel]): the producer's trace context stored with the job, a span per
job linked to it, flushed before a drain-and-exit process exits."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.util._once import Once

from drainer import enqueue, enqueue_many, otel, run_once
from drainer.job import Job
from drainer.producer import JobSpec
from drainer.registry import Registry
from drainer.settings import Settings
from tests.conftest import make_settings, run_cli


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """A global SDK tracer provider with an in-memory exporter, for this test only."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace.set_tracer_provider(provider)
    yield exporter
    # back to no provider: later tests run untraced, as a process without the SDK does
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    provider.shutdown()


def _names(settings: Settings) -> dict[str, str]:
    return {"schema": settings.schema_name, "table": settings.table}


def _stored(conn: psycopg.Connection[Any], settings: Settings) -> list[Any]:
    return [r[0] for r in conn.execute(sql.SQL("SELECT trace_context FROM {} ORDER BY id")
                                       .format(sql.Identifier(settings.schema_name, "jobs")))]


def _traceparent(ctx: Any) -> str:
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _job_spans(exporter: InMemorySpanExporter) -> list[Any]:
    return sorted((s for s in exporter.get_finished_spans()
                   if s.kind == trace.SpanKind.CONSUMER),
                  key=lambda s: (s.attributes["drainer.job_id"], s.attributes["drainer.attempt"]))


def test_enqueue_in_a_span_then_one_job_span_child_of_it_and_linked(
        migrated: Settings, conn: psycopg.Connection[Any], registry: Registry,
        spans: InMemorySpanExporter) -> None:
    inner: list[Any] = []

    @registry.task("email")
    def email(job: Job) -> None:
        with trace.get_tracer("app").start_as_current_span("send") as s:
            inner.append(s)

    @registry.task("flaky", max_attempts=2)
    def flaky(job: Job) -> None:
        raise RuntimeError("smtp down")

    with trace.get_tracer("app").start_as_current_span("POST /signup") as request:
        enqueue(conn, "email", {"to": "a"}, **_names(migrated))
        enqueue(conn, "flaky", {}, **_names(migrated))
    producer = request.get_span_context()
    stored = _stored(conn, migrated)
    assert stored[0]["traceparent"] == _traceparent(producer)

    report = run_once(migrated, registry=registry)
    assert report.succeeded == 1 and report.retried == 1
    ok, retried = _job_spans(spans)
    for span, queue, outcome in ((ok, "email", "succeeded"), (retried, "flaky", "retried")):
        assert span.name == f"process {queue}"
        assert span.parent is not None and span.parent.span_id == producer.span_id
        assert span.context.trace_id == producer.trace_id
        assert [link.context.span_id for link in span.links] == [producer.span_id]
        assert span.attributes["drainer.queue"] == queue
        assert span.attributes["drainer.attempt"] == 1
        assert span.attributes["drainer.outcome"] == outcome
        assert isinstance(span.attributes["drainer.job_id"], int)
    assert ok.status.is_ok and not retried.status.is_ok
    assert "smtp down" in (retried.status.description or "")
    # the handler's own span is a child of the job's
    assert inner[0].parent.span_id == ok.context.span_id

    # the retry, due now: attempt 2 fails for good, in the same trace
    conn.execute(sql.SQL("UPDATE {} SET run_at = now() WHERE queue = 'flaky'")
                 .format(sql.Identifier(migrated.schema_name, "jobs")))
    spans.clear()
    assert run_once(migrated, registry=registry).failed == 1
    (last,) = _job_spans(spans)
    assert last.attributes["drainer.attempt"] == 2
    assert last.attributes["drainer.outcome"] == "failed"
    assert last.parent is not None and last.parent.span_id == producer.span_id


def test_bulk_and_async_producers_store_the_context(
        migrated: Settings, pg_url: str, conn: psycopg.Connection[Any],
        spans: InMemorySpanExporter) -> None:
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    with trace.get_tracer("app").start_as_current_span("bulk") as parent:
        enqueue_many(conn, [JobSpec("a", {"n": i}) for i in range(3)], **_names(migrated))
        enqueue_many(conn, [JobSpec("a", {}, run_at=later), JobSpec("a", {})],
                     **_names(migrated))
        enqueue_many(conn, [JobSpec("a", {}, dedup_key="k1"), JobSpec("a", {})],
                     **_names(migrated))

        async def produce() -> None:
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as ac:
                await enqueue(ac, "a", {}, **_names(migrated))
                await enqueue_many(ac, [JobSpec("a", {}), JobSpec("a", {}, dedup_key="k2")],
                                   **_names(migrated))

        asyncio.run(produce())
    want = _traceparent(parent.get_span_context())
    stored = _stored(conn, migrated)
    assert len(stored) == 10
    assert [s["traceparent"] for s in stored] == [want] * 10


def test_no_span_or_off_stores_nothing_and_traces_nothing(
        migrated: Settings, pg_url: str, conn: psycopg.Connection[Any], registry: Registry,
        spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch) -> None:
    registry.task("a")(lambda job: None)
    enqueue(conn, "a", {}, **_names(migrated))  # no current span
    with trace.get_tracer("app").start_as_current_span("off"):
        monkeypatch.setenv("DRAINER_OTEL", "off")
        enqueue(conn, "a", {}, **_names(migrated))
        enqueue_many(conn, [JobSpec("a", {})], **_names(migrated))
        monkeypatch.delenv("DRAINER_OTEL")
    assert _stored(conn, migrated) == [None, None, None]
    off = make_settings(pg_url, migrated.schema_name, otel="off")
    assert run_once(off, registry=registry).succeeded == 3
    assert _job_spans(spans) == []
    # on, without a producer's context: root spans with no link
    enqueue(conn, "a", {}, **_names(migrated))
    assert run_once(migrated, registry=registry).succeeded == 1
    (root,) = _job_spans(spans)
    assert root.parent is None and list(root.links) == []
    # off again after a traced run in the same process: no span
    enqueue(conn, "a", {}, **_names(migrated))
    assert run_once(off, registry=registry).succeeded == 1
    assert len(_job_spans(spans)) == 1


def test_auto_without_a_configured_provider_is_off(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    # opentelemetry is imported (this module), but no SDK provider is set
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert otel.for_run("auto") is None and otel.for_run("off") is None
    assert otel.producer_context() is None


def test_a_drain_and_exit_process_flushes_its_spans(pg_url: str, migrated: Settings,
                                                    conn: psycopg.Connection[Any],
                                                    tmp_path: Path) -> None:
    """run-once in a subprocess whose BatchSpanProcessor would export only after a minute
    and which does not flush at exit: the spans are in the file because drainer flushed."""
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    conn.execute(sql.SQL("INSERT INTO {} (queue, trace_context) VALUES ('traced', %s)")
                 .format(sql.Identifier(migrated.schema_name, "jobs")),
                 [json.dumps({"traceparent": f"00-{trace_id}-{span_id}-01"})])
    out = tmp_path / "spans.jsonl"
    out.touch()
    proc = run_cli(["run-once", "--app", "otel_jobs"], pg_url=pg_url,
                   schema=migrated.schema_name, OTEL_TEST_OUT=str(out))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["succeeded"] == 1
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    by_name = {s["name"]: s for s in exported}
    job = by_name["process traced"]
    assert job["kind"] == "SpanKind.CONSUMER"
    assert job["parent_id"] == f"0x{span_id}"
    assert job["context"]["trace_id"] == f"0x{trace_id}"
    assert job["attributes"]["drainer.outcome"] == "succeeded"
    assert by_name["inside the handler"]["parent_id"] == job["context"]["span_id"]


@pytest.mark.parametrize("depth", [1, 3])
def test_every_claim_path_carries_the_context(
        migrated: Settings, pg_url: str, conn: psycopg.Connection[Any], registry: Registry,
        spans: InMemorySpanExporter, depth: int) -> None:
    """claim_batch, complete_many_and_claim and the pipelined claim return trace_context."""
    registry.task("a")(lambda job: None)
    with trace.get_tracer("app").start_as_current_span("many") as parent:
        for _ in range(6):
            enqueue(conn, "a", {}, **_names(migrated))
    settings = make_settings(pg_url, migrated.schema_name, batch_size=1, pipeline_depth=depth)
    assert run_once(settings, registry=registry).succeeded == 6
    job_spans = _job_spans(spans)
    assert len(job_spans) == 6
    assert {s.parent.span_id for s in job_spans} == {parent.get_span_context().span_id}
    assert {s.attributes["drainer.outcome"] for s in job_spans} == {"succeeded"}


@pytest.mark.parametrize("limits", [{"max_running": 2}, {"rate_limit": "100/s"},
                                    {"max_running": 2, "rate_limit": "100/s"}])
def test_a_limited_queue_s_jobs_are_linked_to_their_producer(
        migrated: Settings, conn: psycopg.Connection[Any], registry: Registry,
        spans: InMemorySpanExporter, limits: dict[str, Any]) -> None:
    """A task with max_running or a rate limit is claimed under its queue's lock
    (claim_batch_capped, claim_batch_rated): its jobs' spans are children of, and linked to,
    the span that enqueued them, as every other claim's."""
    registry.task("limited", **limits)(lambda job: None)
    with trace.get_tracer("app").start_as_current_span("POST /limited") as request:
        for _ in range(3):
            enqueue(conn, "limited", {}, **_names(migrated))
    producer = request.get_span_context()
    assert run_once(migrated, registry=registry).succeeded == 3
    job_spans = _job_spans(spans)
    assert len(job_spans) == 3
    for span in job_spans:
        assert span.parent is not None and span.parent.span_id == producer.span_id
        assert span.context.trace_id == producer.trace_id
        assert [link.context.span_id for link in span.links] == [producer.span_id]


def test_two_overlapping_runs_in_one_process_keep_their_own_job_spans(
        migrated: Settings, pg_url: str, conn: psycopg.Connection[Any], registry: Registry,
        spans: InMemorySpanExporter) -> None:
    """Two tenants' runs at once (a fleet run's threads): their jobs share (job id,
    attempt), and each span ends with its own job's outcome."""
    import threading
    import uuid

    from drainer.migrate import migrate

    other = make_settings(pg_url, f"t_{uuid.uuid4().hex[:12]}")
    migrate(conn, other.schema_name, other.table)
    both = threading.Barrier(2, timeout=20)

    @registry.task("a")
    def a(job: Job) -> str:
        both.wait()  # both runs' handlers are running: both spans open at once
        return "ok"

    try:
        for s in (migrated, other):
            enqueue(conn, "a", {}, **_names(s))  # job 1, attempt 1 in each
        reports: list[Any] = []
        threads = [threading.Thread(target=lambda s=s: reports.append(
            run_once(s, registry=registry))) for s in (migrated, other)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(r.succeeded for r in reports) == [1, 1]
        job_spans = _job_spans(spans)
        assert [s.attributes["drainer.job_id"] for s in job_spans] == [1, 1]
        assert [s.attributes["drainer.outcome"] for s in job_spans] == ["succeeded"] * 2
    finally:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(
            sql.Identifier(other.schema_name)))
