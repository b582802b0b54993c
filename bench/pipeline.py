"""The claim statement alone, in step against pipelined: what drainer's pipeline driver pays.

    python -m bench.pipeline [JOBS] [ROUNDS] [RTT_MS,...] [BATCH] [TREE ...]

A loop of nothing but ``complete_many_and_claim`` (no handlers, no drain loop) drains JOBS
no-op jobs BATCH at a time, two ways: in step (``Queries.complete_many_and_claim``, psycopg's
``execute``: each statement waits for the one before) and pipelined (``ClaimPipeline``, two
statements in flight, each batch completed by the statement after next), directly (RTT 0)
and through bench/proxy.py at each other RTT. Each TREE (a directory holding a ``drainer``
package, ``git archive REV drainer | tar -x -C DIR``; default: this checkout) runs in a
process of its own, interleaved with the others (the order reversed every other round).
Prints per tree, RTT and way the median jobs/s, the client's CPU microseconds a statement
(its process time over the statements it sent: the Python work per statement) and the
statements; then pipelined over in step, and every tree over the first.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import psycopg
from psycopg import sql

from bench.core import ROOT, ab_database, fill, fresh_schema, prepare_tree
from bench.link import via
from bench.proxy import DelayProxy
from drainer.db import ClaimPipeline, Queries

SERVER = os.environ.get("BENCH_SERVER_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
WAYS = ("in step", "pipelined")
#: the tree of no TREE argument: the drainer this checkout imports
CHECKOUT = "this checkout"
#: seconds a claim's lease lasts (never reached: every job is completed at once)
LEASE = 300.0


def in_step(q: Queries, batch: int) -> int:
    """Drain the queue with one statement at a time; return the statements sent."""
    statements = 1
    _, rows = q.complete_many_and_claim([], [], "bench", batch, LEASE)
    while rows:
        _, rows = q.complete_many_and_claim([r.id for r in rows], [r.fence or 0 for r in rows],
                                            "bench", batch, LEASE)
        statements += 1
    return statements


def pipelined(q: Queries, batch: int) -> int:
    """Drain the queue with two statements in flight; return the statements sent."""
    pipe = ClaimPipeline(q)
    pipe.send([], [], "bench", batch, LEASE)
    pipe.send([], [], "bench", batch, LEASE)
    statements = 2
    while pipe.in_flight:
        _, rows = pipe.receive()
        if rows:
            pipe.send([r.id for r in rows], [r.fence or 0 for r in rows], "bench", batch, LEASE)
            statements += 1
    return statements


def child(way: str, url: str, schema: str, batch: int) -> None:
    """One timed loop (connected first), in the process of the tree under test: prints its
    JSON line."""
    drain = in_step if way == WAYS[0] else pipelined
    with psycopg.connect(url, autocommit=True) as conn:
        q = Queries(conn, schema, "jobs")
        wall, cpu = time.perf_counter(), time.process_time()
        statements = drain(q, batch)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(json.dumps({"wall": wall, "cpu": cpu, "statements": statements}))


def _run(tree: str, way: str, url: str, schema: str, jobs: int, batch: int,
         proxy: DelayProxy | None) -> dict[str, Any]:
    fill(url, schema, jobs)
    path = str(ROOT) if tree == CHECKOUT else f"{tree}{os.pathsep}{ROOT}"
    env = dict(os.environ, PYTHONPATH=path)
    link = url if proxy is None else via(url, proxy)
    p = subprocess.run([sys.executable, "-m", "bench.pipeline", "--child", way, link, schema,
                        str(batch)], env=env, cwd="/", capture_output=True, text=True)
    if proxy is not None:
        proxy.settle()
        proxy.take()
    if p.returncode != 0:
        raise SystemExit(f"{tree}: {way}: {p.stderr[-500:]}")
    out: dict[str, Any] = json.loads(p.stdout.splitlines()[-1])
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE status = 'done'").format(
            sql.Identifier(schema, "jobs"))).fetchone()
    if not row or row[0] != jobs:
        raise SystemExit(f"{tree}: {way}: {row and row[0]} of {jobs} jobs done")
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        child(argv[1], argv[2], argv[3], int(argv[4]))
        return 0
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__, file=sys.stderr)
        return 2
    jobs = int(argv[0]) if argv else 20_000
    rounds = int(argv[1]) if len(argv) > 1 else 5
    rtts = [float(x) for x in (argv[2] if len(argv) > 2 else "0,1").split(",")]
    batch = int(argv[3]) if len(argv) > 3 else 10
    trees = argv[4:] or [CHECKOUT]
    url = ab_database(SERVER, "drainer_bench_pipeline")
    schemas = {t: f"b_pipeline_{i}" for i, t in enumerate(trees)}
    for t in trees:
        if t == CHECKOUT:
            fresh_schema(url, schemas[t])
        else:
            prepare_tree(t, url, schemas[t])
    proxies = {r: DelayProxy(r, ("127.0.0.1", 5432)) for r in rtts if r > 0}
    for proxy in proxies.values():
        proxy.start()
    runs: dict[tuple[float, str, str], list[dict[str, Any]]] = {}
    try:
        for rnd in range(rounds):
            order = [(r, w, t) for r in rtts for w in WAYS for t in trees]
            for r, w, t in order[::-1] if rnd % 2 else order:
                runs.setdefault((r, w, t), []).append(
                    _run(t, w, url, schemas[t], jobs, batch, proxies.get(r)))
    finally:
        for proxy in proxies.values():
            proxy.stop()
    rate = {k: jobs / statistics.median(x["wall"] for x in v) for k, v in runs.items()}
    for (r, w, t), v in runs.items():
        cpu = statistics.median(x["cpu"] / x["statements"] for x in v) * 1e6
        statements = statistics.median(x["statements"] for x in v)
        print(f"RTT {r:g} ms, {w}, {t}: {rate[r, w, t]:,.0f} jobs/s, {cpu:.0f} us CPU a "
              f"statement, {statements:.0f} statements ({len(v)} runs)", flush=True)
    for r in rtts:
        for t in trees:
            print(f"RTT {r:g} ms, {t}: pipelined / in step "
                  f"{rate[r, WAYS[1], t] / rate[r, WAYS[0], t]:.2f}x")
        for w in WAYS:
            for t in trees[1:]:
                print(f"RTT {r:g} ms, {w}: {t} / {trees[0]} "
                      f"{rate[r, w, t] / rate[r, w, trees[0]]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
