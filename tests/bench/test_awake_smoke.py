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
    assertions: the figures are in docs/control.md)."""
    out = tmp_path / "awake.json"
    prefix = f"drainer_awake_retry_{uuid.uuid4().hex[:8]}"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.awake", "--server", pg_url, "--database", prefix,
             "--workload", "retry", "--window", "8", "--idle-timeout", "1", "--warmup", "1.5",
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
