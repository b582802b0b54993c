"""``python -m bench.awake`` runs end to end at a tiny size (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent.parent


def test_awake_bench_smoke(pg_url: str, tmp_path: Path) -> None:
    out = tmp_path / "awake.json"
    prefix = f"drainer_awake_smoke_{uuid.uuid4().hex[:8]}"  # runs of the suite may overlap
    try:
        _smoke(pg_url, prefix, out)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for contender in ("floor", "known_work"):
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(f"{prefix}_{contender}")))


def _smoke(pg_url: str, prefix: str, out: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.awake", "--server", pg_url, "--database",
         prefix, "--window", "8", "--idle-timeout", "1", "--warmup", "1.5",
         "--only", "floor,known-work", "--parallel", "--json", str(out),
         "--html", str(out.with_suffix(".html"))],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| floor | `(producers only)` |" in proc.stdout
    assert "| known-work | `drainer schedule --wake-policy known-work" in proc.stdout
    assert "known-work above the floor:" in proc.stdout
    results = {r["contender"]: r for r in json.loads(out.read_text())["results"]}
    assert results["floor"]["done"] == 0 and results["floor"]["jobs"] == 45
    assert results["known-work"]["done"] == results["known-work"]["jobs"] == 45
    assert results["floor"]["samples"] >= 15 and results["floor"]["awake_s"] > 0
    page = out.with_suffix(".html").read_text(encoding="utf-8")  # one section a contender
    assert page.count("<svg") == 2 and "<script" not in page
    assert "floor: (producers only)" in page and "known-work: drainer schedule" in page


@pytest.mark.slow
def test_awake_bench_retry_workload_smoke(pg_url: str, tmp_path: Path) -> None:
    """--workload retry end to end at a tiny size: known-work with and without
    --retry-linger both finish the burst; only the lingering one waited (no timing
    assertions: the figures are in docs/control.md). The idle timeout (3 s) is longer than
    the retry's wait (1 s): the simulator suspends the compute after it, and a linger it
    cuts is the suspend issue's case (tests/suspend), not this one's."""
    out = tmp_path / "awake.json"
    prefix = f"drainer_awake_retry_{uuid.uuid4().hex[:8]}"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.awake", "--server", pg_url, "--database", prefix,
             "--workload", "retry", "--window", "8", "--idle-timeout", "3", "--warmup", "1.5",
             "--retry-wait", "1", "--linger", "3", "--parallel", "--json", str(out)],
            capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "| known-work-linger | 3 s |" in proc.stdout
        results = {r["contender"]: r for r in json.loads(out.read_text())["results"]}
        assert set(results) == {"known-work", "known-work-linger"}
        for r in results.values():
            assert r["done"] == r["jobs"] == 20, r
        assert results["known-work"]["lingered_s"] == 0
        assert results["known-work-linger"]["lingered_s"] > 0
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for contender in ("known_work", "known_work_linger"):
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(f"{prefix}_{contender}")))


def _drop(pg_url: str, prefix: str, contenders: list[str]) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for contender in contenders:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(f"{prefix}_{contender.replace('-', '_')}")))


@pytest.mark.slow
def test_awake_bench_hard_workload_through_the_simulator_smoke(pg_url: str,
                                                               tmp_path: Path) -> None:
    """--workload hard end to end at a tiny size, through the suspend simulator: the floor
    (producers only) is resumed by each of its 4 producers and by nothing else; known-work
    does every job; the least possible awake time is computed (no timing assertions)."""
    out = tmp_path / "awake.json"
    prefix = f"drainer_awake_hard_{uuid.uuid4().hex[:8]}"
    contenders = ["floor", "known-work"]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.awake", "--server", pg_url, "--database", prefix,
             "--workload", "hard", "--window", "20", "--idle-timeout", "1", "--warmup", "2",
             "--cold-start", "0.3", "--retry-wait", "1", "--only", ",".join(contenders),
             "--parallel", "--json", str(out)],
            capture_output=True, text=True, timeout=180, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "#### Through the suspend simulator: idle timeout 1 s, cold start 0.3 s" \
            in proc.stdout
        assert "- known-work: awake " in proc.stdout  # the verdict against the least
        results = {r["contender"]: r for r in json.loads(out.read_text())["results"]}
        floor, kw = results["floor"], results["known-work"]
        assert floor["resumes"] == 4 and floor["resumed_by"] == {"bench-producer": 4}, floor
        assert floor["wasted_resumes"] == 0 and floor["done"] == 0
        assert floor["sim_awake_s"] > 0 and len(floor["producer_sessions"]) == 4
        assert kw["done"] == kw["jobs"] == 620, kw
        assert kw["latency"]["median"] is not None and kw["retry_latency"]["max"] is not None
        assert kw["occurrences_done"] >= 0 and kw["resumes"] >= 1
    finally:
        _drop(pg_url, prefix, contenders)


@pytest.mark.slow
def test_awake_bench_long_workload_smoke(pg_url: str, tmp_path: Path) -> None:
    """--workload long end to end with 2 s handlers: 10 jobs, concurrency 10, through the
    simulator (what the compute does meanwhile is the figure, not asserted here)."""
    out = tmp_path / "awake.json"
    prefix = f"drainer_awake_long_{uuid.uuid4().hex[:8]}"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.awake", "--server", pg_url, "--database", prefix,
             "--workload", "long", "--handler-seconds", "2", "--window", "8",
             "--idle-timeout", "1", "--warmup", "2", "--cold-start", "0.3",
             "--only", "known-work", "--json", str(out)],
            capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "L at 0 s: 10 jobs + trigger, handlers of 2 s, --concurrency 10" in proc.stdout
        (r,) = json.loads(out.read_text())["results"]
        assert r["jobs"] == 10 and r["command"].endswith("--concurrency 10"), r
        assert r["sim_awake_s"] is not None and r["resumes"] >= 1
    finally:
        _drop(pg_url, prefix, ["known-work"])
