"""A fleet through the suspend simulator, one simulated compute a tenant: a fleet wake
resumes only the tenants with work; an idle tenant's compute stays suspended."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import psycopg
import pytest

from bench.link import target_of, via
from bench.suspend import SuspendSimulator
from drainer.fleet import due
from drainer.fleet.control import Control, connect_control
from drainer.fleet.run import run_fleet
from drainer.fleet.tenants import Tenant
from drainer.job import Job
from drainer.registry import Registry
from drainer.settings import load_settings
from tests.integration._fleet import Fleet, create_database, enqueue, jobs, tenant_fleet

TENANTS = 10
IDLE_S = 2.5
COLD_START_S = 0.5


@pytest.fixture
def fleet(pg_url: str) -> Iterator[Fleet]:
    with tenant_fleet(pg_url, TENANTS) as f:
        yield f


@pytest.mark.slow
def test_a_fleet_wake_resumes_only_the_tenants_with_work(fleet: Fleet, pg_url: str) -> None:
    registry = Registry()

    @registry.task("work")
    def work(job: Job) -> None:
        pass

    fleet.databases.append(f"{fleet.prefix}_ctl")
    control_url = create_database(pg_url, fleet.databases[-1])  # not suspended: always on
    settings = load_settings(fleet_url=control_url, connect_retries=4, connect_timeout=5,
                             retry_base=0.2, fleet_concurrency=4, vacuum_threshold=0)
    with connect_control(settings) as conn:
        Control(conn, settings.schema_name).create()
    with ExitStack() as stack:
        sims = {t.name: stack.enter_context(SuspendSimulator(IDLE_S, COLD_START_S,
                                                             target_of(t.url)))
                for t in fleet.tenants}
        tenants = [Tenant(t.name, via(t.url, sims[t.name])) for t in fleet.tenants]

        def run() -> Any:
            return run_fleet(settings, tenants=tenants, registry=registry)

        warm = run()  # every tenant never seen: each resumed and drained once
        assert warm.totals()["tenants_drained"] == TENANTS
        for s in sims.values():
            s.wait_for("suspend", timeout=30)
        start = time.time()
        # nothing known: a wake connects to no tenant, resumes none
        assert run().lines == []
        with_work = [fleet.tenants[1], fleet.tenants[6]]
        for t in with_work:
            enqueue(t.url, "work", [{}] * 5)  # the producer's own write, on the server
        with psycopg.connect(control_url, autocommit=True) as conn:
            due(conn, [t.name for t in with_work])
        report = run()
        assert sorted(line.tenant for line in report.lines) == sorted(t.name for t in with_work)
        assert all({j["status"] for j in jobs(t.url)} == {"done"} for t in with_work)
        resumed = {name: len(s.resumes(start)) for name, s in sims.items()}
    assert resumed == {t.name: 1 if t in with_work else 0 for t in fleet.tenants}, resumed
