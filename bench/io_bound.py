"""Handlers that wait on I/O: jobs of 50 ms each, async and sync, against Little's law.

With C handlers in flight and each job taking S seconds, no queue drains faster than C / S jobs
per second (Little's law), and N jobs take at least ceil(N / C) * S seconds: the ideal rate is
N / (ceil(N / C) * S). The measured rate is N over the handlers' own window, from the first
job's start to the last job's end (written by bench/io_stamps.py at the contender's exit), so
process start-up, connecting, the first claim and the last completion are left out; the
process wall rate (start-up included) is shown beside it.

Each concurrency also runs the same handlers with no queue (bench/io_bare.py: one event loop,
a task a call; or C threads), whose ratio to Little's law is what the interpreter and the
machine's load leave at that moment: "x no queue" is a queue's rate over that floor's.
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bench.contenders import PEERS_BIN, Contender, Drainer, Pgqueuer, Procrastinate, _sql
from bench.core import ROOT, VENV_BIN, Timed, fmt_rate, log, run_timed, settle

if TYPE_CHECKING:
    from bench.cli import Ctx

DEFAULT_PLAN = "async:200,async:1000,sync:50,sync:200"


def parse_plan(text: str) -> list[tuple[str, int]]:
    plan = []
    for part in text.split(","):
        kind, _, c = part.strip().partition(":")
        if kind not in ("async", "sync") or not c.isdigit() or int(c) < 1:
            raise ValueError(f"bad --io-plan entry {part!r} (want async:C or sync:C)")
        plan.append((kind, int(c)))
    return plan


def ideal_rate(n: int, concurrency: int, sleep: float) -> float:
    return n / (math.ceil(n / concurrency) * sleep)


class _Stamped:
    """A contender whose handlers write their window to a file named by BENCH_IO_STAMPS."""

    sleep: float
    stamps: Path

    def stamp_env(self) -> dict[str, str]:
        self.stamps.unlink(missing_ok=True)
        return {"BENCH_IO_STAMPS": str(self.stamps), "BENCH_IO_SLEEP": str(self.sleep),
                "PYTHONPATH": str(ROOT)}

    def window(self) -> tuple[float, int]:
        try:
            data = json.loads(self.stamps.read_text())
        except (OSError, ValueError):
            return float("nan"), 0
        return float(data["last"] - data["first"]), int(data["count"])


@dataclass
class IoDrainer(Drainer, _Stamped):
    kind: str = "async"
    concurrency: int = 1
    sleep: float = 0.05
    stamps: Path = field(default_factory=Path)

    def run(self, n: int) -> Timed:
        env = {**self.env(), **self.stamp_env()}
        return run_timed([str(VENV_BIN / "drainer"), "run-once", "--concurrency",
                          str(self.concurrency), "--queue", f"io_{self.kind}", *self.flags],
                         env)


@dataclass
class IoBare(Contender, _Stamped):
    """The handlers alone, no queue (bench/io_bare.py): the floor of the machine right now."""

    kind: str = "async"
    concurrency: int = 1
    sleep: float = 0.05
    stamps: Path = field(default_factory=Path)

    def setup(self) -> None:
        pass

    def reset(self, n: int) -> None:
        pass

    def run(self, n: int) -> Timed:
        return run_timed([str(VENV_BIN / "python"), "-m", "bench.io_bare", self.kind,
                          str(self.concurrency), str(n)], self.stamp_env())

    def check(self, n: int, timed: Timed) -> str | None:
        if timed.returncode != 0:
            return f"exit {timed.returncode}: {timed.stderr.strip()[-300:]}"
        return None


@dataclass
class IoProcrastinate(Procrastinate, _Stamped):
    kind: str = "async"
    sleep: float = 0.05
    stamps: Path = field(default_factory=Path)

    def reset(self, n: int) -> None:
        _sql(self.url,
             "TRUNCATE procrastinate_events, procrastinate_periodic_defers, procrastinate_jobs, "
             "procrastinate_workers CASCADE",
             "INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
             f"SELECT 'io', 'io', '{{}}' FROM generate_series(1, {int(n)})",
             "VACUUM (ANALYZE) procrastinate_jobs")

    def run(self, n: int) -> Timed:
        return run_timed([str(PEERS_BIN / "python"), "-m", "bench.peer_io", "procrastinate",
                          self.kind, str(self.concurrency), self.run_url], self.stamp_env())


@dataclass
class IoPgqueuer(Pgqueuer, _Stamped):
    kind: str = "async"
    concurrency: int = 1
    sleep: float = 0.05
    stamps: Path = field(default_factory=Path)

    def reset(self, n: int) -> None:
        _sql(self.url,
             "TRUNCATE pgqueuer, pgqueuer_log",
             "INSERT INTO pgqueuer (priority, entrypoint, status, payload) "
             f"SELECT 0, 'io', 'queued', NULL FROM generate_series(1, {int(n)})",
             "VACUUM (ANALYZE) pgqueuer")

    def run(self, n: int) -> Timed:
        return run_timed([str(PEERS_BIN / "python"), "-m", "bench.peer_io", "pgqueuer",
                          self.kind, str(self.concurrency), self.run_url], self.stamp_env())


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def section_io(ctx: Ctx) -> list[str]:
    n, sleep = ctx.io_n, ctx.io_sleep
    tmp = Path(tempfile.mkdtemp(prefix="bench-io-"))
    db = ctx.db
    contenders: list[tuple[str, int, Contender]] = []
    proc_db = pgq_db = ""
    if ctx.peers:
        proc_db = ctx.peer_db("procrastinate")
        pgq_db = ctx.peer_db("pgqueuer")
    for i, (kind, c) in enumerate(ctx.io_plan):
        contenders.append((kind, c, IoBare(
            "no queue: the handlers alone" + (", a task a call on one event loop"
                                              if kind == "async" else f", {c} threads"),
            db, "", kind=kind, concurrency=c, sleep=sleep, stamps=tmp / f"b{i}.json")))
        contenders.append((kind, c, IoDrainer(
            f"drainer run-once --concurrency {c}", db, "b_io", queues=[f"io_{kind}"],
            app="bench.io_app", kind=kind, concurrency=c, sleep=sleep,
            stamps=tmp / f"d{i}.json")))
        if ctx.peers:
            contenders.append((kind, c, IoProcrastinate(
                f"procrastinate worker, concurrency {c}", proc_db, "public", kind=kind,
                concurrency=c, sleep=sleep, stamps=tmp / f"p{i}.json")))
            contenders.append((kind, c, IoPgqueuer(
                f"pgqueuer drain, max_concurrent_tasks {c}", pgq_db, "public", kind=kind,
                concurrency=c, sleep=sleep, stamps=tmp / f"q{i}.json")))
    done_setup: set[tuple[str, str]] = set()
    for _k, _c, con in contenders:
        if (con.url, con.schema) not in done_setup:
            con.setup()
            done_setup.add((con.url, con.schema))
    databases = [con.url for _k, _c, con in contenders]
    rates: list[list[float]] = [[] for _ in contenders]
    walls: list[list[float]] = [[] for _ in contenders]
    notes: list[list[str]] = [[] for _ in contenders]
    for rnd in range(ctx.io_repeat):
        k = rnd % len(contenders)
        order = list(range(len(contenders)))
        for i in order[k:] + order[:k]:
            kind, c, con = contenders[i]
            settle(con.url, databases)
            con.reset(n)
            timed = con.run(n)
            problem = con.check(n, timed)
            assert isinstance(con, _Stamped)
            window, count = con.window()
            if not problem and count != n:
                problem = f"{count} of {n} handler calls stamped"
            if problem:
                notes[i].append(problem)
                log(f"io {con.name} ({kind}): INVALID run: {problem}")
                continue
            rates[i].append(n / window)
            walls[i].append(n / timed.wall)
            log(f"round {rnd + 1}/{ctx.io_repeat} io {kind} {con.name}: {n / window:,.0f} jobs/s "
                f"in the handlers' window ({window:.3f} s), {n / timed.wall:,.0f} jobs/s wall")
    ctx.results["io"] = {"jobs": n, "sleep_s": sleep, "runs": [
        {"handlers": kind, "concurrency": c, "contender": con.name,
         "ideal_jobs_per_s": ideal_rate(n, c, sleep), "jobs_per_s": rates[i],
         "wall_jobs_per_s": walls[i], "notes": sorted(set(notes[i]))}
        for i, (kind, c, con) in enumerate(contenders)]}
    lines = [f"### Handlers that wait on I/O: {n:,} jobs of {sleep * 1000:g} ms each, local "
             "database", "",
             "| handlers | concurrency | contender | jobs/s (median) | min | max | "
             "x Little's law | x no queue | process wall jobs/s |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    floors = {(kind, c): _med(rates[i]) for i, (kind, c, con) in enumerate(contenders)
              if isinstance(con, IoBare)}
    for i, (kind, c, con) in enumerate(contenders):
        r = rates[i]
        ideal = ideal_rate(n, c, sleep)
        floor = floors.get((kind, c), float("nan"))
        note = f" ({'; '.join(sorted(set(notes[i])))})" if notes[i] else ""
        handler = "async (`asyncio.sleep`)" if kind == "async" else "sync (`time.sleep`)"
        lines.append(f"| {handler} | {c} | {con.name}{note} | {fmt_rate(_med(r))} | "
                     f"{fmt_rate(min(r, default=float('nan')))} | "
                     f"{fmt_rate(max(r, default=float('nan')))} | **{_med(r) / ideal:.2f}** | "
                     f"{_med(r) / floor:.2f} | {fmt_rate(_med(walls[i]))} |")
    lines += ["", f"Little's law: N / (ceil(N / C) x {sleep:g} s), e.g. "
              + ", ".join(f"C={c}: {fmt_rate(ideal_rate(n, c, sleep))} jobs/s"
                          for c in sorted({c for _k, c in ctx.io_plan})) + ". "
              "jobs/s: N over the handlers' window (first start to last end): process "
              "start-up, connecting, the first claim and the last completion left out; wall: "
              "process start to exit. x no queue: over the same handlers run with no queue "
              "in the same round (bench/io_bare.py), what the machine allowed at that moment.",
              "Settings: drainer `run-once --concurrency C` otherwise default (async handlers "
              "as tasks on one event loop, C in flight, C more claimed ahead; sync handlers on "
              "C threads); procrastinate `run_worker_async(concurrency=C, "
              "wait=False)`, psycopg pool max 10, default executor C threads; pgqueuer drain "
              "mode, `max_concurrent_tasks=C`, `batch_size=min(100, C/2)`, sync handler in "
              "`asyncio.to_thread` with C threads; the best of the settings tried (see "
              "bench/peer_io.py)."]
    return lines
