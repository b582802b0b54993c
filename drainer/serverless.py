"""AWS Lambda and Google Cloud Functions handlers: thin adapters over ``run_once``.

Both build their settings from the environment (``DRAINER_*``, ``DATABASE_URL``), drain
until nothing is due or the platform's time is nearly up, and return the run report.
The time kept in reserve is ``DRAINER_HANDLER_MARGIN`` (10 s by default): claiming stops
at *time left - margin*, and jobs still running then get at most half the margin to
finish before they are left to their lease (the next drain's reaper requeues them).
Set the margin above the time your slowest handler needs plus a few seconds.

Nothing here imports boto3 or functions_framework: the platforms call these functions
by name (``drainer.serverless.lambda_handler``; ``--entry-point gcf_handler`` from a
``main.py`` that imports it).
"""

from __future__ import annotations

import hmac
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from drainer.registry import Registry
    from drainer.settings import Settings

logger = logging.getLogger(__name__)


class LambdaContext(Protocol):
    """The part of AWS Lambda's context object the handler uses."""

    def get_remaining_time_in_millis(self) -> int: ...


def bounded_drain(settings: Settings, seconds_left: float, *,
                  registry: Registry | None = None) -> dict[str, Any]:
    """Drain for at most ``seconds_left`` minus the margin; return the report as a dict.

    Claiming stops at ``seconds_left - settings.handler_margin``; running jobs then get
    ``min(settings.grace, margin / 2)`` to finish. With no time to claim anything it
    returns a report with ``deadline_hit`` and claims nothing.
    """
    from drainer.drain import run_once

    started = time.monotonic()
    margin = settings.handler_margin
    budget = seconds_left - margin
    bounded = settings.model_copy(update={"grace": min(settings.grace, margin / 2)})
    if budget <= 0:
        logger.warning("%.1fs left is not more than the %.1fs margin: no time to drain",
                       seconds_left, margin)
    report = run_once(bounded, registry=registry, deadline=started + max(0.0, budget))
    return report.as_dict()


def lambda_handler(event: Any, context: LambdaContext) -> dict[str, Any]:
    """AWS Lambda entry point: drain within the invocation's remaining time.

    ``event`` is ignored (any trigger: EventBridge schedule, SQS, a function URL, a
    direct invoke). Returns the run report; configuration and database errors raise so
    the invocation is marked failed (and retried by asynchronous invokers).
    """
    from drainer.settings import load_settings

    settings = load_settings()
    _logging(settings)
    seconds_left = context.get_remaining_time_in_millis() / 1000.0
    return bounded_drain(settings, seconds_left)


def gcf_handler(request: Any) -> tuple[dict[str, Any], int]:
    """Google Cloud Functions (functions-framework) HTTP entry point.

    Drains for ``DRAINER_HANDLER_BUDGET`` (the function's timeout, 60 s by default)
    minus the margin and answers 200 with the report. When ``DRAINER_TRIGGER_TOKEN`` is
    set, the request needs ``Authorization: Bearer <token>`` (401 otherwise).
    """
    from drainer.settings import load_settings

    started = time.monotonic()
    settings = load_settings()
    _logging(settings)
    if settings.trigger_token is not None:
        expected = f"Bearer {settings.trigger_token.get_secret_value()}".encode()
        given = str(request.headers.get("Authorization", "")).encode("utf-8", "replace")
        if not hmac.compare_digest(given, expected):
            return {"error": "missing or wrong bearer token"}, 401
    seconds_left = settings.handler_budget - (time.monotonic() - started)
    return bounded_drain(settings, seconds_left), 200


def _logging(settings: Settings) -> None:
    """JSON logs on stderr (CloudWatch / Cloud Logging), set up once per warm instance."""
    from drainer.logs import setup_logging

    if not logging.getLogger("drainer").handlers:
        setup_logging(settings.log_level, "json")
