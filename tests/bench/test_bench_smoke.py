"""The benchmark harness runs end to end at a tiny size (no peers, no timing assertions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from bench import plots
from tests.bench.test_plots import check_charts

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def bench_db(pg_url: str) -> Iterator[str]:
    """A database name of the test's own (the bench creates it): the two smoke tests use the
    same schema names in it, and run at the same time under pytest-xdist; dropped after."""
    name = f"drainer_bench_smoke_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for db in (name, f"{name}_cold"):  # the cold section's database is named after it
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(db)))


def test_bench_smoke_prints_the_tables(pg_url: str, bench_db: str, tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--no-peers", "--server", pg_url,
         "--database", bench_db, "--only", "drain,cold,enqueue",
         "--output", str(out)],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout
    assert "### Drain until empty: 200 no-op jobs" in text
    assert "| drainer run-once (defaults) |" in text
    assert "| plain psycopg loop" in text
    assert "### Empty queue: cold start" in text
    assert "### Enqueue 500 jobs" in text
    assert "INVALID" not in proc.stderr, proc.stderr[-2000:]
    results = json.loads(out.with_suffix(".json").read_text())
    # every contender drained all its jobs in its one round (a failed check records no value)
    for name, values in results["drain"].items():
        assert len(values) == 1, name
    assert results["cold"]["left"]["drainer run-once"] == [0]
    assert results["cold"]["connections"]["drainer run-once"] == [1]
    # the run report's process start to connect, within the run's own wall
    [start] = results["cold"]["process_start"]["drainer run-once"]
    [wall] = results["cold"]["wall"]["drainer run-once"]
    assert 0 < start < wall
    assert results["cold"]["process_start"]["plain psycopg loop"] == []
    # the docs' charts are drawn from this JSON as it is written now
    assert plots.main([str(out.with_suffix(".json")), "--charts-only", "--out",
                       str(tmp_path / "charts")]) == 0
    check_charts(results, tmp_path / "charts")


def test_bench_smoke_of_the_link_and_io_sections(pg_url: str, bench_db: str,
                                                 tmp_path: Path) -> None:
    out = tmp_path / "not-made-yet" / "smoke-link"  # --output makes its folder first
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--no-peers", "--server", pg_url,
         "--database", bench_db, "--only", "link-drain,link-empty,io",
         "--output", str(out)],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout
    assert "### Drain across a link: 200 no-op jobs" in text
    assert "| drainer run-once (defaults) | proxy, RTT 2 ms |" in text
    assert "| drainer run-once (defaults) | local (direct) |" in text
    assert "proxy, RTT 2 ms: drainer / its own local rate **" in text
    assert "### Empty queue across a link" in text
    assert "| drainer run-once, 300 queues | proxy, RTT 2 ms |" in text
    assert "### Handlers that wait on I/O: 200 jobs of 50 ms each" in text
    assert "INVALID" not in proc.stderr, proc.stderr[-2000:]
    results = json.loads(out.with_suffix(".json").read_text())
    runs = {(r["contender"], r["rtt_ms"]): r for r in results["link_drain"]["runs"]}
    linked = runs[("drainer run-once (defaults)", 2.0)]
    assert len(linked["jobs_per_s"]) == 1 and linked["connections"] == [1]
    assert linked["compute_s_per_1000"][0] > 0 and linked["statements"][0] > 0
    assert len(runs[("drainer run-once (defaults)", None)]["jobs_per_s"]) == 1
    empty = {r["command"]: r for r in results["link_empty"]}
    for k in ("1 queue", "50 queues", "300 queues"):
        row = empty[f"drainer run-once, {k}"]
        assert len(row["held_s"]) == 1 and row["held_s"][0] > 0, row
        assert row["connections"] == [1], row
    io = {(r["handlers"], r["concurrency"]): r for r in results["io"]["runs"]
          if r["contender"].startswith("drainer")}
    assert set(io) == {("async", 50), ("sync", 20)}
    floors = [r for r in results["io"]["runs"] if r["contender"].startswith("no queue")]
    assert len(floors) == 2 and all(len(r["jobs_per_s"]) == 1 for r in floors), floors
    for row in io.values():
        assert len(row["jobs_per_s"]) == 1 and row["ideal_jobs_per_s"] > 0, row
    assert plots.main([str(out.with_suffix(".json")), "--charts-only", "--out",
                       str(tmp_path / "charts")]) == 0
    check_charts(results, tmp_path / "charts")


def test_the_own_copy_text_still_saves_client_cpu(pg_url: str, bench_db: str) -> None:
    # bench.copy_text exits 1 when enqueue_many's COPY text encoder no longer saves a third
    # of write_row's client CPU on small payloads: then it would not pay its keep
    proc = subprocess.run(
        [sys.executable, "-m", "bench.copy_text", "5000", "3"], capture_output=True,
        text=True, timeout=240, cwd=ROOT,
        env={**os.environ, "BENCH_SERVER_URL": pg_url, "BENCH_AB_DATABASE": bench_db},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| small")]
    assert len(rows) == 4, proc.stdout
