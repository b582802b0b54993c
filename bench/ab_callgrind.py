"""A/B of two drainer source trees in instructions: what a claim or an empty wake costs a server.

    python -m bench.ab_callgrind OLD_DIR NEW_DIR [BATCH] [EXECUTIONS] [LATER] [JOBS]
    python -m bench.ab_callgrind OLD_DIR NEW_DIR wake [QUEUES,...]

This machine's timings move by 2x from one hour to the next, and a few percent per claim is
lost in them; instruction counts are not. OLD_DIR and NEW_DIR each hold a ``drainer``
package (``git archive REV drainer | tar -x -C DIR``). Each tree migrates a schema of its
own in a throwaway cluster (initdb in /var/tmp) that holds JOBS due jobs (default 20,000)
of one queue, and LATER jobs of it scheduled for tomorrow (default 0); the server is
stopped, and for each tree a copy of the cluster runs ``postgres --single`` under
valgrind's callgrind: the tree's ``claim_batch`` (rendered by its own queries.sql)
prepared, then executed EXECUTIONS times (default 200) claiming BATCH jobs each (default
10, every job started at once, as the drain sends it in step). The same script with no
execution is counted too, so the figure printed is instructions per claim, start-up,
PREPARE and shutdown excluded. Counts repeat to a few hundred instructions (timestamps in
the text and the data) for the same binaries and data.
Claims past the due jobs come back short, then empty: ``python -m bench.ab_callgrind OLD
NEW 10 1 100000 5`` is a claim that finds 5 jobs beside 100,000 scheduled for later (the
first executions of a prepared statement are custom plans: planned, not only run).

``wake``: the first Query of an empty ``drainer run-once`` (run_start, the first claim and
finish_run in one), as each tree sends it with an app of that many queues (default 1 and
300; one no-op ``@task`` each), taken from the server's log, then run once in a new
``postgres --single`` backend on the empty table: what an empty wake costs the server in
a fresh session, its catalog caches cold (a ``SELECT 1`` alone is subtracted).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.ab_wake import schedule_later
from bench.core import ROOT, fill, prepare_tree
from bench.fleet import _bindir, as_postgres, cluster_in
from bench.link import write_queue_apps

QUEUE = "bench"
#: the throwaway server's settings (stopped with -m fast: a copy of its data directory then
#: starts without recovery)
SETTINGS: dict[str, object] = {"autovacuum": "off", "fsync": "off"}
PARAMS = ["queue", "batch_size", "start_now", "run_id", "lease"]


def claim_text(tree: str, url: str, schema: str) -> str:
    """``claim_batch`` as ``tree`` renders it, its parameters as $1..$5 (PARAMS' order)."""
    code = ("import sys; sys.path[:0] = [sys.argv[1]]; import psycopg; "
            "from drainer.db import Queries; "
            "print(Queries(psycopg.connect(sys.argv[2]), sys.argv[3], 'jobs')"
            ".text('claim_batch'), end='')")
    text = subprocess.run([sys.executable, "-c", code, os.path.abspath(tree), url, schema],
                          check=True, capture_output=True, text=True, cwd="/").stdout
    for i, name in enumerate(PARAMS, start=1):
        text = text.replace(f"%({name})s", f"${i}")
    return text


def instructions(root: Path, text: str, executions: int, batch: int) -> int:
    """Instructions of a ``postgres --single`` backend (on a copy of the cluster) that
    prepares ``text`` and executes it ``executions`` times."""
    script = "PREPARE c(text, int8, int8, text, float8) AS " + text + ";\n\n"
    script += f"EXECUTE c('{QUEUE}', {batch}, {batch}, 'bench', 300);\n\n" * executions
    return single_user(root, script)


def single_user(root: Path, script: str) -> int:
    """Instructions of a ``postgres --single`` backend, on a copy of the cluster, that runs
    ``script`` (statements ending in a semicolon and a blank line)."""
    data = root / "run"
    shutil.rmtree(data, ignore_errors=True)
    subprocess.run(["cp", "-a", str(root / "data"), str(data)], check=True)
    out = root / "callgrind.out"
    out.unlink(missing_ok=True)
    p = subprocess.run([*as_postgres(root), "valgrind", "--tool=callgrind",
                        f"--callgrind-out-file={out}", str(_bindir() / "postgres"),
                        "--single", "-j", "-D", str(data), "-c", "autovacuum=off",
                        "-c", "jit=off", "-c", "log_min_duration_statement=-1", "postgres"],
                       input=script, capture_output=True, text=True)
    m = re.search(r"Collected : (\d+)", p.stderr)
    if p.returncode != 0 or m is None or "ERROR" in p.stdout + p.stderr:
        raise SystemExit(f"bench.ab_callgrind: the backend failed: {p.stderr[-600:]}")
    return int(m.group(1))


def first_query(log: Path, offset: int) -> str:
    """The first statement the server logged after ``offset`` (log_min_duration_statement=0:
    each entry a line with a timestamp, its text on the lines that follow)."""
    with log.open() as f:
        f.seek(offset)
        lines = f.read().splitlines()
    entry = re.compile(r"^\d{4}-\d\d-\d\d ")
    for i, line in enumerate(lines):
        if "statement: " in line:
            body = [line.split("statement: ", 1)[1]]
            for more in lines[i + 1:]:
                if entry.match(more):
                    break
                body.append(more[1:] if more.startswith("\t") else more)
            return "\n".join(body)
    raise SystemExit("bench.ab_callgrind: the run's first Query is not in the server log")


def wake(trees: dict[str, str], counts: list[int]) -> int:
    root = Path(tempfile.mkdtemp(prefix="drainer-callgrind-", dir="/var/tmp"))
    apps = root / "apps"
    apps.mkdir()
    names = write_queue_apps(apps, tuple(counts))
    try:
        texts: dict[tuple[str, int], str] = {}
        with cluster_in(root, {**SETTINGS, "log_min_duration_statement": 0}, "fast") as url:
            for k, tree in trees.items():
                schema = f"b_callgrind_{k}"
                prepare_tree(tree, url, schema)
                for n in counts:
                    offset = (root / "log").stat().st_size
                    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                        [os.path.abspath(tree), str(apps), str(ROOT)]),
                        DRAINER_DATABASE_URL=url, DRAINER_SCHEMA=schema,
                        DRAINER_APP=names[n], DRAINER_LOG_LEVEL="WARNING")
                    subprocess.run([sys.executable, "-m", "drainer", "run-once"], env=env,
                                   cwd="/", check=True, capture_output=True)
                    texts[(k, n)] = first_query(root / "log", offset)
        base = single_user(root, "SELECT 1;\n\n")
        cost = {key: single_user(root, text.rstrip().rstrip(";") + ";\n\n") - base
                for key, text in texts.items()}
        print("an empty run-once's first Query, run once in a new postgres --single backend "
              "(catalog caches cold); instructions (callgrind), SELECT 1 subtracted\n")
        print("| queues | old | new | new / old | bytes old | bytes new |")
        print("|---:|---:|---:|---:|---:|---:|")
        for n in counts:
            print(f"| {n} | {cost[('old', n)]:,} | {cost[('new', n)]:,} | "
                  f"{cost[('new', n)] / cost[('old', n)]:.3f} | {len(texts[('old', n)]):,} | "
                  f"{len(texts[('new', n)]):,} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    if shutil.which("valgrind") is None:
        print("bench.ab_callgrind: valgrind is not installed (apt install valgrind)",
              file=sys.stderr)
        return 2
    trees = {"old": argv[0], "new": argv[1]}
    if len(argv) > 2 and argv[2] == "wake":
        return wake(trees, [int(x) for x in (argv[3] if len(argv) > 3 else "1,300").split(",")])
    batch = int(argv[2]) if len(argv) > 2 else 10
    executions = int(argv[3]) if len(argv) > 3 else 200
    later = int(argv[4]) if len(argv) > 4 else 0
    jobs = int(argv[5]) if len(argv) > 5 else 20_000
    if executions < 1:
        print("bench.ab_callgrind: EXECUTIONS must be 1 or more", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="drainer-callgrind-", dir="/var/tmp"))
    try:
        texts: dict[str, str] = {}
        with cluster_in(root, SETTINGS, "fast") as url:
            for k, tree in trees.items():
                schema = f"b_callgrind_{k}"
                prepare_tree(tree, url, schema)
                fill(url, schema, jobs, [QUEUE])
                if later:
                    schedule_later(url, schema, QUEUE, later)
                texts[k] = claim_text(tree, url, schema)
        per_claim = {}
        for k, text in texts.items():
            base = instructions(root, text, 0, batch)
            total = instructions(root, text, executions, batch)
            per_claim[k] = (total - base) / executions
        print(f"claim_batch of {batch} jobs, {executions} executions, prepared, {jobs:,} due "
              f"and {later:,} scheduled for later in the queue; instructions per claim "
              "(callgrind)\n")
        print("| tree | instructions per claim | per job |")
        print("|---|---:|---:|")
        for k, n in per_claim.items():
            print(f"| {k} ({trees[k]}) | {n:,.0f} | {n / batch:,.0f} |")
        print(f"\nnew / old: {per_claim['new'] / per_claim['old']:.3f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
