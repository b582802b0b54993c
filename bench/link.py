"""Across a link: the drain and the empty queue through bench.proxy at each ``--rtt``.

Every contender's process connects through a delay proxy (one per RTT, all in this process);
the proxy records how long each server session was held. compute-seconds = the time at least
one session of the run was open (the union of its connections' accept-to-close spans): what a
serverless database bills. The local rows connect directly, as the other sections do.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from bench.contenders import PEERS_BIN, Contender, Drainer, Pgqueuer, Procrastinate
from bench.core import ROOT, VENV_BIN, fill, fmt_rate, fresh_schema, log, run_timed, settle
from bench.proxy import DelayProxy, Session, compute_seconds, held_seconds
from bench.suspend import SuspendSimulator

if TYPE_CHECKING:
    from bench.cli import Ctx

QUEUE_COUNTS = (1, 50, 300)
PROCRASTINATE = "procrastinate worker --one-shot (c=10)"
#: procrastinate drains this many jobs in the link race (its runs would take minutes each)
PROCRASTINATE_LINK_JOBS = 2_000


def target_of(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 5432


def via(url: str, proxy: DelayProxy | SuspendSimulator) -> str:
    """``url`` with its host and port replaced by the proxy's (or the simulator's)."""
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user + '@' if user else ''}{proxy.host}:{proxy.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def link_label(rtt: float | None) -> str:
    return "local (direct)" if rtt is None else f"proxy, RTT {rtt:g} ms"


@dataclass
class Runs:
    """The repetitions of one contender on one link."""

    name: str
    rtt: float | None
    rates: list[float] = field(default_factory=list)
    compute: list[float] = field(default_factory=list)  # compute-s per 1,000 jobs
    session_s: list[float] = field(default_factory=list)  # session-seconds per 1,000 jobs
    statements: list[int] = field(default_factory=list)
    parses: list[int] = field(default_factory=list)  # Parse messages sent
    connections: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"contender": self.name, "rtt_ms": self.rtt, "jobs_per_s": self.rates,
                "compute_s_per_1000": self.compute, "session_s_per_1000": self.session_s,
                "statements": self.statements, "parses": self.parses,
                "connections": self.connections,
                "notes": sorted(set(self.notes))}


def _med(xs: list[float] | list[int]) -> float:
    return statistics.median(xs) if xs else float("nan")


def link_race(entries: list[tuple[Contender, float | None]], proxies: dict[float, DelayProxy],
              n: int, repeat: int, sizes: dict[str, int] | None = None) -> list[Runs]:
    """Drain ``n`` jobs (``sizes``: fewer for the contenders named there) with each
    (contender, link), ``repeat`` rounds, the order rotating."""
    total = n
    done_setup: set[tuple[str, str]] = set()
    for c, _ in entries:
        if (c.url, c.schema) not in done_setup:
            c.setup()
            done_setup.add((c.url, c.schema))
    out = [Runs(c.name, rtt) for c, rtt in entries]
    databases = [c.url for c, _ in entries]
    for rnd in range(repeat):
        k = rnd % len(entries)
        order = list(range(len(entries)))
        for i in order[k:] + order[:k]:
            c, rtt = entries[i]
            n = (sizes or {}).get(c.name, total)
            proxy = None if rtt is None else proxies[rtt]
            settle(c.url, databases)
            c.reset(n)
            if proxy is not None:
                proxy.take()
            timed = c.run(n)
            sessions: list[Session] = []
            if proxy is not None:
                proxy.settle()
                sessions = proxy.take()
            runs = out[i]
            problem = c.check(n, timed)
            if problem:
                runs.notes.append(problem)
                log(f"{c.name} ({link_label(rtt)}): INVALID run: {problem}")
                continue
            runs.rates.append(n / timed.wall)
            text = f"{n / timed.wall:,.0f} jobs/s"
            if proxy is not None:  # a direct run has no held time to show
                comp, sess = compute_seconds(sessions), held_seconds(sessions)
                stmts = sum(s.statements for s in sessions)
                runs.compute.append(comp / n * 1000)
                runs.session_s.append(sess / n * 1000)
                parses = sum(s.parses for s in sessions)
                runs.statements.append(stmts)
                runs.parses.append(parses)
                runs.connections.append(len(sessions))
                text += (f", compute {comp:.2f} s, {stmts} statements, {parses} Parse, "
                         f"{len(sessions)} connections")
            log(f"round {rnd + 1}/{repeat} {c.name} ({link_label(rtt)}): {text}")
    return out


def section_link_drain(ctx: Ctx) -> list[str]:
    db, n = ctx.db, ctx.n
    target = target_of(ctx.server)
    with contextlib.ExitStack() as stack:
        proxies = {r: stack.enter_context(DelayProxy(r, target)) for r in ctx.rtts}
        kinds: list[tuple[str, Any]] = [
            ("drainer run-once (defaults)", lambda v: Drainer(
                "drainer run-once (defaults)", db, "b_link", via=v))]
        if ctx.peers:
            pgq_db = ctx.peer_db("pgqueuer")
            kinds.append(("pgqueuer drain mode (asyncpg, batch 10)", lambda v: Pgqueuer(
                "pgqueuer drain mode (asyncpg, batch 10)", pgq_db, "public", via=v)))
            proc_db = ctx.peer_db("procrastinate")
            kinds.append((PROCRASTINATE, lambda v: Procrastinate(
                PROCRASTINATE, proc_db, "public", via=v, concurrency=10)))
        entries: list[tuple[Contender, float | None]] = []
        for _name, make in kinds:
            entries.append((make(None), None))
            for rtt, p in proxies.items():
                entries.append((make(via(make(None).url, p)), rtt))
        # procrastinate takes about 7 ms a job locally (c=10), far more across the link
        sizes = {PROCRASTINATE: min(n, PROCRASTINATE_LINK_JOBS)}
        runs = link_race(entries, proxies, n, ctx.repeat, sizes)
    ctx.results["link_drain"] = {"jobs": n, "runs": [r.as_json() for r in runs]}
    local = {r.name: _med(r.rates) for r in runs if r.rtt is None}
    lines = [f"### Drain across a link: {n:,} no-op jobs through the delay proxy "
             "(process start to exit)", "",
             "| contender | link | jobs/s (median) | min | max | runs | compute-s per 1,000 "
             "jobs | statements | Parse | x its local rate |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        note = f" ({'; '.join(sorted(set(r.notes)))})" if r.notes else ""
        comp = "n/a" if r.rtt is None else f"{_med(r.compute):.3f}"
        stm = "" if r.rtt is None else f"{_med(r.statements):,.0f}"
        prs = "" if r.rtt is None or not r.parses else f"{_med(r.parses):,.0f}"
        ratio = _med(r.rates) / local[r.name] if local.get(r.name) else float("nan")
        lines.append(f"| {r.name}{note} | {link_label(r.rtt)} | {fmt_rate(_med(r.rates))} | "
                     f"{fmt_rate(min(r.rates, default=float('nan')))} | "
                     f"{fmt_rate(max(r.rates, default=float('nan')))} | {len(r.rates)} | "
                     f"{comp} | {stm} | {prs} | {ratio:.2f} |")
    lines.append("")
    by = {(r.name, r.rtt): r for r in runs}
    for link in [None, *ctx.rtts]:
        d = by.get(("drainer run-once (defaults)", link))
        for peer, short in (("pgqueuer drain mode (asyncpg, batch 10)", "pgqueuer"),
                            (PROCRASTINATE, "procrastinate")):
            q = by.get((peer, link))
            if d and q and d.rates and q.rates:
                text = (f"{link_label(link)}: drainer / {short} jobs/s "
                        f"**{_med(d.rates) / _med(q.rates):.1f}x**")
                if link is not None:
                    text += (f", compute-s per 1,000 jobs {short} / drainer "
                             f"**{_med(q.compute) / _med(d.compute):.1f}x**")
                lines.append(f"- {text}")
        if d and link is not None and d.rates and by.get(("drainer run-once (defaults)", None)):
            own = by[("drainer run-once (defaults)", None)]
            if own.rates:
                lines.append(f"- {link_label(link)}: drainer / its own local rate "
                             f"**{_med(d.rates) / _med(own.rates):.2f}x**")
    if any(r.name == PROCRASTINATE for r in runs) and n > PROCRASTINATE_LINK_JOBS:
        lines += ["", f"procrastinate drains {PROCRASTINATE_LINK_JOBS:,} jobs a run (the "
                  f"others {n:,}): at its rate a run of all of them takes minutes."]
    lines += ["", "compute-s: seconds during which at least one of the run's server sessions "
              "was open through the proxy (accept to close), per 1,000 jobs; statements: Query "
              "+ Execute messages the contender sent; Parse: the Parse messages among them "
              "(statements parsed by the server: a prepared statement is parsed once a "
              "session); the proxy holds each direction RTT/2 and a client's first bytes one "
              "more RTT (the TCP handshake)."]
    return lines


# -- empty queue ----------------------------------------------------------------------------------


def write_queue_apps(directory: Path, counts: tuple[int, ...] = QUEUE_COUNTS) -> dict[int, str]:
    """A module per count with that many queues, one no-op ``@task`` each; module names."""
    names = {}
    for k in counts:
        name = f"bench_queues_{k}"
        body = ["from drainer import Job, task", ""]
        for i in range(k):
            body += [f"@task('q{i:03d}')", f"def noop_{i:03d}(job: Job) -> None:",
                     "    pass", ""]
        (directory / f"{name}.py").write_text("\n".join(body))
        names[k] = name
    return names


def section_link_empty(ctx: Ctx) -> list[str]:
    db = ctx.db
    fresh_schema(db, "b_empty")
    fill(db, "b_empty", 0)
    target = target_of(ctx.server)
    py = str(VENV_BIN / "python")
    tmp = Path(tempfile.mkdtemp(prefix="bench-queues-"))
    apps = write_queue_apps(tmp)
    peers: list[tuple[str, Contender]] = []
    if ctx.peers:
        p = Procrastinate("", ctx.peer_db("procrastinate"),
                          "public")
        q = Pgqueuer("", ctx.peer_db("pgqueuer"), "public")
        for peer in (p, q):
            peer.setup()
            peer.reset(0)
        peers = [("procrastinate worker --one-shot, 1 queue", p),
                 ("pgqueuer drain mode, 1 entrypoint", q)]
    with contextlib.ExitStack() as stack:
        proxies = {r: stack.enter_context(DelayProxy(r, target)) for r in ctx.rtts}
        plan: list[tuple[str, float, list[str], dict[str, str]]] = []
        for r, proxy in proxies.items():
            url = via(db, proxy)
            plan.append(("connect + close only (psycopg)", r,
                         [py, "-c", f"import psycopg; psycopg.connect({url!r}).close()"], {}))
            for k, mod in apps.items():
                env = Drainer("", db, "b_empty", app=mod, via=url).env()
                env["PYTHONPATH"] = f"{ROOT}:{tmp}"
                plan.append((f"drainer run-once, {k} queue{'s' if k > 1 else ''}", r,
                             [str(VENV_BIN / "drainer"), "run-once"], env))
            for label, c in peers:
                c.via = via(c.url, proxy)
                if isinstance(c, Procrastinate):
                    cmd = [str(PEERS_BIN / "procrastinate"),
                           "--app=bench.peer_procrastinate.app", "worker", "--one-shot", "-q",
                           "bench"]
                    env = c.env()
                else:
                    cmd = [str(PEERS_BIN / "python"), "-m", "bench.peer_pgqueuer", c.run_url]
                    env = {"PYTHONPATH": str(ROOT)}
                plan.append((label, r, cmd, env))
        keys = [(label, r) for label, r, *_ in plan]
        held: dict[tuple[str, float], list[float]] = {k: [] for k in keys}
        stmts: dict[tuple[str, float], list[int]] = {k: [] for k in keys}
        conns: dict[tuple[str, float], list[int]] = {k: [] for k in keys}
        walls: dict[tuple[str, float], list[float]] = {k: [] for k in keys}
        databases = [db, *(c.url for _label, c in peers)]
        for rnd in range(ctx.cold_repeat):
            k0 = rnd % len(plan)
            for label, r, cmd, env in plan[k0:] + plan[:k0]:
                proxy = proxies[r]
                settle(db, databases)  # direct, not through the proxy: counts no session
                proxy.take()
                timed = run_timed(cmd, env)
                proxy.settle()
                sessions = proxy.take()
                if timed.returncode != 0:
                    log(f"empty queue {label} at RTT {r:g}: exit {timed.returncode}: "
                        f"{timed.stderr[-300:]}")
                    continue
                key = (label, r)
                held[key].append(compute_seconds(sessions))
                stmts[key].append(sum(s.statements for s in sessions))
                conns[key].append(len(sessions))
                walls[key].append(timed.wall)
    ctx.results["link_empty"] = [
        {"command": label, "rtt_ms": r, "held_s": held[(label, r)],
         "statements": stmts[(label, r)], "connections": conns[(label, r)],
         "wall_s": walls[(label, r)]} for label, r in keys]
    lines = ["### Empty queue across a link: how long the server session is held", "",
             "| command | link | held s (median) | min | max | statements | connections | "
             "held beyond connect-only, in RTTs | process wall s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, r in keys:
        h = held[(label, r)]
        if not h:
            lines.append(f"| {label} | {link_label(r)} | failed | | | | | | |")
            continue
        base = _med(held[("connect + close only (psycopg)", r)])
        beyond = f"{(_med(h) - base) / (r / 1000):.1f}" if r > 0 else "n/a"
        lines.append(f"| {label} | {link_label(r)} | {_med(h):.3f} | {min(h):.3f} | "
                     f"{max(h):.3f} | {_med(stmts[(label, r)]):.0f} | "
                     f"{_med(conns[(label, r)]):.0f} | {beyond} | {_med(walls[(label, r)]):.3f} |")
    lines += ["", "held: seconds during which at least one of the run's sessions was open "
              "through the proxy (accept to close), i.e. compute an empty run costs; the "
              "queues' apps are generated, one no-op `@task` per queue; statements: Query + "
              "Execute messages sent (one simple Query may carry several statements: "
              "drainer's empty run sends its three, run_start, the first claim and "
              "finish_run, in one)."]
    return lines
