"""The benchmark harness runs end to end at a tiny size (no peers, no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_bench_smoke_prints_the_tables(pg_url: str, tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--no-peers", "--server", pg_url,
         "--database", "drainer_bench_smoke", "--only", "drain,cold,enqueue",
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
