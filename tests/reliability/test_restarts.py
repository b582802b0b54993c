"""Server restarts, terminated backends and a frozen server, on the test's own cluster
(tests/_cluster.py), never the shared one: no job lost, none run more than twice."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from drainer.migrate import migrate
from drainer.producer import JobSpec, enqueue_many
from tests._cluster import Cluster, cluster  # noqa: F401  (the fixture)
from tests.conftest import finish
from tests.reliability._helpers import (
    executions,
    jobs,
    runs_per_job,
    start_drainer,
    wait_for,
)


def _setup(c: Cluster, n: int, sleep: float) -> str:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with c.connect() as conn:
        migrate(conn, schema, "jobs")
        enqueue_many(conn, [JobSpec("rec", {"n": i, "sleep": sleep}) for i in range(n)],
                     schema=schema)
    return schema


def _drain_rest_and_check(c: Cluster, schema: str, log_dir: Path, n: int) -> None:
    """After the leases of the interrupted run expire, one more run finishes everything."""
    with c.connect() as conn:
        wait_for(lambda: all(r["expired"] for r in jobs(conn, schema).values()
                             if r["status"] == "running"), 15, "the leases to expire")
    code, out, err = finish(start_drainer(["run-once", "--lease", "30"], pg_url=c.url,
                                          schema=schema, log_dir=log_dir), timeout=60)
    assert code == 0, err[-2000:]
    json.loads(out)
    with c.connect() as conn:
        rows = jobs(conn, schema)
    assert len(rows) == n
    assert {r["status"] for r in rows.values()} == {"done"}, rows
    runs = runs_per_job(log_dir)
    assert set(runs) == set(rows), "every job ran"
    assert max(runs.values()) <= 2, runs


def test_the_cluster_fixture_freezes_and_thaws(cluster: Cluster) -> None:  # noqa: F811
    with cluster.connect() as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    cluster.freeze()
    try:
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(cluster.url, connect_timeout=2).close()
        assert time.monotonic() - started < 10
    finally:
        cluster.thaw()
    with cluster.connect() as conn:
        assert conn.execute("SELECT 2").fetchone() == (2,)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_server_restart_mid_drain_loses_nothing(cluster: Cluster, tmp_path: Path,  # noqa: F811
                                                  mode: str) -> None:
    n = 40
    schema = _setup(cluster, n, sleep=0.1)
    proc = start_drainer(["run-once", "--lease", "2", "--batch-size", "4"], pg_url=cluster.url,
                         schema=schema, log_dir=tmp_path, DRAINER_CONNECT_RETRIES="3",
                         DRAINER_CONNECT_TIMEOUT="2")
    wait_for(lambda: len(executions(tmp_path)) >= 5, 30, "jobs to start")
    cluster.restart(mode)
    code, _out, err = finish(proc, timeout=60)
    # it may finish on a new connection, or give up: the connection lost (3) or the server
    # said it shut down or is starting up (10)
    assert code in (0, 3, 10), err[-2000:]
    assert "Traceback" not in err
    _drain_rest_and_check(cluster, schema, tmp_path, n)


def test_terminated_backends_mid_drain_lose_nothing(cluster: Cluster,  # noqa: F811
                                                     tmp_path: Path) -> None:
    n = 40
    schema = _setup(cluster, n, sleep=0.1)
    proc = start_drainer(["run-once", "--lease", "2", "--batch-size", "4"], pg_url=cluster.url,
                         schema=schema, log_dir=tmp_path, DRAINER_CONNECT_RETRIES="3")
    wait_for(lambda: len(executions(tmp_path)) >= 5, 30, "jobs to start")
    assert cluster.terminate("drainer%"), "the drainer's sessions were found"
    code, _out, err = finish(proc, timeout=60)
    assert code in (0, 3, 10), err[-2000:]  # 10: 57P01, said so
    assert "Traceback" not in err
    _drain_rest_and_check(cluster, schema, tmp_path, n)
