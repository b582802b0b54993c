"""``python -m bench.fleet``: one fleet wake over 1,000 tenant databases with work in 2%.

    python -m bench.fleet                       # 1,000 tenants on a throwaway cluster
    python -m bench.fleet --tenants 200 --repeat 1
    python -m bench.fleet --server postgresql://postgres@127.0.0.1:5432/postgres

Each tenant is a database of its own (copies of one migrated template), on a throwaway
cluster started for the run (initdb in /var/tmp, fsync off, autovacuum off, so that the
only sessions on a tenant database are the contenders'), or on ``--server``. Every
``1/--with-work``-th tenant gets ``--jobs`` jobs of ``--job-ms`` each before every
repetition; the rest have none. Two contenders, interleaved, each a process of its own:

- ``fleet``: ``drainer fleet run-once`` (``--fleet-concurrency``), after the producers said
  ``drainer.fleet.due`` for the tenants they filled. One warm-up run before the first
  repetition drains every tenant once (never seen: its jobs may predate the fleet).
- ``naive``: a loop over every tenant that drains it with ``drainer.drain.run_once``, as many
  at once as the fleet (threads in one process: the kindest naive loop, with no process
  start per tenant); what a scheduler that knows nothing about the tenants does.

Measured from the server: ``pg_stat_database.sessions`` and ``session_time`` of every
tenant database before and after each run (sessions opened on tenants with work and on
the others; session-seconds held), the wall time of the process, and the jobs done. The
awake estimate counts, for each tenant connected to, its sessions plus the idle timeout
its compute then stays up (``--idle-timeout``, Neon's and Aurora's default 300 s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.core import ROOT, log, with_database

PREFIX = "fleet_bench"


# -- the server -----------------------------------------------------------------------------------


def _bindir() -> Path:
    candidates: list[Path] = []
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        candidates.append(Path(out.stdout.strip()))
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for c in candidates:
        if (c / "initdb").exists() and (c / "pg_ctl").exists():
            return c
    raise SystemExit("bench.fleet: no initdb/pg_ctl found (or give --server URL)")


def as_postgres(root: Path) -> list[str]:
    """initdb, pg_ctl and postgres refuse root: the prefix that runs them as postgres (who
    then owns ``root``), or nothing when we are not root."""
    if os.geteuid() != 0:
        return []
    pw = pwd.getpwnam("postgres")
    os.chown(root, pw.pw_uid, pw.pw_gid)
    return ["runuser", "-u", "postgres", "--"]


@contextlib.contextmanager
def cluster_in(root: Path, settings: dict[str, object], stop: str = "immediate"
               ) -> Iterator[str]:
    """initdb in ``root``/data and a server of it on a free port, its log ``root``/log, with
    ``settings`` (-c name=value) besides its address; stopped (pg_ctl -m ``stop``) when the
    block ends, the data directory kept."""
    bindir, as_user = _bindir(), as_postgres(root)
    data = root / "data"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
                    "--auth=trust", "-E", "UTF8", "--no-sync"], check=True,
                   capture_output=True)
    options = " ".join(f"-c {k}={v}" for k, v in {
        "port": port, "listen_addresses": "127.0.0.1", "unix_socket_directories": str(root),
        **settings}.items())
    subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-w", "-l",
                    str(root / "log"), "-o", options, "start"], check=True,
                   capture_output=True)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", stop, "-w",
                        "stop"], capture_output=True)


@contextlib.contextmanager
def throwaway_cluster(max_connections: int) -> Iterator[str]:
    """A PostgreSQL cluster of the run's own on a free port; removed at the end."""
    root = Path(tempfile.mkdtemp(prefix="drainer-fleet-bench-", dir="/var/tmp"))
    try:
        with cluster_in(root, {
                "fsync": "off", "full_page_writes": "off", "synchronous_commit": "off",
                "autovacuum": "off", "max_connections": max_connections,
                "checkpoint_timeout": "30min", "max_wal_size": "8GB"}) as url:
            yield url
    finally:
        shutil.rmtree(root, ignore_errors=True)


def make_tenants(server_url: str, count: int, prefix: str) -> list[tuple[str, str]]:
    """``count`` tenant databases copied from one migrated template: (name, url) each."""
    from drainer.migrate import migrate

    template = f"{prefix}_template"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(template)))
    with psycopg.connect(with_database(server_url, template), autocommit=True) as conn:
        migrate(conn, "drainer", "jobs")
    tenants = []
    started = time.monotonic()
    with psycopg.connect(server_url, autocommit=True) as admin:
        for i in range(count):
            db = f"{prefix}_{i:04d}"
            admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(db), sql.Identifier(template)))
            tenants.append((f"t{i:04d}", with_database(server_url, db)))
            if (i + 1) % 200 == 0:
                log(f"created {i + 1} tenant databases ({time.monotonic() - started:.0f} s)")
    return tenants


