"""App module of the OpenTelemetry subprocess test: configures the SDK as an application
would, with a BatchSpanProcessor that would only export after a minute, and no flush at
interpreter exit: a span in the file was flushed by drainer before the process exited."""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from drainer import Job, task

_out = open(os.environ["OTEL_TEST_OUT"], "a", encoding="utf-8")  # noqa: SIM115
provider = TracerProvider(shutdown_on_exit=False)
provider.add_span_processor(BatchSpanProcessor(
    ConsoleSpanExporter(out=_out, formatter=lambda span: span.to_json(indent=None) + "\n"),
    schedule_delay_millis=60_000))
trace.set_tracer_provider(provider)


@task("traced")
def traced(job: Job) -> None:
    with trace.get_tracer("otel_jobs").start_as_current_span("inside the handler"):
        pass
