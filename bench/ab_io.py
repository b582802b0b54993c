"""A/B of two drainer source trees on the I/O bench's handlers, interleaved.

    python -m bench.ab_io OLD_DIR NEW_DIR [CONCURRENCY] [ROUNDS] [async|sync]

OLD_DIR and NEW_DIR each hold a ``drainer`` package (``git archive REV drainer | tar -x -C
DIR``). Each round drains 4,000 jobs of bench/io_app.py (each waits 50 ms) with
``run-once --concurrency CONCURRENCY`` from each tree, the order reversed every other
round; prints each tree's median jobs/s by process wall (start-up included, alike for
both) and the ratio new / old.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import psycopg
from psycopg import sql

from bench.core import ROOT, ab_database, fill, prepare_tree

SERVER = os.environ.get("BENCH_SERVER_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
JOBS = 4000


def _env(tree: str, url: str, schema: str) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{ROOT}", DRAINER_DATABASE_URL=url,
                DRAINER_SCHEMA=schema, DRAINER_APP="bench.io_app", DRAINER_LOG_LEVEL="WARNING")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    trees = {"old": argv[0], "new": argv[1]}
    concurrency = int(argv[2]) if len(argv) > 2 else 1000
    rounds = int(argv[3]) if len(argv) > 3 else 6
    queue = f"io_{argv[4] if len(argv) > 4 else 'async'}"
    url = ab_database(SERVER, "drainer_bench_ab_io")
    for k, tree in trees.items():
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                sql.Identifier(f"b_ab_io_{k}")))
        prepare_tree(tree, url, f"b_ab_io_{k}")
    rates: dict[str, list[float]] = {k: [] for k in trees}
    for rnd in range(rounds):
        for k in (["old", "new"] if rnd % 2 == 0 else ["new", "old"]):
            schema = f"b_ab_io_{k}"
            fill(url, schema, JOBS, [queue])
            started = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "drainer", "run-once", "--concurrency",
                                str(concurrency)], env=_env(trees[k], url, schema), cwd="/",
                               capture_output=True, text=True)
            wall = time.perf_counter() - started
            if p.returncode != 0 or json.loads(p.stdout.splitlines()[-1])["succeeded"] != JOBS:
                raise SystemExit(f"{trees[k]}: bad run: {p.stderr[-500:]}")
            rates[k].append(JOBS / wall)
    for k, v in rates.items():
        print(f"{queue} c={concurrency}, {k}: {statistics.median(v):,.0f} jobs/s by process "
              f"wall (min {min(v):,.0f}, max {max(v):,.0f}, {len(v)} runs)")
    ratio = statistics.median(rates["new"]) / statistics.median(rates["old"])
    print(f"new / old: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
