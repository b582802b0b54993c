"""A/B of two drainer source trees through the delay proxy: a drain and an empty run.

    python -m bench.ab_link OLD_DIR NEW_DIR [JOBS] [ROUNDS] [RTT_MS,...]

OLD_DIR and NEW_DIR each hold a ``drainer`` package (``git archive REV drainer | tar -x -C
DIR``). Each tree drains JOBS no-op jobs and then an empty queue, directly (RTT 0) and
through bench/proxy.py at each RTT, interleaved (the order reversed every other round).
Prints the median jobs/s (or wall), and through the proxy the seconds the server sessions
were held and the statements they carried. ``DRAINER_CONCURRENCY`` and the other settings
in the environment reach both trees; ``BENCH_AB_DATABASE`` names the database (default
``drainer_bench_ab_link``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from bench.core import ROOT, ab_database, fill, prepare_tree
from bench.link import via
from bench.proxy import DelayProxy

SERVER = os.environ.get("BENCH_SERVER_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
Result = tuple[float, float | None, int | None]


def _run(tree: str, url: str, schema: str, jobs: int, proxy: DelayProxy | None) -> Result:
    fill(url, schema, jobs)
    if proxy is not None:
        proxy.take()
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{ROOT}",
               DRAINER_DATABASE_URL=url if proxy is None else via(url, proxy),
               DRAINER_SCHEMA=schema, DRAINER_APP="bench.noop_app",
               DRAINER_LOG_LEVEL="WARNING")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "drainer", "run-once"], env=env, cwd="/",
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0 or json.loads(p.stdout.splitlines()[-1])["succeeded"] != jobs:
        raise SystemExit(f"{tree}: bad run: {p.stderr[-500:]}")
    if proxy is None:
        return wall, None, None
    proxy.settle()
    sessions = proxy.take()
    return wall, sum(s.held for s in sessions), sum(s.statements for s in sessions)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    trees = {"old": argv[0], "new": argv[1]}
    n = int(argv[2]) if len(argv) > 2 else 20_000
    rounds = int(argv[3]) if len(argv) > 3 else 3
    rtts = [float(x) for x in (argv[4] if len(argv) > 4 else "0,10").split(",")]
    url = ab_database(SERVER, "drainer_bench_ab_link")
    schemas = {k: f"b_ab_link_{k}" for k in trees}
    for k, tree in trees.items():
        prepare_tree(tree, url, schemas[k])
    proxies = {r: DelayProxy(r, ("127.0.0.1", 5432)) for r in rtts if r > 0}
    for proxy in proxies.values():
        proxy.start()
    results: dict[tuple[str, float, int], list[Result]] = {}
    try:
        for rnd in range(rounds):
            order = [(k, r, j) for r in rtts for j in (n, 0) for k in trees]
            for k, r, j in order[::-1] if rnd % 2 else order:
                results.setdefault((k, r, j), []).append(
                    _run(trees[k], url, schemas[k], j, proxies.get(r)))
    finally:
        for proxy in proxies.values():
            proxy.stop()
    for (k, r, j), runs in sorted(results.items(), key=lambda x: (-x[0][2], x[0][1], x[0][0])):
        wall = statistics.median(w for w, _h, _s in runs)
        line = f"{f'drain {j:,}' if j else 'empty run'}, RTT {r:g} ms, {k}: "
        line += f"{j / wall:,.0f} jobs/s" if j else f"wall {wall:.3f} s"
        if runs[0][1] is not None:
            held = statistics.median(h or 0.0 for _w, h, _s in runs)
            statements = statistics.median(s or 0 for _w, _h, s in runs)
            line += f", held {held:.3f} s, {statements:.0f} statements"
        print(f"{line} ({len(runs)} runs)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
