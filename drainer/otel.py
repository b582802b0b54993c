"""OpenTelemetry, when the application uses it (the ``otel`` extra:
``pip install '/path/to/drainer[otel]'``).

- Producers: :func:`producer_context` is the current span's W3C trace context
  (``traceparent``, ``tracestate``), stored with the job in its ``trace_context`` column.
- Drains: each job runs in a span of kind CONSUMER, a child of the producer's span and
  linked to it, with the job's queue, id, attempt and outcome; the span is current while
  the handler runs (the handler's own spans are its children). Spans and metrics are
  flushed at the end of every run (``force_flush``), so a drain-and-exit process does not
  lose what a background exporter has not sent yet.

``DRAINER_OTEL`` / ``otel``: ``auto`` (the default) traces when the application has
imported OpenTelemetry and configured a tracer provider; ``on`` always (an error when the
API is not installed); ``off`` never. Nothing here imports ``opentelemetry`` unless the
application already has (``auto``) or ``on`` asks for it: with OpenTelemetry off, a job
costs one no-op context manager and an enqueue one dictionary look-up.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drainer.job import Job
    from drainer.registry import Task

logger = logging.getLogger(__name__)

#: The environment variable producers read (drains read the ``otel`` setting, which is it).
ENV = "DRAINER_OTEL"
#: Outcomes a job span ends with (the ``drainer.outcome`` attribute).
OUTCOMES = ("succeeded", "retried", "failed", "lost")
#: How long the flush at the end of a run may take, in milliseconds.
FLUSH_TIMEOUT_MS = 10_000

_API = "opentelemetry.trace"


def producer_context() -> dict[str, str] | None:
    """The current span's ``traceparent`` (and ``tracestate``), or None: no valid span,
    OpenTelemetry not imported by the application, or ``DRAINER_OTEL=off``."""
    if _API not in sys.modules:  # the application does not use OpenTelemetry
        return None
    if os.environ.get(ENV, "auto").strip().lower() == "off":
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier or None


def for_run(mode: str) -> RunTracing | None:
    """The tracing of one drain, or None when it is off (see the module's docstring)."""
    from drainer.errors import ConfigError

    if mode == "off" or (mode == "auto" and _API not in sys.modules):
        return None
    try:
        from opentelemetry import trace
    except ImportError:
        if mode == "on":
            raise ConfigError("DRAINER_OTEL=on needs OpenTelemetry (the 'otel' extra): "
                              "pip install opentelemetry-sdk") from None
        return None
    provider = trace.get_tracer_provider()
    if mode == "auto" and isinstance(provider, (trace.ProxyTracerProvider,
                                                trace.NoOpTracerProvider)):
        return None  # imported, but no SDK configured: spans would go nowhere
    _install()
    return RunTracing(provider)


#: Traced runs in progress in this process: job spans are made only while there is one.
_active = 0


class RunTracing:
    """One run's job spans: ended when their outcome is written, flushed at the end."""

    def __init__(self, provider: Any) -> None:
        global _active
        self.provider = provider
        # this run's spans: two runs of one process at once (a fleet's tenants, each its
        # own database) have jobs with the same (id, attempt)
        self.open: dict[tuple[int, int], tuple[Any, int | None]] = {}
        _active += 1

    def job_span(self, task: Task, job: Job) -> JobSpan:
        """The context manager of one of this run's handlers (the drain's job_context)."""
        return JobSpan(task, job, self.open)

    def outcome(self, job: Job, outcome: str) -> None:
        """The job's outcome is known (written, or lost): its span ends with it."""
        entry = self.open.pop((job.id, job.attempt), None)
        if entry is None:
            return
        span, ended_ns = entry
        span.set_attribute("drainer.outcome", outcome)
        span.end(end_time=ended_ns)

    def close(self) -> None:
        """End the spans of jobs whose outcome this run did not write (a handler left
        running after the grace period: ``lost``), then flush spans and metrics."""
        global _active
        _active = max(0, _active - 1)
        for key, (span, ended_ns) in list(self.open.items()):
            if self.open.pop(key, None) is not None:
                span.set_attribute("drainer.outcome", "lost")
                span.end(end_time=ended_ns)
        flush(self.provider)


def flush(provider: Any = None) -> None:
    """``force_flush`` the tracer provider (the global one by default) and, when the
    application uses OpenTelemetry metrics, the meter provider. Never raises."""
    try:
        if provider is None:
            from opentelemetry import trace

            provider = trace.get_tracer_provider()
        providers = [provider]
        if "opentelemetry.metrics" in sys.modules:
            from opentelemetry import metrics

            providers.append(metrics.get_meter_provider())
        for p in providers:
            force = getattr(p, "force_flush", None)
            if force is not None and not force(FLUSH_TIMEOUT_MS):
                logger.warning("OpenTelemetry: %s did not flush within %d ms: spans or "
                               "metrics may be lost", type(p).__name__, FLUSH_TIMEOUT_MS)
    except Exception as exc:
        logger.warning("OpenTelemetry: flushing failed: %s", exc)


# -- the job span ------------------------------------------------------------------------------

_tracer: Any = None


def _install() -> None:
    """The tracer job spans come from, of the provider in place now (drainer.drain sets
    its handlers' job_context to :class:`JobSpan`)."""
    global _tracer
    from opentelemetry import trace

    try:
        from importlib.metadata import version

        ours: str | None = version("drainer")
    except Exception:
        ours = None
    _tracer = trace.get_tracer("drainer", ours)


class JobSpan:
    """The context manager a handler runs in: its span is current meanwhile."""

    __slots__ = ("ended_ns", "job", "open", "span", "token")

    def __init__(self, task: Task, job: Job,
                 open_spans: dict[tuple[int, int], tuple[Any, int | None]]) -> None:
        self.job = job
        self.open = open_spans
        """Its run's spans started and not ended, by (job id, attempt), with when their
        handler returned."""
        self.ended_ns: int | None = None
        self.token: object | None = None

    def __enter__(self) -> JobSpan | None:
        if not _active:  # a run with OpenTelemetry off, after a traced one
            return None
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )

        job = self.job
        parent = None
        links = []
        if job.trace_context:
            parent = TraceContextTextMapPropagator().extract(dict(job.trace_context))
            producer = trace.get_current_span(parent).get_span_context()
            if producer.is_valid:
                links.append(trace.Link(producer))
            else:
                parent = None
        self.span = _tracer.start_span(
            f"process {job.queue}", context=parent, kind=trace.SpanKind.CONSUMER,
            links=links, attributes={
                "drainer.queue": job.queue, "drainer.job_id": job.id,
                "drainer.attempt": job.attempt, "drainer.max_attempts": job.max_attempts,
                "messaging.system": "drainer", "messaging.operation.type": "process",
                "messaging.destination.name": job.queue,
                "messaging.message.id": str(job.id),
            })
        self.open[(job.id, job.attempt)] = (self.span, None)
        self.token = context.attach(trace.set_span_in_context(self.span))
        return self

    def ended(self, ok: bool, error: str | None) -> None:
        """The handler returned (``ok``) or raised (``error``): the span's status and a
        provisional outcome; it ends when the outcome is written."""
        from opentelemetry.trace import Status, StatusCode

        self.ended_ns = time.time_ns()
        key = (self.job.id, self.job.attempt)
        entry = self.open.get(key)
        if entry is None or entry[0] is not self.span:
            return  # already ended (abandoned after its timeout)
        self.open[key] = (self.span, self.ended_ns)
        if ok:
            return
        first = (error or "").split("\n", 1)[0]
        self.span.set_status(Status(StatusCode.ERROR, first))
        self.span.set_attribute("error.type", first.split(":", 1)[0] or "error")

    def __exit__(self, tp: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.token is None:
            return
        from opentelemetry import context

        context.detach(self.token)  # type: ignore[arg-type]
