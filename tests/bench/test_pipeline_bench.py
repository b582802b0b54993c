"""bench.pipeline drains a queue in step and pipelined, per source tree, and compares them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_statement_alone_in_step_and_pipelined_for_two_trees(pg_url: str,
                                                                 tmp_path: Path) -> None:
    trees = [tmp_path / "a", tmp_path / "b"]
    for tree in trees:
        shutil.copytree(ROOT / "drainer", tree / "drainer",
                        ignore=shutil.ignore_patterns("__pycache__"))
    name = f"drainer_bench_pipeline_{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, BENCH_SERVER_URL=pg_url, BENCH_AB_DATABASE=name)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.pipeline", "300", "1", "0,1", "10", *map(str, trees)],
            capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    a, b = trees
    for rtt in ("0", "1"):
        for tree in trees:
            # every job done (the bench checks it): a statement a batch of 10, then one that
            # finds the queue empty (pipelined: two, the second sent before the first is back)
            assert any(x.startswith(f"RTT {rtt} ms, in step, {tree}: ") and
                       x.endswith("31 statements (1 runs)") for x in lines), proc.stdout
            assert any(x.startswith(f"RTT {rtt} ms, pipelined, {tree}: ") and
                       x.endswith("32 statements (1 runs)") for x in lines), proc.stdout
            assert f"RTT {rtt} ms, {tree}: pipelined / in step " in proc.stdout
        assert f"RTT {rtt} ms, pipelined: {b} / {a} " in proc.stdout
