"""Push each run report to a Prometheus Pushgateway, the convention for batch jobs.

A drain is a batch job: it exits before Prometheus could scrape it, so it pushes its
report once, at the end of the run, to ``DRAINER_PUSHGATEWAY_URL``. The push replaces
(HTTP PUT) the metrics of its group, whose grouping key is ``job="drainer"`` and
``instance`` = ``DRAINER_PUSHGATEWAY_INSTANCE`` or the host name; so the gateway always
holds the *last* run of each instance, and ``drainer_last_run_timestamp_seconds`` says
when it finished (alert when it grows old). Needs ``prometheus-client`` (the
``prometheus`` extra); ``run_once`` turns any failure here into a warning.
"""

from __future__ import annotations

import logging
import socket
import sys
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from drainer.errors import DrainerError

if TYPE_CHECKING:
    from drainer.drain.report import RunReport
    from drainer.settings import Settings

logger = logging.getLogger(__name__)

#: The ``job`` grouping key of every push.
JOB = "drainer"
#: Seconds one push may take before it is given up (a warning, never a failed run).
PUSH_TIMEOUT_S = 5.0
#: The report's job counts, pushed as ``drainer_run_jobs{outcome=...}``.
OUTCOMES = ("claimed", "succeeded", "retried", "failed", "released", "reaped", "archived",
            "lost")


def grouping_key(settings: Settings) -> dict[str, str]:
    """The labels that name this drainer's group on the gateway (besides ``job``); in a
    fleet run, ``tenant`` too: one group a tenant, each its own last run."""
    key = {"instance": settings.pushgateway_instance or socket.gethostname()}
    fleet = sys.modules.get("drainer.fleet.run")  # loaded by a fleet run only
    tenant = None if fleet is None else fleet.current_tenant.get()
    if tenant is not None:
        key["tenant"] = tenant
    return key


def build_registry(settings: Settings, report: RunReport, *, now: float | None = None
                   ) -> Any:
    """A prometheus_client CollectorRegistry holding the report as gauges."""
    try:
        from prometheus_client import CollectorRegistry, Gauge
    except ImportError:
        raise DrainerError("prometheus-client is not installed (the 'prometheus' extra): "
                           "pip install prometheus-client") from None

    registry = CollectorRegistry()

    def gauge(name: str, doc: str, value: float, labels: dict[str, str] | None = None
              ) -> None:
        g = Gauge(name, doc, list(labels or {}), registry=registry)
        (g.labels(**labels) if labels else g).set(value)

    jobs = Gauge("drainer_run_jobs", "Jobs of the last run, by outcome (claimed, succeeded, "
                 "retried, failed for good, released at shutdown, reaped from expired "
                 "leases, archived, lost: outcome not written).", ["outcome"],
                 registry=registry)
    for outcome in OUTCOMES:
        jobs.labels(outcome=outcome).set(getattr(report, outcome))
    gauge("drainer_run_remaining_due_jobs", "Jobs still due when the last run ended.",
          report.remaining_due)
    if report.next_due_at is not None:
        gauge("drainer_run_next_due_timestamp_seconds", "When the next queued job of the "
              "drained queues is due (Unix time).",
              datetime.fromisoformat(report.next_due_at).timestamp())
    gauge("drainer_run_duration_seconds", "Duration of the last run.", report.duration_s)
    gauge("drainer_run_connected_seconds", "How long the last run held its database "
          "connection.", report.connected_s)
    gauge("drainer_run_deadline_hit", "1 when a limit (--max-runtime, --max-jobs) stopped "
          "the last run before the queue was empty.", int(report.deadline_hit))
    gauge("drainer_run_vacuumed", "1 when the last run vacuumed the jobs table.",
          int(report.vacuumed))
    if report.n_dead_tup is not None:
        gauge("drainer_jobs_dead_tuples", "n_dead_tup of the jobs table after the last run.",
              report.n_dead_tup)
    gauge("drainer_run_info", "Always 1; labels describe the last run.", 1, {
        "queues": ",".join(report.queues),
        "table": f"{settings.schema_name}.{settings.table}",
        "stopped_by": report.stopped_by or "",
    })
    gauge("drainer_last_run_timestamp_seconds", "When the last run finished (Unix time).",
          time.time() if now is None else now)
    return registry


def push_report(settings: Settings, report: RunReport) -> None:
    """Push the run report to ``settings.pushgateway_url`` (PUT: replaces the group).

    Raises on failure; ``run_once`` logs it as a warning and the run still succeeds.
    """
    if not settings.pushgateway_url:
        return
    registry = build_registry(settings, report)  # says how to install prometheus-client
    from prometheus_client import push_to_gateway

    key = grouping_key(settings)
    push_to_gateway(settings.pushgateway_url, job=JOB, registry=registry, grouping_key=key,
                    timeout=PUSH_TIMEOUT_S)
    logger.debug("pushed the run report to the Pushgateway",
                 extra={"run_id": report.run_id, "job": JOB, **key})
