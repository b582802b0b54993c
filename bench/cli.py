"""``python -m bench``: every benchmark in one invocation on one PostgreSQL, as markdown tables.

    python3 dev.py bench                 # full size: 20,000 jobs, 3 repetitions, the peers
    python3 dev.py bench --quick         # smaller sizes, same tables (a few minutes)
    python3 dev.py bench --smoke --no-peers   # tiny, what CI runs (seconds)
    python3 dev.py bench --only link-drain,link-empty,io --rtt 0,10   # across a link; I/O

The link-drain and link-empty sections run each contender through a delay proxy on loopback
(bench/proxy.py) at every ``--rtt``, beside the local (direct) rows, and report compute-seconds:
how long the server sessions were held. The io section drains jobs that wait 50 ms, async and
sync, against Little's law.

Each contender drains its own schema (drainer, the plain loop, pgbench) or its own database
(procrastinate, pgqueuer, chancy, dbos) in the database ``drainer_bench`` and its siblings,
created when missing. Contenders are interleaved (one repetition of each in turn, the order
rotating), and each figure is the median of the repetitions with the min and max beside it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.capacity import section_capacity
from bench.contenders import (
    CHANCY,
    DBOS,
    Chancy,
    Contender,
    Dbos,
    Drainer,
    Pgbench,
    Pgqueuer,
    PlainLoop,
    Procrastinate,
    ensure_peers,
    peer_versions,
)
from bench.core import (
    ROOT,
    SETTLED,
    VENV_BIN,
    Series,
    count_status,
    ensure_database,
    fill,
    fmt_rate,
    fresh_schema,
    jobs_per_completion,
    jobs_table,
    log,
    run_timed,
    settle,
    write_bytecode,
)
from bench.io_bound import DEFAULT_PLAN, parse_plan, section_io
from bench.link import section_link_drain, section_link_empty
from drainer.migrate import migrate

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
HAVE_PGBENCH = shutil.which("pgbench") is not None
SECTIONS = ["capacity", "drain", "multi", "cold", "enqueue", "history", "batch", "long",
            "link-drain", "link-empty", "io"]


# -- the race -------------------------------------------------------------------------------------


def race(contenders: list[Contender], n: int, repeat: int,
         peers: list[Contender] | None = None) -> dict[str, Series]:
    """Drain ``n`` jobs with each contender, ``repeat`` rounds, interleaved; jobs/s series.
    Each round runs ``contenders`` in an order rotating by one each round, then ``peers``
    (the slow ones, minutes a run) likewise: a contender and the ceiling it is compared with
    run seconds apart in every round, not on either side of the peers' minutes (over which
    the load of the machine moves). Before each run the server is settled
    (bench.core.settle), then the contender's queue filled."""
    peers = peers or []
    for c in contenders + peers:
        c.setup()
    out = {c.name: Series(c.name) for c in contenders + peers}
    databases = [c.url for c in contenders + peers]

    def rotated(group: list[Contender], rnd: int) -> list[Contender]:
        k = rnd % len(group) if group else 0
        return group[k:] + group[:k]

    for rnd in range(repeat):
        for c in rotated(contenders, rnd) + rotated(peers, rnd):
            settle(c.url, databases)
            c.reset(n)
            timed = c.run(n)
            problem = c.check(n, timed)
            s = out[c.name]
            if problem:
                s.notes.append(problem)
                log(f"{c.name}: INVALID run: {problem}")
                continue
            s.values.append(n / timed.wall)
            session = c.session_seconds(timed)
            if session:
                s.session.append(n / session)
            if isinstance(c, (Drainer, PlainLoop)):
                per = jobs_per_completion(c.url, c.schema)
                if per:
                    s.per_statement.append(per)
            log(f"round {rnd + 1}/{repeat} {c.name}: {n / timed.wall:,.0f} jobs/s "
                f"({timed.wall:.3f} s, peak RSS {timed.peak_rss_mb:.0f} MB)")
    return out


def rate_table(series: dict[str, Series], ref: str, ref_label: str = "drainer") -> list[str]:
    base = series[ref].median
    lines = [f"| contender | jobs/s (median) | min | max | runs | x {ref_label} |",
             "|---|---:|---:|---:|---:|---:|"]
    for s in series.values():
        ratio = s.median / base if base == base and base else float("nan")
        note = f" ({'; '.join(sorted(set(s.notes)))})" if s.notes else ""
        lines.append(f"| {s.name}{note} | {fmt_rate(s.median)} | {fmt_rate(s.lo)} | "
                     f"{fmt_rate(s.hi)} | {len(s.values)} | {ratio:.2f} |")
    return lines