def drop_tenants(server_url: str, prefix: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as admin:
        names = [r[0] for r in admin.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", [f"{prefix}\\_%"])]

    def drop(name: str) -> None:  # drops that wait together share their checkpoint
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(drop, names))


# -- what the server counts -----------------------------------------------------------------------


def db_stats(server_url: str, prefix: str) -> dict[str, tuple[int, float]]:
    """(sessions, session_time ms) of each tenant database (PREFIX_NNNN: not the template
    nor the control database)."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        rows = conn.execute("SELECT datname, sessions, session_time FROM pg_stat_database "
                            "WHERE datname LIKE %s", [f"{prefix}\\_____"]).fetchall()
    return {str(name): (int(n), float(ms)) for name, n, ms in rows}


def settled_stats(server_url: str, prefix: str) -> dict[str, tuple[int, float]]:
    """The stats once the sessions that just closed have reported (two equal reads)."""
    last = db_stats(server_url, prefix)
    for _ in range(50):
        time.sleep(0.1)
        now = db_stats(server_url, prefix)
        if now == last:
            return now
        last = now
    return last


def fill(tenants: list[tuple[str, str]], jobs: int) -> None:
    from psycopg.types.json import Jsonb

    for _, url in tenants:
        with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
            cur.executemany("INSERT INTO drainer.jobs (queue, payload) VALUES (%s, %s)",
                            [("fleet_bench", Jsonb({"n": n})) for n in range(jobs)])


def done(tenants: list[tuple[str, str]]) -> int:
    total = 0
    for _, url in tenants:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM drainer.jobs WHERE status = 'done'"
                               ).fetchone()
            conn.execute("DELETE FROM drainer.jobs")
            total += int(row[0]) if row else 0
    return total


# -- the contenders -------------------------------------------------------------------------------


def naive_loop(tenants_file: str, concurrency: int) -> int:
    """The naive contender's process: drain every tenant of the file, ``concurrency`` at a
    time, with run_once and the tenant's URL; prints one JSON line."""
    from pydantic import SecretStr

    from drainer.drain import run_once
    from drainer.fleet.tenants import read_tenants_file
    from drainer.settings import load_settings

    settings = load_settings()
    tenants = read_tenants_file(tenants_file)

    def one(url: str) -> tuple[int, float]:
        report = run_once(settings.model_copy(update={"database_url": SecretStr(url)}))
        return report.claimed, report.duration_s

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, [t.url for t in tenants]))
    print(json.dumps({"tenants": len(results), "claimed": sum(c for c, _ in results),
                      "max_duration_s": max((d for _, d in results), default=0.0)}))
    return 0


def run_contender(name: str, env: dict[str, str], tenants_file: Path,
                  concurrency: int) -> tuple[float, dict[str, Any]]:
    if name == "fleet":
        cmd = [sys.executable, "-m", "drainer", "fleet", "run-once"]
    else:
        cmd = [sys.executable, "-m", "bench.fleet", "--naive-loop", str(tenants_file),
               "--fleet-concurrency", str(concurrency)]
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"bench.fleet: {name} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return wall, json.loads(proc.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace, server_url: str) -> dict[str, Any]:
    # on a shared server, names of the run's own (runs of the test suite may overlap)
    prefix = f"{PREFIX}_{os.urandom(3).hex()}" if args.server else PREFIX
    tenants = make_tenants(server_url, args.tenants, prefix)
    every = max(1, round(1 / args.with_work))
    work = [t for i, t in enumerate(tenants) if i % every == 0]
    work_dbs = {f"{prefix}_{int(name[1:]):04d}" for name, _ in work}
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(f"{prefix}_ctl")))
    control = with_database(server_url, f"{prefix}_ctl")
    folder = Path(tempfile.mkdtemp(prefix="drainer-fleet-bench-files-"))
    tenants_file = folder / "tenants.txt"
    tenants_file.write_text("".join(f"{name} {url}\n" for name, url in tenants))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAINER_")}
    env.update({"PYTHONPATH": str(ROOT), "DRAINER_APP": "bench.fleet_app",
                "DRAINER_FLEET_URL": control, "DRAINER_FLEET_TENANTS": str(tenants_file),
                "DRAINER_FLEET_CONCURRENCY": str(args.fleet_concurrency),
                "DRAINER_CONNECT_RETRIES": "0", "DRAINER_LOG_LEVEL": "WARNING",
                "BENCH_FLEET_JOB_MS": str(args.job_ms)})
    subprocess.run([sys.executable, "-m", "drainer", "fleet", "migrate"], env=env, cwd=ROOT,
                   check=True, capture_output=True)
    log(f"warm-up: one fleet run over the {len(tenants)} tenants never seen")
    warm, _ = run_contender("fleet", env, tenants_file, args.fleet_concurrency)
    log(f"warm-up took {warm:.1f} s")
    from drainer.fleet import due

    runs: list[dict[str, Any]] = []
    for rep in range(args.repeat):
        order = ["fleet", "naive"] if rep % 2 == 0 else ["naive", "fleet"]
        for name in order:
            fill(work, args.jobs)
            if name == "fleet":
                with psycopg.connect(control, autocommit=True) as conn:
                    due(conn, [n for n, _ in work])
            before = settled_stats(server_url, prefix)
            wall, out = run_contender(name, env, tenants_file, args.fleet_concurrency)
            after = settled_stats(server_url, prefix)
            opened = {db: after[db][0] - before[db][0] for db in after}
            held_ms = {db: after[db][1] - before[db][1] for db in after}
            row: dict[str, Any] = {
                "contender": name, "repetition": rep, "wall_s": wall,
                "tenants_connected": sum(n > 0 for n in opened.values()),
                "sessions": sum(opened.values()),
                "sessions_on_idle_tenants": sum(n for db, n in opened.items()
                                                if db not in work_dbs),
                "session_s": sum(held_ms.values()) / 1000,
                "jobs_done": done(work)}
            if name == "fleet":
                durations = [line["duration_s"] for line in out["tenants"]]
                row["tenants_drained"] = len(durations)
                row["slowest_tenant_s"] = max(durations, default=0.0)
                row["sum_over_concurrency_s"] = sum(durations) / args.fleet_concurrency
                row["process_duration_s"] = out["duration_s"]
            runs.append(row)
            log(f"{name} #{rep}: {wall:.2f} s, {row['tenants_connected']} tenants connected, "
                f"{row['sessions']} sessions ({row['sessions_on_idle_tenants']} on idle "
                f"tenants), {row['jobs_done']} jobs")
    shutil.rmtree(folder, ignore_errors=True)
    if args.server:
        drop_tenants(server_url, prefix)
    return {"tenants": len(tenants), "with_work": len(work), "jobs_per_tenant": args.jobs,
            "job_ms": args.job_ms, "fleet_concurrency": args.fleet_concurrency,
            "idle_timeout_s": args.idle_timeout, "warmup_s": warm, "runs": runs}


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(r[key]) for r in rows)


