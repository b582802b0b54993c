"""enqueue_many's own COPY text against psycopg's ``write_row`` with Jsonb, interleaved.

    python -m bench.copy_text [JOBS] [ROUNDS]

Each contender COPYs JOBS jobs due now into a migrated table, in one transaction on an
autocommit connection (from Python objects to commit), the rows enqueue_many writes for
them: a list of JobSpecs, and payloads on one queue (``queue=``). "own text" is
enqueue_many's encoder (drainer.producer._copy_text), "write_row" is
``copy.write_row((queue, Jsonb(payload), priority, max_attempts))`` with the same types
set. Two payloads: a small one (``{"n": i}``) and one of about 600 bytes. The order of the
contenders rotates every round; the table has each contender's median jobs/s, its median
client CPU time (this process's, the COPY's encoding) and the median over rounds of its
ratio to write_row's figure of the same round. ``BENCH_AB_DATABASE`` names the database
(default ``drainer_bench_copy_text``).
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from bench.core import ab_database, fresh_schema, jobs_table
from drainer.db import QUERIES
from drainer.producer import JobSpec
from drainer.producer._copy_text import NOW_TYPES, NowText, Payloads
from drainer.producer._steps import Copy, write

SERVER = os.environ.get("BENCH_SERVER_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
SCHEMA = "b_copy_text"

#: One contender: the COPY step of JOBS rows (made anew for each run: it is read once).
Step = Callable[[sql.Composed], Copy]

#: The largest share of write_row's client CPU the own text may spend on small payloads: it
#: is kept for what it saves the producer, and the bench fails when it no longer does.
CPU_GATE = 2 / 3


def _medium(i: int) -> dict[str, Any]:
    return {"order": i, "customer": f"customer-{i:08d}@example.com", "currency": "EUR",
            "lines": [{"sku": f"SKU-{i % 97:05d}-{k}", "qty": k + 1, "price": 19.99 * (k + 1),
                       "note": "gift wrap, deliver after 18:00"} for k in range(4)],
            "flags": {"express": i % 2 == 0, "invoice": True}, "tags": ["web", "eu"]}


def _contenders(n: int) -> dict[str, Step]:
    out: dict[str, Step] = {}
    for shape, make in (("small", lambda i: {"n": i}), ("600 B", _medium)):
        payloads = [make(i) for i in range(n)]
        specs = [JobSpec("bench", p) for p in payloads]

        def specs_text(stmt: sql.Composed, specs: list[JobSpec] = specs) -> Copy:
            rows = NowText(specs, text=True)
            return Copy(stmt, NOW_TYPES, rows.rows(), rows)

        def specs_rows(stmt: sql.Composed, specs: list[JobSpec] = specs) -> Copy:
            return Copy(stmt, NOW_TYPES, ((s.queue, Jsonb(s.payload), s.priority,
                                           s.max_attempts) for s in specs))

        def payloads_text(stmt: sql.Composed, payloads: list[Any] = payloads) -> Copy:
            return Copy(stmt, NOW_TYPES, (), Payloads("bench\t", "\t0\t5\n", iter(payloads)))

        def payloads_rows(stmt: sql.Composed, payloads: list[Any] = payloads) -> Copy:
            return Copy(stmt, NOW_TYPES, (("bench", Jsonb(p), 0, 5) for p in payloads))

        out |= {f"{shape}, JobSpecs, own text": specs_text,
                f"{shape}, JobSpecs, write_row": specs_rows,
                f"{shape}, payloads, own text": payloads_text,
                f"{shape}, payloads, write_row": payloads_rows}
    return out


def _run(url: str, n: int, step: Step) -> tuple[float, float]:
    """One COPY of ``n`` jobs to commit: (jobs/s, client CPU seconds)."""
    table = jobs_table(SCHEMA)
    copy_now = sql.SQL(QUERIES["enqueue_copy_now"]).format(jobs=table)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("TRUNCATE {}").format(table))
        conn.execute("CHECKPOINT")
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        with conn.transaction(), conn.cursor().copy(copy_now) as copy:
            write(copy, step(copy_now))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        got = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
    if got is None or got[0] != n:
        raise SystemExit(f"expected {n} rows, found {got}")
    return n / wall, cpu


def _paired(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """The median of a/b over the rounds and its quartiles: how far one round's ratio
    strays from the next is the noise a difference must stand out of."""
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    if len(ratios) < 2:
        return ratios[0], ratios[0], ratios[0]
    q1, q2, q3 = statistics.quantiles(ratios, n=4)
    return q2, q1, q3


def _fmt(paired: tuple[float, float, float]) -> str:
    return f"{paired[0]:.2f} ({paired[1]:.2f}-{paired[2]:.2f})"


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 100_000
    rounds = int(argv[1]) if len(argv) > 1 else 7
    url = ab_database(SERVER, "drainer_bench_copy_text")
    fresh_schema(url, SCHEMA)
    contenders = _contenders(n)
    names = list(contenders)
    rates: dict[str, list[float]] = {k: [] for k in names}
    cpus: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k] if r % 2 == 0 else (names[k:] + names[:k])[::-1]:
            rate, cpu = _run(url, n, contenders[name])
            rates[name].append(rate)
            cpus[name].append(cpu)
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    print(f"{n:,} jobs a COPY, {rounds} rounds, load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| rows | jobs/s (median) | min | max | x write_row (paired: median, quartiles) | "
          "client CPU s (median) | CPU x write_row (paired: median, quartiles) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    failed = []
    for name in names:
        base = name.rsplit(", ", 1)[0] + ", write_row"
        saved = _paired(cpus[name], cpus[base])
        print(f"| {name} | {statistics.median(rates[name]):,.0f} | {min(rates[name]):,.0f} | "
              f"{max(rates[name]):,.0f} | {_fmt(_paired(rates[name], rates[base]))} | "
              f"{statistics.median(cpus[name]):.3f} | {_fmt(saved)} |")
        if name.startswith("small") and name.endswith("own text") and saved[0] > CPU_GATE:
            failed.append(f"{name}: {saved[0]:.2f}x write_row's client CPU")
    if failed:
        print(f"the own COPY text no longer saves a third of the client CPU ({'; '.join(failed)})"
              ": write_row with Jsonb would do", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
