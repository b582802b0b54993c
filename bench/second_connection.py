"""Would a second connection raise a local drain's rate? One drainer against two at once.

    python -m bench.second_connection [JOBS] [ROUNDS]

Drains JOBS no-op jobs (default 20,000) with one ``drainer run-once`` process, and with
two started together on the same queue (two connections, two Python clients: both cores,
and no GIL between them), interleaved for ROUNDS rounds (default 3). Prints the median
jobs/s of each (all jobs over the wall from the first start to the last exit) and the
load average. Two processes are an upper bound of what one process with a second
connection (for completions, or a second claimer) could reach: its two connections would
share one interpreter. If two processes do not drain faster than one, the server (or the
machine) is the bound, and a second connection in one process cannot help.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from bench.core import ROOT, ab_database, fill, prepare_tree

SERVER = os.environ.get("BENCH_SERVER_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def _drain(tree: str, url: str, schema: str, jobs: int, processes: int) -> float:
    fill(url, schema, jobs)
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{ROOT}", DRAINER_DATABASE_URL=url,
               DRAINER_SCHEMA=schema, DRAINER_APP="bench.noop_app",
               DRAINER_LOG_LEVEL="WARNING")
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "drainer", "run-once"], env=env,
                              cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(processes)]
    outs = [p.communicate() for p in procs]
    wall = time.perf_counter() - t0
    done = 0
    for p, (out, err) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            raise SystemExit(f"bad run: {err[-500:]}")
        done += json.loads(out.splitlines()[-1])["succeeded"]
    if done != jobs:
        raise SystemExit(f"drained {done} of {jobs}")
    return jobs / wall


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 20_000
    rounds = int(argv[1]) if len(argv) > 1 else 3
    tree = os.path.dirname(os.path.dirname(os.path.abspath(__import__("drainer").__file__)))
    url = ab_database(SERVER, "drainer_bench_second_connection")
    schema = "b_second_connection"
    prepare_tree(tree, url, schema)
    rates: dict[int, list[float]] = {1: [], 2: []}
    print(f"load before: {os.getloadavg()}", flush=True)
    for rnd in range(rounds):
        for k in ((1, 2) if rnd % 2 == 0 else (2, 1)):
            rates[k].append(_drain(tree, url, schema, n, k))
    one, two = (statistics.median(rates[k]) for k in (1, 2))
    print(f"drain {n:,}: 1 process {one:,.0f} jobs/s, 2 processes {two:,.0f} jobs/s "
          f"({two / one:.2f}x; {rounds} interleaved rounds; runs {rates})")
    print(f"load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
