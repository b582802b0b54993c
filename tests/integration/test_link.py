"""A drain across a link 1-8 ms away: the claims grow to the round trip (bench/proxy.py's
delay proxy stands in for the network); locally the Syncs timed say local."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql

import drainer.drain as drain_module
from bench.proxy import DelayProxy
from drainer import run_once
from drainer.drain.loop import Drain
from drainer.registry import Registry
from drainer.settings import Settings
from tests.conftest import make_settings

JOBS = 1000


def _fill(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(sql.SQL("INSERT INTO {} (queue) SELECT 'l' FROM generate_series(1, %s)")
                 .format(sql.Identifier(schema, "jobs")), [JOBS])


@pytest.fixture
def drains(monkeypatch: pytest.MonkeyPatch) -> list[Drain]:
    """The drain loops run_once builds (their clocks say what was measured)."""
    built: list[Drain] = []
    real = drain_module._build

    def build(*args: Any, **kw: Any) -> Drain:
        built.append(real(*args, **kw))
        return built[-1]

    monkeypatch.setattr(drain_module, "_build", build)
    return built


def test_claims_grow_across_a_3_ms_link(pg_url: str, migrated: Settings,
                                        conn: psycopg.Connection[Any], registry: Registry,
                                        drains: list[Drain]) -> None:
    registry.task("l")(lambda job: None)
    _fill(conn, migrated.schema_name)
    parts = urlsplit(pg_url)
    with DelayProxy(3, (parts.hostname or "127.0.0.1", parts.port or 5432)) as proxy:
        user = f"{parts.username}@" if parts.username else ""
        url = f"postgresql://{user}{proxy.host}:{proxy.port}{parts.path or '/postgres'}"
        report = run_once(make_settings(url, migrated.schema_name), registry=registry)
        proxy.settle()
        statements = sum(s.statements for s in proxy.take())
    assert report.succeeded == JOBS and report.lost == 0
    # a claim of 3 ms or more: either 8 ms or more (a loaded machine), or the Syncs said so
    assert drains[0].clock.far()
    # claims of --batch-size (10) would send 2 statements each (the generic-plan setting
    # and the claim, pipelined): 200 and more
    assert statements < JOBS / 10, statements


def test_a_local_drain_is_not_taken_for_a_link(migrated: Settings,
                                               conn: psycopg.Connection[Any],
                                               registry: Registry,
                                               drains: list[Drain]) -> None:
    registry.task("l")(lambda job: None)
    _fill(conn, migrated.schema_name)
    report = run_once(migrated, registry=registry)
    assert report.succeeded == JOBS
    clock = drains[0].clock
    assert clock.linked is not True  # no Sync at all, or one that came back at once
    assert clock.probes <= 3
