"""A/B of two drainer source trees through the delay proxy: a wake that finds a few jobs.

    python -m bench.ab_wake OLD_DIR NEW_DIR [ROUNDS] [RTT_MS] [QUEUES,...] [JOBS,...] [LATER]
        [DEAD]

For each number of queues (an app generated with one no-op ``@task`` each) and each number
of jobs (due, all on the LAST queue; 0: an empty run), each tree runs ``drainer run-once``
through bench/proxy.py at RTT_MS, interleaved (the order reversed every other round).
Prints the median (and least) seconds the server sessions were held, connect to close, and
the statements they carried. LATER: jobs scheduled for tomorrow on the last queue too
(default 0), which a wake must not read one by one. DEAD: dead tuples left in the table
before each run, counted in its statistics (default 0): at ``--vacuum-threshold`` (1,000)
or more the run ends with a VACUUM. ``BENCH_AB_DATABASE`` names the database
(default ``drainer_bench_ab_wake``). Defaults: 10 rounds, 10 ms, 1 and 300 queues, 0, 1 and
5 jobs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
from psycopg import sql

from bench.core import ROOT, ab_database, fill, jobs_table, prepare_tree
from bench.link import via, write_queue_apps
from bench.proxy import DelayProxy

SERVER = os.environ.get("BENCH_SERVER_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    trees = {"old": argv[0], "new": argv[1]}
    rounds = int(argv[2]) if len(argv) > 2 else 10
    rtt = float(argv[3]) if len(argv) > 3 else 10.0
    counts = [int(x) for x in (argv[4] if len(argv) > 4 else "1,300").split(",")]
    jobs = [int(x) for x in (argv[5] if len(argv) > 5 else "0,1,5").split(",")]
    later = int(argv[6]) if len(argv) > 6 else 0
    dead = int(argv[7]) if len(argv) > 7 else 0
    url = ab_database(SERVER, "drainer_bench_ab_wake")
    schemas = {k: f"b_ab_wake_{k}" for k in trees}
    for k, tree in trees.items():
        prepare_tree(tree, url, schemas[k])
    apps = Path(tempfile.mkdtemp(prefix="bench-wake-"))
    names = write_queue_apps(apps, tuple(counts))
    proxy = DelayProxy(rtt, ("127.0.0.1", 5432))
    proxy.start()
    results: dict[tuple[int, int, str], list[tuple[float, int]]] = {}
    try:
        for rnd in range(rounds):
            order = [(k, n, j) for n in counts for j in jobs for k in trees]
            for k, n, j in order[::-1] if rnd % 2 else order:
                fill(url, schemas[k], j, [f"q{n - 1:03d}"])
                if later:
                    schedule_later(url, schemas[k], f"q{n - 1:03d}", later)
                if dead:
                    leave_dead(url, schemas[k], dead)
                proxy.take()
                env = dict(os.environ,
                           PYTHONPATH=os.pathsep.join([trees[k], str(apps), str(ROOT)]),
                           DRAINER_DATABASE_URL=via(url, proxy), DRAINER_SCHEMA=schemas[k],
                           DRAINER_APP=names[n], DRAINER_LOG_LEVEL="WARNING")
                p = subprocess.run([sys.executable, "-m", "drainer", "run-once"], env=env,
                                   cwd="/", capture_output=True, text=True)
                report = json.loads(p.stdout.splitlines()[-1]) if p.returncode == 0 else {}
                if report.get("succeeded") != j or (dead >= 1000 and not report["vacuumed"]):
                    raise SystemExit(f"{trees[k]}: bad run: {p.stderr[-500:]}")
                proxy.settle()
                sessions = proxy.take()
                results.setdefault((n, j, k), []).append(
                    (sum(s.held for s in sessions), sum(s.statements for s in sessions)))
    finally:
        proxy.stop()
    for (n, j, k), runs in sorted(results.items()):
        held = [h for h, _s in runs]
        print(f"{n} queues, {j} jobs, {later:,} later, {dead:,} dead, RTT {rtt:g} ms, {k}: held "
              f"{statistics.median(held) * 1000:.1f} ms (least {min(held) * 1000:.1f}), "
              f"{statistics.median(s for _h, s in runs):.0f} statements ({len(runs)} runs)",
              flush=True)
    return 0


def schedule_later(url: str, schema: str, queue: str, n: int) -> None:
    """``n`` jobs of ``queue`` due from tomorrow on (a second apart), statistics fresh."""
    table = jobs_table(schema)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL(
            "INSERT INTO {} (queue, payload, run_at) SELECT %s, '{{}}', "
            "now() + interval '1 day' + g * interval '1s' FROM generate_series(1, %s) g"
        ).format(table), [queue, n])
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(table))


def leave_dead(url: str, schema: str, n: int) -> None:
    """``n`` dead tuples in the jobs table (rows inserted, then deleted), in its statistics
    when the run reads them (a backend's counts reach them when it flushes)."""
    table = jobs_table(schema)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("INSERT INTO {} (queue, payload, status) SELECT 'dead', '{{}}', "
                             "'done' FROM generate_series(1, %s)").format(table), [n])
        conn.execute(sql.SQL("DELETE FROM {} WHERE queue = 'dead'").format(table))
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT 1")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
