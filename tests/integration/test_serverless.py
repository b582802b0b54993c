"""The Lambda and Cloud Functions handlers, called as the platforms call them."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from drainer import serverless
from drainer.producer import JobSpec, enqueue_many
from drainer.registry import default_registry
from drainer.settings import Settings
from tests.conftest import ROOT


class FakeContext:
    """AWS Lambda's context: the time left counts down from ``millis`` at creation."""

    def __init__(self, millis: int) -> None:
        self.until = time.monotonic() + millis / 1000

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.until - time.monotonic()) * 1000))


class FakeRequest:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers


@pytest.fixture
def lambda_env(migrated: Settings, pg_url: str, monkeypatch: pytest.MonkeyPatch
               ) -> Iterator[Settings]:
    """The function's environment: DRAINER_* variables and the app module on sys.path."""
    for key in [k for k in list(__import__("os").environ) if k.startswith("DRAINER_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("DRAINER_DATABASE_URL", pg_url)
    monkeypatch.setenv("DRAINER_SCHEMA", migrated.schema_name)
    monkeypatch.setenv("DRAINER_APP", "sample_jobs")
    monkeypatch.setenv("DRAINER_QUEUES", "nap")
    monkeypatch.setenv("DRAINER_CONNECT_RETRIES", "0")
    monkeypatch.setenv("DRAINER_HANDLER_MARGIN", "0.6")
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "apps"))
    saved = dict(default_registry.tasks)
    yield migrated
    default_registry.tasks.clear()
    default_registry.tasks.update(saved)
    sys.modules.pop("sample_jobs", None)


def _statuses(conn: psycopg.Connection[Any], schema: str) -> dict[str, int]:
    rows = conn.execute(f'SELECT status, count(*) FROM "{schema}".jobs GROUP BY 1').fetchall()
    return {s: int(n) for s, n in rows}


def test_lambda_stops_claiming_before_the_time_runs_out(lambda_env: Settings,
                                                        conn: psycopg.Connection[Any]) -> None:
    schema = lambda_env.schema_name
    enqueue_many(conn, [JobSpec("nap", {"sleep": 0.2}) for _ in range(40)], schema=schema)
    context = FakeContext(2000)  # 40 jobs x 0.2 s would need 8 s
    started = time.monotonic()
    report = serverless.lambda_handler({"source": "aws.events"}, context)
    elapsed = time.monotonic() - started
    assert context.get_remaining_time_in_millis() > 0, elapsed  # returned in time
    assert elapsed < 2.0
    assert elapsed >= 2.0 - 0.6 - 0.1  # it did use its time up to the margin
    assert report["deadline_hit"] is True and report["stopped_by"] == "max_runtime"
    assert 0 < report["succeeded"] < 40
    assert report["succeeded"] + report["released"] == report["claimed"]
    assert report["remaining_due"] == 40 - report["succeeded"]
    assert _statuses(conn, schema) == {"done": report["succeeded"],
                                       "queued": 40 - report["succeeded"]}


def test_lambda_with_less_time_than_the_margin_claims_nothing(
        lambda_env: Settings, conn: psycopg.Connection[Any]) -> None:
    enqueue_many(conn, [JobSpec("nap", {"sleep": 0.2})], schema=lambda_env.schema_name)
    report = serverless.lambda_handler({}, FakeContext(500))
    assert report["claimed"] == 0 and report["deadline_hit"] is True
    assert report["remaining_due"] == 1


def test_lambda_drains_everything_when_there_is_time(lambda_env: Settings,
                                                     conn: psycopg.Connection[Any]) -> None:
    enqueue_many(conn, [JobSpec("nap", {"sleep": 0}) for _ in range(25)],
                 schema=lambda_env.schema_name)
    report = serverless.lambda_handler({}, FakeContext(30_000))
    assert report["succeeded"] == 25 and report["deadline_hit"] is False
    assert report["remaining_due"] == 0


def test_gcf_handler_uses_the_configured_budget(lambda_env: Settings,
                                                conn: psycopg.Connection[Any],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAINER_HANDLER_BUDGET", "2")
    monkeypatch.setenv("DRAINER_TRIGGER_TOKEN", "gcf-token")
    enqueue_many(conn, [JobSpec("nap", {"sleep": 0.2}) for _ in range(40)],
                 schema=lambda_env.schema_name)
    body, status = serverless.gcf_handler(FakeRequest({"Authorization": "Bearer nope"}))
    assert status == 401 and _statuses(conn, lambda_env.schema_name) == {"queued": 40}
    started = time.monotonic()
    body, status = serverless.gcf_handler(FakeRequest({"Authorization": "Bearer gcf-token"}))
    elapsed = time.monotonic() - started
    assert status == 200 and elapsed < 2.0
    assert body["deadline_hit"] is True and 0 < body["succeeded"] < 40


def test_no_platform_sdk_is_imported() -> None:
    import subprocess

    code = ("import sys, drainer.serverless; "
            "print(sorted(m for m in ('boto3', 'functions_framework', 'flask') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert out.strip() == "[]"
