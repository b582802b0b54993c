"""A/B of two drainer source trees' SQL under pgbench, beside the SQL of *Postgres as a job queue*.

    python -m bench.ab_sql OLD_DIR NEW_DIR [CLIENTS] [LIMITS] [ROUNDS] [JOBS]

OLD_DIR and NEW_DIR each hold a ``drainer`` package (``git archive REV drainer | tar -x -C
DIR``) at the same schema version. Each tree renders its own ``claim_batch`` and
``complete_many`` as the capacity section does (bench.contenders.pgbench_script); for each
setting (CLIENTS x LIMITS, default ``1,2,4,8`` and ``10``) the script of *Postgres as a job
queue* on its table and the two trees' scripts on drainer's table run back to back, the
order rotating every round (ROUNDS, default 3), each draining JOBS (default 40,000) freshly
filled due jobs, as in bench/capacity.py (own database, ``drainer_bench_capacity_ab``,
dropped after). Prints the medians and the same-round ratios as a markdown table.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

import psycopg
from psycopg import sql

from bench import capacity
from bench.core import ROOT, ensure_database

SERVER = os.environ.get("BENCH_SERVER_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
DATABASE = "drainer_bench_capacity_ab"


def script_of(tree: str, url: str, limit: int) -> str:
    """The pgbench script of drainer's SQL as ``tree`` writes it (its queries.sql)."""
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; "
            "from bench.contenders import pgbench_script; "
            "print(pgbench_script(sys.argv[3], sys.argv[4], 'bench', int(sys.argv[5])), end='')")
    return subprocess.run(
        [sys.executable, "-c", code, os.path.abspath(tree), str(ROOT), url,
         capacity.SCHEMAS["drainer"], str(limit)],
        check=True, capture_output=True, text=True, cwd="/").stdout


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    old, new = argv[0], argv[1]
    clients = [int(c) for c in (argv[2] if len(argv) > 2 else "1,2,4,8").split(",")]
    limits = [int(b) for b in (argv[3] if len(argv) > 3 else "10").split(",")]
    rounds = int(argv[4]) if len(argv) > 4 else 3
    jobs = capacity.jobs_for(int(argv[5]) if len(argv) > 5 else 40_000, tuple(clients),
                             tuple(limits))
    url = ensure_database(SERVER, DATABASE)
    print(f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}",
          file=sys.stderr)
    results: dict[tuple[int, int], list[dict[str, float]]] = {}
    try:
        capacity.setup(url)
        for b in limits:
            scripts = {"old": script_of(old, url, b), "new": script_of(new, url, b)}
            for c in clients:
                for rnd in range(rounds):
                    order = ["article", "old", "new"]
                    order = order[rnd % 3:] + order[:rnd % 3]
                    got: dict[str, float] = {}
                    for name in order:
                        who = "article" if name == "article" else "drainer"
                        run = capacity.run_one(url, who, c, b, jobs, scripts.get(name))
                        if isinstance(run, str):
                            print(f"{name} c={c} LIMIT {b}: INVALID run: {run}", file=sys.stderr)
                            break
                        got[name] = run.jobs_per_s
                    else:
                        results.setdefault((c, b), []).append(got)
                        print(f"round {rnd + 1}/{rounds} c={c} LIMIT {b}: "
                              + ", ".join(f"{k} {v:,.0f}" for k, v in got.items()),
                              file=sys.stderr, flush=True)
    finally:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(DATABASE)))
    print(f"load average at end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}",
          file=sys.stderr)
    print(f"{jobs:,} due jobs a run; pgbench -n -M prepared -c C -j C; medians of {rounds} "
          "rounds, ratios taken in the same round\n")
    print("| clients | LIMIT | article's SQL jobs/s | OLD jobs/s | NEW jobs/s | OLD / article "
          "| NEW / article | NEW / OLD |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (c, b), rs in results.items():
        def med(k: str, rs: list[dict[str, float]] = rs) -> float:
            return statistics.median(r[k] for r in rs)

        def same(a: str, d: str, rs: list[dict[str, float]] = rs) -> float:
            return statistics.median(r[a] / r[d] for r in rs)

        print(f"| {c} | {b} | {med('article'):,.0f} | {med('old'):,.0f} | {med('new'):,.0f} "
              f"| {same('old', 'article'):.2f} | {same('new', 'article'):.2f} "
              f"| {same('new', 'old'):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