def section_drain(ctx: Ctx) -> list[str]:
    db = ctx.db
    contenders: list[Contender] = [
        Pgbench(f"pgbench ceiling, {c} client{'s' if c > 1 else ''} (batch 10)", db,
                f"b_pgbench{c}", clients=c) for c in (1, 2, 4)
    ] if HAVE_PGBENCH else []
    contenders += [
        Drainer("drainer run-once (defaults)", db, "b_drainer"),
        Drainer(f"drainer run-once ({' '.join(ctx.best)})", db, "b_drainer_best",
                flags=ctx.best),
        PlainLoop("plain psycopg loop (claim 10, complete in 1 statement)", db, "b_plain"),
    ]
    peers: list[Contender] = []
    if ctx.peers:
        proc_db = ctx.peer_db("procrastinate")
        pgq_db = ctx.peer_db("pgqueuer")
        peers = [
            Procrastinate("procrastinate worker --one-shot (c=1)", proc_db, "public",
                          concurrency=1),
            Procrastinate("procrastinate worker --one-shot (c=10)", proc_db, "public",
                          concurrency=10),
            Pgqueuer("pgqueuer drain mode (asyncpg, batch 10)", pgq_db, "public"),
            Chancy(CHANCY, ctx.peer_db("chancy"), "public"),
            Dbos(DBOS, ctx.peer_db("dbos"), "public"),
        ]
    series = race(contenders, ctx.n, ctx.repeat, peers)
    ctx.results["drain"] = {k: v.values for k, v in series.items()}
    ctx.results["drain_jobs_per_completion"] = {k: v.per_statement for k, v in series.items()
                                                if v.per_statement}
    lines = [f"### Drain until empty: {ctx.n:,} no-op jobs, wall time from process start to "
             "exit", ""]
    lines += rate_table(series, "drainer run-once (defaults)")
    d = series["drainer run-once (defaults)"].median
    lines.append("")
    if ctx.capacity:
        lines.append(f"drainer (defaults) / the server's capacity ({ctx.capacity:,.0f} jobs/s, "
                     f"section capacity, same run): **{d / ctx.capacity:.2f}x**")
    if HAVE_PGBENCH:
        ceiling = series[contenders[0].name].median
        paired = paired_ratio(series["drainer run-once (defaults)"], series[contenders[0].name])
        lines.append(f"drainer (defaults) / drainer's own SQL under 1 sequential pgbench client "
                     f"(claims of 10; not the server's capacity): {d / ceiling:.2f}x "
                     f"(same-round ratio, median: {paired:.2f}x)")
    else:
        lines.append("pgbench not found: no ceiling (install postgresql-client)")
    for name, s in series.items():
        if s.per_statement:
            lines.append(f"{name}: {statistics.median(s.per_statement):,.1f} jobs per "
                         "completion statement (median over runs; its claim size)")
    for name, s in series.items():
        if name.startswith(("procrastinate", "pgqueuer", "chancy", "dbos")):
            lines.append(f"drainer (defaults) / {name}: **{d / s.median:.1f}x**")
    return lines


def section_multi(ctx: Ctx) -> list[str]:
    """Five queues with handlers, jobs spread over them, vs one queue."""
    from bench.multi_app import QUEUES

    db = ctx.db
    contenders: list[Contender] = [
        Drainer("drainer, 1 queue", db, "b_multi1"),
        Drainer("drainer, 5 queues with handlers", db, "b_multi", queues=QUEUES,
                app="bench.multi_app"),
    ]
    series = race(contenders, ctx.n, ctx.repeat)
    ctx.results["multi"] = {k: v.values for k, v in series.items()}
    return [f"### Several queues: {ctx.n:,} jobs spread over 5 queues vs one queue", "",
            *rate_table(series, "drainer, 1 queue", "1 queue")]


# -- empty queue: cold start ----------------------------------------------------------------------


def _db_counters(server: str, dbname: str) -> tuple[int, int]:
    """(transactions, sessions opened) of one database, as the statistics see them now."""
    time.sleep(0.3)  # backends that just ended flush their counters as they exit
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT xact_commit + xact_rollback, sessions FROM pg_stat_database "
                           "WHERE datname = %s", [dbname]).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _sessions_left(server: str, dbname: str) -> int:
    with psycopg.connect(server, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                           "AND backend_type = 'client backend'", [dbname]).fetchone()
    assert row is not None
    return int(row[0])


