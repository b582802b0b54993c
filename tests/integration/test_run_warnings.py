"""What a run warns about its settings: a handler timeout no run can give, a lease shorter
than the round trip to the database."""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

import pytest

from bench.proxy import DelayProxy
from drainer import run_once
from drainer.registry import Registry
from drainer.settings import Settings
from tests.conftest import make_settings


def test_a_timeout_longer_than_max_runtime_is_warned_and_reported(
        migrated: Settings, registry: Registry, caplog: pytest.LogCaptureFixture) -> None:
    registry.task("slow", timeout=600)(lambda job: None)
    registry.task("default_limit")(lambda job: None)  # --job-timeout's
    registry.task("quick", timeout=1)(lambda job: None)
    settings = make_settings(migrated.database_url, migrated.schema_name, max_runtime=60,
                             job_timeout=120)
    with caplog.at_level(logging.WARNING, logger="drainer"):
        report = run_once(settings, registry=registry)
    assert report.timeout_over_max_runtime == {"default_limit": 120.0, "slow": 600.0}
    assert report.as_dict()["timeout_over_max_runtime"] == {"default_limit": 120.0,
                                                            "slow": 600.0}
    [line] = [r.getMessage() for r in caplog.records if "--max-runtime" in r.getMessage()]
    assert "'slow' (600s)" in line and "'quick'" not in line
    # without --max-runtime nothing is cut: nothing to say
    assert run_once(migrated, registry=registry).timeout_over_max_runtime == {}


def test_a_lease_shorter_than_the_round_trip_is_warned(
        pg_url: str, migrated: Settings, registry: Registry,
        caplog: pytest.LogCaptureFixture) -> None:
    registry.task("tight", lease=0.002)(lambda job: None)
    registry.task("roomy")(lambda job: None)
    parts = urlsplit(pg_url)
    with DelayProxy(20, (parts.hostname or "127.0.0.1", parts.port or 5432)) as proxy:
        user = f"{parts.username}@" if parts.username else ""
        url = f"postgresql://{user}{proxy.host}:{proxy.port}{parts.path or '/postgres'}"
        with caplog.at_level(logging.WARNING, logger="drainer"):
            run_once(make_settings(url, migrated.schema_name), registry=registry)
    [line] = [r.getMessage() for r in caplog.records if "round trip" in r.getMessage()]
    assert "'tight' (0.002s)" in line and "'roomy'" not in line and "--lease" in line