def render(result: dict[str, Any]) -> str:
    idle = result["idle_timeout_s"]
    lines = [f"{result['tenants']} tenant databases, {result['with_work']} with "
             f"{result['jobs_per_tenant']} jobs of {result['job_ms']} ms each; "
             f"--fleet-concurrency {result['fleet_concurrency']}; medians of "
             f"{len(result['runs']) // 2} interleaved repetitions (min-max)", "",
             "| contender | wall s | tenants connected | sessions opened | on idle tenants "
             f"| session-seconds | jobs done | awake estimate (+{idle:g} s idle a tenant) |",
             "|---|---|---|---|---|---|---|---|"]
    for name in ("fleet", "naive"):
        rows = [r for r in result["runs"] if r["contender"] == name]
        walls = [r["wall_s"] for r in rows]
        connected = _median(rows, "tenants_connected")
        held = _median(rows, "session_s")
        lines.append(
            f"| {name} | {statistics.median(walls):.2f} ({min(walls):.2f}-{max(walls):.2f}) "
            f"| {connected:.0f} | {_median(rows, 'sessions'):.0f} "
            f"| {_median(rows, 'sessions_on_idle_tenants'):.0f} | {held:.1f} "
            f"| {_median(rows, 'jobs_done'):.0f} | {(connected * idle + held) / 3600:.2f} h |")
    fleet = [r for r in result["runs"] if r["contender"] == "fleet"]
    lines += ["", f"fleet: slowest tenant's drain {_median(fleet, 'slowest_tenant_s'):.2f} s, "
              f"sum of the tenants' drains / concurrency "
              f"{_median(fleet, 'sum_over_concurrency_s'):.2f} s, the run itself "
              f"{_median(fleet, 'process_duration_s'):.2f} s (process wall "
              f"{_median(fleet, 'wall_s'):.2f} s, start-up included)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tenants", type=int, default=1000)
    p.add_argument("--with-work", type=float, default=0.02,
                   help="share of the tenants that get jobs [default: 0.02]")
    p.add_argument("--jobs", type=int, default=40, help="jobs a tenant with work gets")
    p.add_argument("--job-ms", type=float, default=10.0, help="what each job waits (ms)")
    p.add_argument("--fleet-concurrency", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--idle-timeout", type=float, default=300.0,
                   help="the platform's idle timeout, for the awake estimate [default: 300]")
    p.add_argument("--server", metavar="URL", help="an existing server instead of a "
                   "throwaway cluster (the tenant databases are dropped at the end)")
    p.add_argument("--json", metavar="FILE", help="also write the measurements as JSON")
    p.add_argument("--naive-loop", metavar="TENANTS_FILE", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.naive_loop:
        return naive_loop(args.naive_loop, args.fleet_concurrency)
    load = os.getloadavg()
    if args.server:
        result = measure(args, args.server)
    else:
        with throwaway_cluster(max_connections=max(100, 4 * args.fleet_concurrency + 20)
                               ) as url:
            result = measure(args, url)
    result["load_average_before"] = load
    result["load_average_after"] = os.getloadavg()
    text = render(result)
    print(text)
    print(f"\nload average before {load[0]:.2f}, after {result['load_average_after'][0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
