"""Server capacity: what the PostgreSQL server itself does with a queue's SQL, no Python.

pgbench runs two scripts on the same server, in one run, interleaved:

- the SQL of *Postgres as a job queue* (docs/sources.md) on its table
  (bench/pgbench/article_schema.sql, article_claim_complete.sql): the claim with FOR UPDATE
  SKIP LOCKED, the fenced completion of the batch;
- drainer's own claim_batch and complete_many on drainer's table (drainer/sql/queries.sql,
  rendered by bench.contenders.pgbench_script with the parameters the drain sends);

at 1, 2, 4 and 8 clients and claims of 10 and 1000 (LIMIT), each run draining the same number
of due jobs from a freshly filled and vacuumed table, in a database of its own that is dropped
after. The two scripts of one setting run back to back in every round (their order
alternating), so their ratio is taken seconds apart. The server's capacity is the best
median of the first script over the settings: what the drain is compared with.

Each run also reports how many of its updates were HOT (pg_stat_user_tables n_tup_hot_upd
over n_tup_upd): a non-HOT update writes a new entry in every index whose predicate the new
row satisfies. Neither table can have HOT claims or completions: both change status, a
column of every partial index's predicate.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

from bench.contenders import pgbench_script
from bench.core import ensure_database, fill, fmt_rate, fresh_schema, log, run_timed, settle

if TYPE_CHECKING:
    from bench.cli import Ctx

HERE = Path(__file__).resolve().parent / "pgbench"
ARTICLE_SCHEMA = HERE / "article_schema.sql"
ARTICLE_SCRIPT = HERE / "article_claim_complete.sql"
CLIENTS = (1, 2, 4, 8)
LIMITS = (10, 1000)
WHO = ("article", "drainer")
#: the schema of each script's table in the capacity database
SCHEMAS = {"article": "cap_article", "drainer": "cap_drainer"}


@dataclass
class Run:
    jobs_per_s: float
    hot: float  # HOT updates / updates on the table during the run


@dataclass
class Cell:
    """One script at one setting, its runs over the rounds."""

    runs: list[Run] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(r.jobs_per_s for r in self.runs) if self.runs else math.nan

    @property
    def hot(self) -> float:
        return statistics.median(r.hot for r in self.runs) if self.runs else math.nan


def jobs_for(n: int, clients: tuple[int, ...], limits: tuple[int, ...]) -> int:
    """At least ``n`` jobs, a multiple of every limit x clients: each client's last claim is
    full (pgbench -t counts claims), no run ends on empty claims."""
    step = math.lcm(*(c * b for c in clients for b in limits))
    return step * max(1, math.ceil(n / step))


def setup(url: str) -> None:
    for schema in SCHEMAS.values():
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                sql.Identifier(schema)))
    fresh_schema(url, SCHEMAS["drainer"])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMAS["article"])))
        conn.execute(sql.SQL("SET search_path TO {}").format(
            sql.Identifier(SCHEMAS["article"])))
        conn.execute(ARTICLE_SCHEMA.read_text())


def fill_article(url: str, n: int) -> None:
    """As bench.core.fill, for the table of *Postgres as a job queue*: emptied, ``n`` due
    jobs, VACUUM ANALYZE."""
    table = sql.Identifier(SCHEMAS["article"], "jobs")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("TRUNCATE {}").format(table))
        conn.execute(sql.SQL(
            "INSERT INTO {} (payload, run_at) SELECT jsonb_build_object('n', g), "
            "now() - interval '1s' FROM generate_series(0, %s - 1) g").format(table), [n])
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(table))


def _counters(url: str, schema: str) -> tuple[int, int, int]:
    """(done jobs, updates, HOT updates) of a script's table, as the statistics see them."""
    time.sleep(0.3)  # pgbench's backends flush their counters as they exit
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(sql.SQL(
            "SELECT (SELECT count(*) FROM {} WHERE status = 'done'), n_tup_upd, n_tup_hot_upd "
            "FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'jobs'").format(
                sql.Identifier(schema, "jobs")), [schema]).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def run_one(url: str, who: str, clients: int, limit: int, n: int,
            script: str | None = None) -> Run | str:
    """Fill ``who``'s table with ``n`` jobs and drain them with pgbench: the run, or what
    went wrong. ``script``: another pgbench script for ``who``'s table (an A/B of the SQL)."""
    schema = SCHEMAS[who]
    if who == "article":
        fill_article(url, n)
        script = script or ARTICLE_SCRIPT.read_text()
    else:
        fill(url, schema, n)
        script = script or pgbench_script(url, schema, "bench", limit)
    settle(url, [url])
    _, upd0, hot0 = _counters(url, schema)
    parts = urlsplit(url)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    try:
        timed = run_timed([
            "pgbench", "-n", "-M", "prepared", "-c", str(clients), "-j", str(clients),
            "-t", str(n // (clients * limit)), "-D", f"batch={limit}", "-f", f.name,
            "-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 5432),
            "-U", parts.username or "postgres", parts.path.lstrip("/"),
        ], {"PGOPTIONS": f"-c search_path={schema}"})
    finally:
        Path(f.name).unlink()
    done, upd1, hot1 = _counters(url, schema)
    tps = re.search(r"tps = ([\d.]+)", timed.stdout)
    txns = re.search(r"number of transactions actually processed: (\d+)", timed.stdout)
    if timed.returncode != 0 or not tps or not txns or not float(tps.group(1)):
        return f"pgbench exit {timed.returncode}: {timed.stderr.strip()[-300:]}"
    if done != n:
        return f"{done} of {n} jobs done"
    # the transactions over the seconds pgbench reports them in (its connections left out)
    seconds = int(txns.group(1)) / float(tps.group(1))
    return Run(n / seconds, (hot1 - hot0) / max(1, upd1 - upd0))


@dataclass
class Capacity:
    cells: dict[tuple[str, int, int], Cell]
    pairs: dict[tuple[int, int], list[float]]  # drainer / article, same round, a setting
    n: int

    def best(self, who: str) -> tuple[float, int, int]:
        """(jobs/s, clients, limit) of ``who``'s best setting by median."""
        jobs, c, b = max((cell.median, c, b) for (w, c, b), cell in self.cells.items()
                         if w == who and cell.runs)
        return jobs, c, b


def measure(url: str, n: int, repeat: int, clients: tuple[int, ...] = CLIENTS,
            limits: tuple[int, ...] = LIMITS) -> Capacity:
    setup(url)
    cells = {(w, c, b): Cell() for w in WHO for c in clients for b in limits}
    pairs: dict[tuple[int, int], list[float]] = {(c, b): [] for c in clients for b in limits}
    for rnd in range(repeat):
        for b in limits:
            for c in clients:
                order = WHO if (rnd + c) % 2 == 0 else WHO[::-1]
                got: dict[str, Run] = {}
                for w in order:
                    run = run_one(url, w, c, b, n)
                    if isinstance(run, str):
                        log(f"capacity {w} c={c} LIMIT {b}: INVALID run: {run}")
                        continue
                    got[w] = run
                    cells[(w, c, b)].runs.append(run)
                    log(f"round {rnd + 1}/{repeat} capacity {w} c={c} LIMIT {b}: "
                        f"{run.jobs_per_s:,.0f} jobs/s")
                if len(got) == 2:
                    pairs[(c, b)].append(got["drainer"].jobs_per_s / got["article"].jobs_per_s)
    return Capacity(cells, pairs, n)


def table(cap: Capacity) -> list[str]:
    lines = ["| clients | LIMIT | article's SQL jobs/s (median) | drainer's SQL jobs/s (median) "
             "| drainer / article (same-round, median) | HOT updates, article | "
             "HOT updates, drainer |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for (c, b), ratios in cap.pairs.items():
        a, d = cap.cells[("article", c, b)], cap.cells[("drainer", c, b)]
        ratio = f"{statistics.median(ratios):.2f}" if ratios else "n/a"
        lines.append(f"| {c} | {b} | {fmt_rate(a.median)} | {fmt_rate(d.median)} | {ratio} | "
                     f"{a.hot:.0%} | {d.hot:.0%} |")
    return lines


def section_capacity(ctx: Ctx) -> list[str]:
    """The capacity table; ctx.capacity becomes the best of the SQL of *Postgres as a job queue*."""
    if not ctx.have_pgbench:
        return ["### Server capacity", "", "pgbench not found: no capacity (install "
                "postgresql-client)"]
    clients, limits = ((1, 2), LIMITS) if ctx.smoke else (CLIENTS, LIMITS)
    n = jobs_for(ctx.capacity_n, clients, limits)
    name = f"{ctx.database}_capacity"
    url = ensure_database(ctx.server, name)
    try:
        cap = measure(url, n, ctx.repeat, clients, limits)
    finally:
        with psycopg.connect(ctx.server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))
    best, bc, bb = cap.best("article")
    ours, oc, ob = cap.best("drainer")
    ctx.capacity = best
    ctx.results["capacity"] = {
        "jobs": n, "best": {"article": [best, bc, bb], "drainer": [ours, oc, ob]},
        "cells": [{"who": w, "clients": c, "limit": b,
                   "jobs_per_s": [r.jobs_per_s for r in cell.runs],
                   "hot": [r.hot for r in cell.runs]} for (w, c, b), cell in cap.cells.items()],
        "same_round_ratio": [{"clients": c, "limit": b, "ratios": r}
                             for (c, b), r in cap.pairs.items()]}
    at_best = cap.pairs[(bc, bb)]
    lines = [f"### Server capacity: pgbench, {n:,} due jobs a run, claim + fenced batch "
             "complete (two statements, two commits a batch)", "", *table(cap), "",
             f"server capacity (best of article's SQL): **{fmt_rate(best)} jobs/s** "
             f"({bc} client{'s' if bc > 1 else ''}, LIMIT {bb}); drainer's SQL at the same "
             f"setting: **{statistics.median(at_best) if at_best else math.nan:.2f}x** "
             f"(same-round); drainer's best: {fmt_rate(ours)} jobs/s ({oc} clients, LIMIT {ob})",
             "", "article's SQL: bench/pgbench/article_claim_complete.sql on its table "
             "(*Postgres as a job queue*); drainer's: claim_batch and complete_many of "
             "drainer/sql/queries.sql as the drain fills them"
             " (every job starts at once, a run id, no results, no "
             "follow-ups); jobs/s over pgbench's transactions (its connections left out); "
             f"pgbench -n -M prepared -c C -j C -D batch=LIMIT; load average "
             f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} after the section."]
    return lines
