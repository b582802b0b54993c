"""The capacity section runs pgbench on both scripts at a tiny size and drops its database."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from bench.capacity import jobs_for

ROOT = Path(__file__).resolve().parent.parent.parent


def test_every_run_ends_on_a_full_claim() -> None:
    n = jobs_for(40_000, (1, 2, 4, 8), (10, 1000))
    assert n == 40_000 and all(n % (c * b) == 0 for c in (1, 2, 4, 8) for b in (10, 1000))
    assert jobs_for(400, (1, 2), (10, 1000)) == 2000


@pytest.mark.skipif(shutil.which("pgbench") is None, reason="pgbench is not installed")
def test_capacity_smoke_prints_both_scripts_side_by_side(pg_url: str, tmp_path: Path) -> None:
    database = f"drainer_bench_cap_{uuid.uuid4().hex[:8]}"
    out = tmp_path / "cap"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--no-peers", "--server", pg_url,
         "--database", database, "--only", "capacity", "--output", str(out)],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "### Server capacity: pgbench, 2,000 due jobs a run" in proc.stdout
    assert "server capacity (best of article's SQL): **" in proc.stdout
    assert "INVALID" not in proc.stderr, proc.stderr[-2000:]
    cap = json.loads(out.with_suffix(".json").read_text())["capacity"]
    cells = {(c["who"], c["clients"], c["limit"]): c for c in cap["cells"]}
    assert set(cells) == {(w, c, b) for w in ("article", "drainer") for c in (1, 2)
                          for b in (10, 1000)}
    assert all(len(c["jobs_per_s"]) == 1 and c["jobs_per_s"][0] > 0 for c in cells.values())
    with psycopg.connect(pg_url, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s",
                            [f"{database}_capacity"]).fetchone()
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(database)))  # the bench's own, which it keeps
    assert left == (0,)  # the throwaway capacity database is gone
