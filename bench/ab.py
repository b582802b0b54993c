"""A/B of two drainer source trees: ``drainer run-once`` wall on the same queue, interleaved.

    python -m bench.ab OLD_DIR NEW_DIR [JOBS] [ROUNDS] [-- drainer flags]

OLD_DIR and NEW_DIR each hold a ``drainer`` package (e.g. ``git archive REV drainer | tar -x
-C OLD_DIR``); each run gets ``PYTHONPATH=DIR:<repo>`` and runs from a neutral directory so
that DIR wins over the installed copy. Prints the median, min and max jobs/s of each.
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

from bench.core import ROOT, fill, fresh_schema

DB = os.environ.get("BENCH_AB_URL", "postgresql://postgres@127.0.0.1:5432/drainer_bench")


def main(argv: list[str]) -> int:
    flags: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, flags = argv[:i], argv[i + 1:]
    old, new = argv[0], argv[1]
    n = int(argv[2]) if len(argv) > 2 else 20_000
    rounds = int(argv[3]) if len(argv) > 3 else 5
    schemas = {old: "b_ab_old", new: "b_ab_new"}
    for d, s in schemas.items():
        fresh_schema(DB, s)
        # each tree migrates its own schema: the two may be at different schema versions
        with psycopg.connect(DB, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(s)))
        subprocess.run([sys.executable, "-m", "drainer", "migrate"], check=True, cwd="/",
                       capture_output=True, env=dict(
                           os.environ, PYTHONPATH=f"{d}{os.pathsep}{ROOT}",
                           DRAINER_DATABASE_URL=DB, DRAINER_SCHEMA=s))
    rates: dict[str, list[float]] = {old: [], new: []}
    for r in range(rounds):
        for d in ([old, new] if r % 2 == 0 else [new, old]):
            fill(DB, schemas[d], n)
            env = dict(os.environ, PYTHONPATH=f"{d}{os.pathsep}{ROOT}", DRAINER_DATABASE_URL=DB,
                       DRAINER_SCHEMA=schemas[d], DRAINER_APP="bench.noop_app",
                       DRAINER_LOG_LEVEL="WARNING")
            started = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "drainer", "run-once", *flags], env=env,
                               cwd="/", capture_output=True, text=True)
            wall = time.perf_counter() - started
            if p.returncode != 0 or json.loads(p.stdout.splitlines()[-1])["succeeded"] != n:
                sys.stderr.write(f"{d}: bad run: {p.stderr[-500:]}\n")
                return 1
            rates[d].append(n / wall)
    for d, v in rates.items():
        print(f"{d}: median {statistics.median(v):,.0f} jobs/s (min {min(v):,.0f}, "
              f"max {max(v):,.0f}, {len(v)} runs of {n:,} jobs)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