def _process_start(stdout: str) -> float | None:
    """The run report's process_start_s (its last line), or None: not a drainer run."""
    try:
        value = json.loads(stdout.strip().splitlines()[-1])["process_start_s"]
    except (ValueError, IndexError, KeyError, TypeError):
        return None
    return float(value) if isinstance(value, int | float) else None


def section_cold(ctx: Ctx) -> list[str]:
    db_name = f"{ctx.database}_cold"  # as the peers' databases: two --database never share
    db = ensure_database(ctx.server, db_name)
    fresh_schema(db, "b_cold")
    fill(db, "b_cold", 0)
    py = str(VENV_BIN / "python")
    runs: list[tuple[str, list[str], dict[str, str], str]] = [
        ("python -c 'import psycopg; psycopg.connect(...)'",
         [py, "-c", f"import psycopg; psycopg.connect({db!r}).close()"], {}, db_name),
        ("drainer run-once", [str(VENV_BIN / "drainer"), "run-once"],
         Drainer("", db, "b_cold").env(), db_name),
        ("plain psycopg loop", [py, "-m", "bench.plain_loop", db, "b_cold"],
         {"PYTHONPATH": str(ROOT)}, db_name),
    ]
    if ctx.peers:
        proc_db = ctx.peer_db("procrastinate")
        pgq_db = ctx.peer_db("pgqueuer")
        p = Procrastinate("", proc_db, "public")
        p.setup()
        p.reset(0)
        q = Pgqueuer("", pgq_db, "public")
        q.setup()
        q.reset(0)
        from bench.contenders import PEERS_BIN

        runs += [
            ("procrastinate worker --one-shot", [str(PEERS_BIN / "procrastinate"),
             "--app=bench.peer_procrastinate.app", "worker", "--one-shot", "-q", "bench"],
             p.env(), f"{ctx.database}_procrastinate"),
            ("pgqueuer drain mode", [str(PEERS_BIN / "python"), "-m", "bench.peer_pgqueuer",
                                     pgq_db], {"PYTHONPATH": str(ROOT)},
             f"{ctx.database}_pgqueuer"),
        ]
    walls: dict[str, list[float]] = {name: [] for name, *_ in runs}
    xacts: dict[str, list[int]] = {name: [] for name, *_ in runs}
    conns: dict[str, list[int]] = {name: [] for name, *_ in runs}
    left: dict[str, list[int]] = {name: [] for name, *_ in runs}
    to_connect: dict[str, list[float]] = {name: [] for name, *_ in runs}
    reps = ctx.cold_repeat
    for rnd in range(reps):
        k = rnd % len(runs)
        for name, cmd, env, dbname in runs[k:] + runs[:k]:
            settle(ctx.server, [r[3] for r in runs])
            x0, s0 = _db_counters(ctx.server, dbname)
            timed = run_timed(cmd, env)
            if timed.returncode != 0:
                log(f"cold start {name}: exit {timed.returncode}: {timed.stderr[-300:]}")
                continue
            x1, s1 = _db_counters(ctx.server, dbname)
            walls[name].append(timed.wall)
            xacts[name].append(x1 - x0)
            conns[name].append(s1 - s0)
            left[name].append(_sessions_left(ctx.server, dbname))
            start = _process_start(timed.stdout)
            if start is not None:
                to_connect[name].append(start)
    base = statistics.median(walls[runs[0][0]])
    lines = ["### Empty queue: cold start (process start to exit)", "",
             "| command | wall s (median) | min | max | x connect-only | process start to "
             "connect s (median) | transactions | connections opened | sessions left |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, *_ in runs:
        w = walls[name]
        if not w:
            lines.append(f"| {name} | failed | | | | | | | |")
            continue
        c = to_connect[name]
        shown = f"{statistics.median(c):.3f}" if c else "n/a"
        lines.append(
            f"| {name} | {statistics.median(w):.3f} | {min(w):.3f} | {max(w):.3f} | "
            f"{statistics.median(w) / base:.2f} | {shown} | "
            f"{statistics.median(xacts[name]):.0f} | "
            f"{statistics.median(conns[name]):.0f} | {max(left[name])} |")
    lines += ["", "transactions: delta of xact_commit + xact_rollback in pg_stat_database "
              "(each autocommit statement is one); connections: delta of "
              "pg_stat_database.sessions; sessions left: client backends on the database "
              "0.3 s after exit; process start to connect: the run report's "
              "process_start_s (the interpreter, the imports, the settings and the app, "
              "from the process start the OS gives to the connect; n/a: the command does not "
              "report it)."]
    ctx.results["cold"] = {"wall": walls, "xacts": xacts, "connections": conns,
                           "left": left, "process_start": to_connect}
    return lines


# -- enqueue --------------------------------------------------------------------------------------


def section_enqueue(ctx: Ctx) -> list[str]:
    from drainer.producer import JobSpec, enqueue_many

    n = ctx.enqueue_n
    db = ctx.db
    fresh_schema(db, "b_enqueue")
    table = jobs_table("b_enqueue")
    payloads = [{"n": i} for i in range(n)]
    walls: dict[str, list[float]] = {"enqueue_many": [], "enqueue_many (generator)": [],
                                     "enqueue_many (payloads, queue=)": [],
                                     "one raw COPY": []}

    def many(conn: psycopg.Connection[Any]) -> None:
        enqueue_many(conn, [JobSpec("bench", p) for p in payloads], schema="b_enqueue")

    def many_gen(conn: psycopg.Connection[Any]) -> None:
        enqueue_many(conn, (JobSpec("bench", p) for p in payloads), schema="b_enqueue")

    def many_payloads(conn: psycopg.Connection[Any]) -> None:
        enqueue_many(conn, payloads, queue="bench", schema="b_enqueue")

    def raw(conn: psycopg.Connection[Any]) -> None:
        with conn.transaction(), conn.cursor().copy(
                sql.SQL("COPY {} (queue, payload) FROM STDIN").format(table)) as copy:
            for p in payloads:
                copy.write_row(("bench", json.dumps(p)))

    runs: list[tuple[str, Callable[[psycopg.Connection[Any]], None]]] = [
        ("enqueue_many", many), ("enqueue_many (generator)", many_gen),
        ("enqueue_many (payloads, queue=)", many_payloads), ("one raw COPY", raw)]
    for rnd in range(ctx.enqueue_repeat):
        k = rnd % len(runs)
        for name, fn in runs[k:] + runs[:k]:
            with psycopg.connect(db, autocommit=True) as conn:
                conn.execute(sql.SQL("TRUNCATE {}").format(table))
                settle(db, [db])
                gc.collect()  # each starts on the harness's heap as collected, not as left
                started = time.perf_counter()
                fn(conn)
                walls[name].append(time.perf_counter() - started)
            got = count_status(db, "b_enqueue", "queued")
            if got != n:
                log(f"enqueue {name}: {got} rows, expected {n}")
    series = {k: Series(k, [n / w for w in v]) for k, v in walls.items()}
    ctx.results["enqueue"] = {k: v.values for k, v in series.items()}
    raw_copy = series["one raw COPY"]
    paired = "; ".join(f"{k} {paired_ratio(v, raw_copy):.2f}x" for k, v in series.items()
                       if v is not raw_copy)
    return [f"### Enqueue {n:,} jobs in one transaction (from Python objects to commit)", "",
            *rate_table(series, "one raw COPY", "raw COPY"), "",
            f"same-round ratio to one raw COPY (median over {ctx.enqueue_repeat} rounds): "
            f"{paired}.", "",
            "enqueue_many: a list of JobSpec, built before the call; (generator): the same "
            "JobSpecs from a generator expression, read while the COPY runs (autocommit "
            "connection); (payloads, queue=): the payloads themselves on one queue, no "
            "JobSpec built; one raw COPY: write_row of (queue, json.dumps(payload))."]


# -- history, batch sizes, long drains ------------------------------------------------------------


def section_history(ctx: Ctx) -> list[str]:
    db = ctx.db
    h = ctx.history_n
    with psycopg.connect(db, autocommit=True) as conn:
        have = conn.execute("SELECT to_regclass('b_history.jobs') IS NOT NULL").fetchone()
        count = 0
        if have and have[0]:
            row = conn.execute("SELECT count(*) FROM b_history.jobs WHERE queue = 'history'"
                               ).fetchone()
            count = int(row[0]) if row else 0
    if count != h:
        log(f"history: writing {h:,} done rows (once; kept between invocations)")
        fresh_schema(db, "b_history")
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO b_history.jobs (queue, payload, status, attempts, finished_at, "
                "run_at, created_at) SELECT 'history', jsonb_build_object('n', g), 'done', 1, "
                "now() - interval '1 day', now() - interval '1 day', now() - interval '1 day' "
                "FROM generate_series(1, %s) g", [h])
            conn.execute("VACUUM (ANALYZE) b_history.jobs")
    else:
        # kept from an earlier invocation, maybe by an older drainer: bring it up to date
        with psycopg.connect(db, autocommit=True) as conn:
            migrate(conn, "b_history", "jobs")

    class WithHistory(Drainer):
        def setup(self) -> None:
            pass

        def reset(self, n: int) -> None:
            fill(self.url, self.schema, n, keep_queue="history")

        def check(self, n: int, timed: Any) -> str | None:
            if timed.returncode != 0:
                return f"exit {timed.returncode}: {timed.stderr.strip()[-300:]}"
            done = count_status(self.url, self.schema, "done", queue_not="history")
            return _report_ok(timed, n) or (None if done == n else f"{done} of {n} done")

    contenders: list[Contender] = [
        Drainer("drainer, no history", db, "b_nohistory"),
        WithHistory(f"drainer, {h:,} done rows of history", db, "b_history"),
    ]
    series = race(contenders, ctx.n, ctx.repeat)
    ctx.results["history"] = {k: v.values for k, v in series.items()}
    return [f"### History: drain {ctx.n:,} jobs next to {h:,} done rows vs none", "",
            *rate_table(series, "drainer, no history", "no history")]


def _report_ok(timed: Any, n: int) -> str | None:
    try:
        report = json.loads(timed.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return "no run report"
    return None if report.get("succeeded") == n else f"{report.get('succeeded')} of {n}"


def section_batch(ctx: Ctx) -> list[str]:
    db = ctx.db
    sizes = [1, 10, 50, 200, 500, 1000]
    contenders: list[Contender] = []
    if not HAVE_PGBENCH:
        return ["### Batch size curve: skipped, pgbench not found"]
    for b in sizes:
        contenders.append(Pgbench(f"pgbench 1 client, batch {b}", db, "b_batch_pgbench",
                                  batch=b))
        contenders.append(Drainer(f"drainer, batch {b}", db, "b_batch_drainer",
                                  flags=["--batch-size", str(b)]))
    # the default drain beside the curve, in the same rounds: what the claim sizing finds
    # without a --batch-size, against the best size the curve finds by hand
    contenders.append(Drainer("drainer, defaults", db, "b_batch_drainer"))
    n = ctx.batch_n
    series = race(contenders, n, ctx.repeat)
    ctx.results["batch"] = {k: v.values for k, v in series.items()}
    ctx.results["batch_session"] = {k: v.session for k, v in series.items()}
    ctx.results["batch_per_statement"] = {k: v.per_statement for k, v in series.items()}
    lines = [f"### Batch size curve: {n:,} jobs", "",
             "| batch size | drainer jobs/s (median, min-max) | jobs per completion statement | "
             "pgbench 1 client jobs/s | drainer / ceiling | same-round ratio (median) | "
             "over the session: drainer / pgbench jobs/s (same-round ratio) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for b in sizes:
        d = series[f"drainer, batch {b}"]
        p = series[f"pgbench 1 client, batch {b}"]
        lines.append(f"| {b} | {fmt_rate(d.median)} ({fmt_rate(d.lo)}-{fmt_rate(d.hi)}) | "
                     f"{_per_statement(d)} | {fmt_rate(p.median)} | {d.median / p.median:.2f} | "
                     f"{paired_ratio(d, p):.2f} | {_session_cell(d, p)} |")
    default = series["drainer, defaults"]
    lines.append(f"| default (no --batch-size) | {fmt_rate(default.median)} "
                 f"({fmt_rate(default.lo)}-{fmt_rate(default.hi)}) | {_per_statement(default)} "
                 "| | | | |")
    best = max(sizes, key=lambda b: series[f"drainer, batch {b}"].median)
    best_s = series[f"drainer, batch {best}"]
    lines += ["", f"default / the best --batch-size of the curve ({best}, "
              f"{fmt_rate(best_s.median)} jobs/s): **{default.median / best_s.median:.2f}x** "
              f"(same-round ratio, median: {paired_ratio(default, best_s):.2f}x); "
              "--batch-size is the least claim, the claims then grow with the measured work "
              "(jobs per completion statement: the claim size the drain settled on)."]
    lines += ["", "same-round ratio: the median over rounds of drainer / pgbench run one after "
              "the other in the same round (robust to the machine's load shifting between "
              "rounds); drainer's wall includes its process start (Python, imports, "
              "settings, the app) and the end-of-run VACUUM, pgbench has neither.",
              "", "over the session (an extra view; the columns before it are the wall "
              "figures): jobs over the seconds each run held its connection, process "
              "start-up left out; drainer: the run report's connected_s (the drain, then "
              "the archiver and the VACUUM it runs); pgbench: its initial connection time "
              "plus its transactions at the tps it reports without it."]
    return lines


def _per_statement(s: Series) -> str:
    return f"{statistics.median(s.per_statement):.1f}" if s.per_statement else "n/a"


def _session_cell(d: Series, p: Series) -> str:
    if not d.session or not p.session:
        return "n/a"
    paired = Series(d.name, d.session) if len(d.session) == len(d.values) else None
    ratio = paired_ratio(paired, Series(p.name, p.session)) \
        if paired is not None and len(p.session) == len(p.values) else float("nan")
    return (f"{fmt_rate(statistics.median(d.session))} / "
            f"{fmt_rate(statistics.median(p.session))} ({ratio:.2f})")


def _drainer_bytecode() -> str:
    """Whether the drainer runs timed here read their modules' bytecode from a cache, or
    compiled every module at each process start (with PYTHONDONTWRITEBYTECODE set and no
    __pycache__, as in an editable install that never wrote one: a share of each start
    that an installed package, compiled by pip, does not pay)."""
    cached = any((ROOT / "drainer").rglob("__pycache__/*.pyc"))
    if cached or not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return "cached"
    return "compiled at every process start (PYTHONDONTWRITEBYTECODE set, no __pycache__)"


def paired_ratio(a: Series, b: Series) -> float:
    """The median of a/b over rounds (both measured in the same rounds; nan if a run of
    either failed, which leaves the rounds unpaired)."""
    if len(a.values) != len(b.values) or not a.values:
        return float("nan")
    return statistics.median(x / y for x, y in zip(a.values, b.values, strict=True))


def section_long(ctx: Ctx) -> list[str]:
    """Peak RSS and rate of a long drain vs a short one; first 10% vs last 10% of the long one."""
    db = ctx.db
    c = Drainer("drainer", db, "b_long")
    c.setup()
    rows = []
    for n in (ctx.n, ctx.long_n):
        rss, rates, head, tail = [], [], [], []
        for _ in range(ctx.long_repeat):
            settle(db, [db])
            c.reset(n)
            timed = c.run(n)
            problem = c.check(n, timed)
            if problem:
                log(f"long drain {n}: INVALID: {problem}")
                continue
            rss.append(timed.peak_rss_mb)
            rates.append(n / timed.wall)
            first, last = _head_tail_rates(db, "b_long", n)
            head.append(first)
            tail.append(last)
            log(f"drain of {n:,}: {n / timed.wall:,.0f} jobs/s, peak RSS "
                f"{timed.peak_rss_mb:.1f} MB, first 10% {first:,.0f} jobs/s, last 10% "
                f"{last:,.0f} jobs/s")
        rows.append((n, rss, rates, head, tail))
    ctx.results["long"] = [{"n": n, "rss_mb": r, "rate": a, "first10": h, "last10": t}
                           for n, r, a, h, t in rows]
    lines = ["### Long drains: peak RSS, and the rate of the first vs the last 10% of the jobs",
             "", "| jobs | peak RSS MB (median) | jobs/s | first 10% jobs/s | last 10% jobs/s | "
             "last / first |", "|---:|---:|---:|---:|---:|---:|"]
    for n, rss, rates, head, tail in rows:
        if not rss:
            lines.append(f"| {n:,} | failed | | | | |")
            continue
        lines.append(f"| {n:,} | {statistics.median(rss):.1f} | "
                     f"{fmt_rate(statistics.median(rates))} | "
                     f"{fmt_rate(statistics.median(head))} | {fmt_rate(statistics.median(tail))} "
                     f"| {statistics.median(tail) / statistics.median(head):.2f} |")
    if len(rows) == 2 and rows[0][1] and rows[1][1]:
        lines += ["", f"peak RSS {rows[1][0]:,} / {rows[0][0]:,} jobs: "
                  f"**{statistics.median(rows[1][1]) / statistics.median(rows[0][1]):.2f}x**"]
    lines += ["", "first/last 10%: from the jobs' finished_at (one completion statement, one "
              "timestamp), so the drain is not slowed by sampling."]
    return lines


def _head_tail_rates(db: str, schema: str, n: int) -> tuple[float, float]:
    with psycopg.connect(db, autocommit=True) as conn:
        stamps = [r[0] for r in conn.execute(
            sql.SQL("SELECT extract(epoch FROM finished_at)::float8 FROM {} WHERE status = "
                    "'done' ORDER BY finished_at").format(jobs_table(schema)))]
    k = max(1, len(stamps) // 10)
    # the time a slice took: from the completion before its first job to its last job
    first = k / max(stamps[k] - stamps[0], 1e-6)
    last = k / max(stamps[-1] - stamps[-k - 1], 1e-6)
    return first, last


# -- main -----------------------------------------------------------------------------------------


class Ctx:
    def __init__(self, args: argparse.Namespace) -> None:
        self.server: str = args.server
        self.n: int = args.jobs
        self.repeat: int = args.repeat
        self.peers: bool = args.peers
        self.best: list[str] = args.best.split()
        self.enqueue_n: int = args.enqueue_jobs
        self.history_n: int = args.history
        self.batch_n: int = args.batch_jobs
        self.long_n: int = args.long_jobs
        self.long_repeat: int = args.long_repeat
        self.cold_repeat: int = 1 if args.smoke else max(args.repeat, 5)
        #: enqueue runs take a second or less each, so more rounds than the drains
        self.enqueue_repeat: int = 1 if args.smoke else max(args.repeat, 7)
        self.rtts: list[float] = args.rtt
        self.io_n: int = args.io_jobs
        self.io_sleep: float = args.io_sleep
        self.io_plan: list[tuple[str, int]] = args.io_plan
        self.io_repeat: int = args.io_repeat or args.repeat
        self.database: str = args.database
        self.smoke: bool = args.smoke
        self.have_pgbench = HAVE_PGBENCH
        #: jobs a capacity run (rounded up to a multiple of every clients x LIMIT)
        self.capacity_n: int = 2 * args.jobs
        #: the server's capacity, jobs/s: the best of article's SQL (section capacity)
        self.capacity: float | None = None
        self.db = ensure_database(self.server, args.database)
        self.results: dict[str, Any] = {}

    def peer_db(self, peer: str) -> str:
        """The URL of ``peer``'s own database, named after --database (default
        drainer_bench_<peer>), so that two runs with different --database never share one."""
        return ensure_database(self.server, f"{self.database}_{peer}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default=os.environ.get("BENCH_SERVER_URL", DEFAULT_SERVER),
                   help="A URL of the PostgreSQL server (any database on it; "
                   "env BENCH_SERVER_URL) [default: %(default)s].")
    p.add_argument("--database", default="drainer_bench",
                   help="Database the drainer contenders use, created when missing "
                   "[default: %(default)s].")
    p.add_argument("--jobs", type=int, default=20_000, help="Jobs per drain [20,000].")
    p.add_argument("--repeat", type=int, default=3, help="Repetitions of each contender [3].")
    p.add_argument("--enqueue-jobs", type=int, default=100_000, help="Jobs per enqueue run.")
    p.add_argument("--history", type=int, default=1_000_000, help="Done rows of history.")
    p.add_argument("--batch-jobs", type=int, default=None,
                   help="Jobs per run of the batch size curve [--jobs].")
    p.add_argument("--long-jobs", type=int, default=200_000, help="Jobs of the long drain.")
    p.add_argument("--long-repeat", type=int, default=1, help="Repetitions of the long drain.")
    p.add_argument("--best", default="--batch-size 50",
                   help="drainer flags of the 'best settings' contender [%(default)s].")
    p.add_argument("--rtt", type=_rtts, default=[0.0, 2.0, 10.0], metavar="MS[,MS...]",
                   help="Round-trip times of the link-drain and link-empty sections, in ms, "
                   "through the delay proxy [0,10].")
    p.add_argument("--io-jobs", type=int, default=4_000, help="Jobs of the io section [4,000].")
    p.add_argument("--io-repeat", type=int, default=None,
                   help="Repetitions of each io contender [--repeat]; procrastinate takes "
                   "20-80 s per run of 4,000 jobs.")
    p.add_argument("--io-sleep", type=float, default=0.05,
                   help="Seconds each io job waits [0.05].")
    p.add_argument("--io-plan", type=_io_plan, default=parse_plan(DEFAULT_PLAN),
                   metavar="KIND:C[,...]",
                   help=f"Handler kinds and concurrencies of the io section [{DEFAULT_PLAN}].")
    p.add_argument("--no-peers", dest="peers", action="store_false",
                   help="Skip the peers: procrastinate, pgqueuer, chancy, dbos (no venv, no "
                   "install).")
    p.add_argument("--only", default=",".join(SECTIONS),
                   help=f"Comma-separated sections to run, of {', '.join(SECTIONS)}.")
    p.add_argument("--quick", action="store_true",
                   help="Smaller sizes: 5,000 jobs, 20,000 enqueued, 200,000 history, "
                   "50,000 long.")
    p.add_argument("--smoke", action="store_true",
                   help="Tiny sizes for CI (seconds): 200 jobs, 1 repetition, a 1,000-job "
                   "long drain, io 200 jobs at async:50,sync:20, RTT 2 ms.")
    p.add_argument("--output", type=Path, default=None,
                   help="Also write the tables and raw figures here (.md and .json).")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.jobs, args.enqueue_jobs, args.history, args.long_jobs = 5_000, 20_000, 200_000, \
            50_000
    if args.smoke:
        args.jobs, args.repeat, args.enqueue_jobs, args.history, args.long_jobs = \
            200, 1, 500, 2_000, 1_000
        args.io_jobs, args.io_plan = 200, parse_plan("async:50,sync:20")
        if "--rtt" not in " ".join(argv if argv is not None else sys.argv[1:]):
            args.rtt = [2.0]
    args.batch_jobs = args.batch_jobs or args.jobs
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        sys.stderr.write(f"bench: unknown section(s) {', '.join(sorted(unknown))}\n")
        return 2
    if args.output is not None:
        # before the run, not after it: a run of the whole bench takes most of an hour
        args.output.parent.mkdir(parents=True, exist_ok=True)
    if args.peers:
        problem = ensure_peers()
        if problem:
            sys.stderr.write(f"bench: {problem}; run with --no-peers\n")
            return 1
    for folder in (ROOT / "drainer", ROOT / "bench"):  # as an installed drainer has it
        write_bytecode(folder)
    ctx = Ctx(args)
    started = datetime.now(timezone.utc)
    shown_args = argv if argv is not None else sys.argv[1:]
    load_start = list(os.getloadavg())
    pg_version = _server_version(ctx.server)
    peers = peer_versions() if args.peers else None
    out = ["## drainer benchmarks", "",
           f"- command: `python3 dev.py bench {' '.join(shown_args)}`",
           f"- date: {started:%Y-%m-%d %H:%M} UTC; machine: {platform.machine()}, "
           f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
           f"PostgreSQL {pg_version}, psycopg {psycopg.__version__}",
           f"- load average at start: {', '.join(f'{x:.2f}' for x in load_start)}"]
    if peers is not None:
        out.append(f"- peers: {peers}")
    out.append("")
    tables: dict[str, str] = {}
    fns: dict[str, Callable[[Ctx], list[str]]] = {
        "capacity": section_capacity, "drain": section_drain, "multi": section_multi,
        "cold": section_cold,
        "enqueue": section_enqueue, "history": section_history, "batch": section_batch,
        "long": section_long, "link-drain": section_link_drain,
        "link-empty": section_link_empty, "io": section_io,
    }
    for name in sections:
        log(f"section {name}")
        since = len(SETTLED.settles)
        lines = fns[name](ctx)
        settled = SETTLED.note(since)
        if settled:
            lines += ["", settled]
        tables[name] = "\n".join(lines)
        out += lines
        out.append("")
    out.append(f"- load average at end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    text = "\n".join(out)
    print(text)
    if args.output is not None:
        args.output.with_suffix(".md").write_text(text + "\n")
        meta = {"command": f"python3 dev.py bench {' '.join(shown_args)}",
                "date": f"{started:%Y-%m-%d %H:%M} UTC", "rtt_ms": ctx.rtts,
                "cpus": os.cpu_count(), "python": platform.python_version(),
                "load_average_end": list(os.getloadavg()),
                "load_average_start": load_start, "machine": platform.machine(),
                "postgresql": pg_version, "psycopg": psycopg.__version__, "peers": peers,
                "sections": sections, "drainer_bytecode": _drainer_bytecode(),
                "sizes": {"jobs": args.jobs, "repeat": args.repeat,
                          "enqueue_jobs": args.enqueue_jobs, "history": args.history,
                          "batch_jobs": args.batch_jobs, "long_jobs": args.long_jobs,
                          "io_jobs": args.io_jobs, "io_sleep_s": args.io_sleep}}
        # tables: each section's markdown as printed, for bench.plots to put in the docs
        args.output.with_suffix(".json").write_text(
            json.dumps({"meta": meta, **ctx.results, "tables": tables}, indent=1) + "\n")
    return 0


def _rtts(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of milliseconds: {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"not a list of milliseconds: {text!r}")
    return values


def _io_plan(text: str) -> list[tuple[str, int]]:
    try:
        return parse_plan(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _server_version(server: str) -> str:
    with psycopg.connect(server) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"

