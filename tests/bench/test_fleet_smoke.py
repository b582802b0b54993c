"""``python -m bench.fleet`` runs end to end at a tiny size on the test server (no timing
assertions: what the server counted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_fleet_bench_smoke(pg_url: str, tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.fleet", "--server", pg_url, "--tenants", "12",
         "--with-work", "0.25", "--jobs", "3", "--job-ms", "1", "--repeat", "1",
         "--fleet-concurrency", "4", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| fleet | " in proc.stdout and "| naive | " in proc.stdout
    runs = {r["contender"]: r for r in json.loads(out.read_text())["runs"]}
    fleet, naive = runs["fleet"], runs["naive"]
    assert (fleet["tenants_connected"], fleet["sessions_on_idle_tenants"]) == (3, 0)
    assert fleet["tenants_drained"] == 3
    assert (naive["tenants_connected"], naive["sessions_on_idle_tenants"]) == (12, 9)
    assert fleet["jobs_done"] == naive["jobs_done"] == 9
