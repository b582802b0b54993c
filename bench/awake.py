"""``python -m bench.awake``: how long each way of waiting keeps a suspendable compute awake.

A sampler of pg_stat_activity every 0.5 s (drainer audit's :func:`sample_activity` and
:func:`judge`, the rules of 'Postgres as a job queue') watches one database for a window
while a fixed workload runs: burst A of triggered jobs, a plain-SQL insert with no
trigger, burst B of triggered jobs, each from a short-lived producer (connect, one
transaction, commit, fire the trigger, close). The same workload runs for each contender,
each in a database of its own (``<database>_<contender>``), so nothing else on the server counts:

- ``floor``: the producers alone, nothing draining (the least any drainer can cost);
- ``always``: ``drainer schedule --interval 3 x idle`` (today's behaviour, no trigger);
- ``known-work``: ``drainer schedule --wake-policy known-work --listen`` (ticks every
  idle/2, --max-sleep 0.6 x window);
- ``worker``: ``drainer worker`` (LISTEN/NOTIFY, default fallback poll).

Each contender is started ``--warmup`` seconds before the window (default: idle timeout +
10 s), so its one start-up drain is not counted (a process starts once, not per burst).
After the window, job latencies (``finished_at - created_at``) are read from the table.

``--workload retry`` measures ``--retry-linger``: one triggered burst of 20 jobs, 5 of which
fail their first attempt with a short retry (``bench/retry_app.py``, ``--retry-wait``, 5 s by
default), drained by ``known-work`` (retry_linger off: the retry is left to the next wake,
which the policy holds until the idle timeout after the last drain, to group wakes) and
``known-work-linger`` (the same with ``--retry-linger``: the drain waits for the retry on its
open connection). Their ``--max-sleep`` is 10 x window, so no safety-net drain falls in it.
The table's ``drains`` are the run reports printed in the window and the drainer sessions
the sampler saw (``sessions seen``).

``--workload recurring`` replaces the producers with a recurring definition
(``bench/recurring_app.py``: ``* * * * *``, a no-op) and nothing else: with ``known-work``
the compute should wake for its occurrences only, awake = occurrences x (drain + idle
timeout), which the verdict compares with what the sampler saw.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

import psycopg
from psycopg import sql

from bench.core import ROOT, ensure_database, log
from drainer.audit import AuditResult, SessionFilter, judge, sample_activity
from drainer.audit.html import write_html
from drainer.migrate import install_notify_trigger, migrate
from drainer.settings import load_settings
from drainer.trigger import transaction
from drainer.waking import IdleTimeout

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
SCHEMA = "bench_awake"
QUEUE = "bench"
TOKEN = "bench-awake-token"
CONTENDERS = ("floor", "always", "known-work", "worker")
#: known-work with --retry-linger (the retry workload's second contender; not in the default).
EXTRA_CONTENDERS = ("known-work-linger",)
#: The retry workload's contenders when --only is not given.
RETRY_CONTENDERS = ("known-work", "known-work-linger")

#: The workload, as fractions of the window: (name, at, jobs, triggered).
WORKLOAD = (("A", 20 / 300, 20, True), ("P", 80 / 300, 5, False), ("B", 150 / 300, 20, True))
#: --workload retry: one triggered burst; the jobs with n < RETRY_FAILING fail once.
RETRY_WORKLOAD = (("R", 0.1, 20, True),)
RETRY_FAILING = 5


@dataclass
class Result:
    contender: str
    command: str
    database: str
    window_s: float
    awake_s: float
    samples: int
    jobs: int
    done: int
    triggered_median_s: float | None
    triggered_max_s: float | None
    untriggered_max_s: float | None
    drains_in_window: int
    max_sleep_s: float | None = None
    workload: str = "bursts"
    drain_s: list[float] = field(default_factory=list)
    occurrences_done: int = 0
    notes: list[str] = field(default_factory=list)
    #: drainer sessions (application_name drainer, a drain's connection) the sampler saw in
    #: the window: the sampled timeline's count of drains
    sessions_seen: int = 0
    #: connections that opened and closed between two samples (the database's session
    #: counter saw them; a short drain's connection, or the producer's)
    unseen_connections: int = 0
    retry_linger_s: float = 0.0
    lingered_s: float = 0.0
    #: when each run report of the window was printed, seconds from the window's start
    drain_at_s: list[float] = field(default_factory=list)
    #: awake seconds by the idle rule from the run reports' own connected intervals (and the
    #: producers' instants): a check on the sampled figure, which misses the statements a
    #: session sends just before it closes between two samples
    awake_reports_s: float = 0.0
    #: the sampled timeline: every instant the audit counted as activity, seconds from the
    #: window's start (awake = these instants, each followed by the idle timeout)
    activity_at_s: list[float] = field(default_factory=list)


#: Each contender's audit of its window, for --html.
AUDITS: dict[str, AuditResult] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def max_sleep_of(workload: str, window: float) -> float:
    """known-work's --max-sleep: 0.6 x window; past the window (and its warm-up) for the
    retry workload, so that no safety-net drain falls in the window: the drains counted are
    those the burst and its retries cost."""
    return 10 * window if workload == "retry" else 0.6 * window


def command_of(contender: str, idle: float, window: float, port: int,
               workload: str = "bursts") -> list[str] | None:
    if contender == "floor":
        return None
    if contender == "always":
        return ["schedule", "--interval", f"{3 * idle:g}"]
    if contender in ("known-work", "known-work-linger"):
        return ["schedule", "--wake-policy", "known-work", "--interval", f"{idle / 2:g}",
                "--max-sleep", f"{max_sleep_of(workload, window):g}",
                "--listen", f"127.0.0.1:{port}"]
    if contender == "worker":
        return ["worker"]
    raise ValueError(contender)


def prepare(url: str, worker: bool) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
        migrate(conn, SCHEMA, "jobs")
        if worker:
            install_notify_trigger(conn, SCHEMA, "jobs")


def produce(url: str, trigger_url: str, name: str, jobs: int, triggered: bool,
            failing: int = 0) -> None:
    """A short-lived producer: connect, one transaction, commit, (fire the trigger,) close.
    The first ``failing`` jobs say ``fail`` (the retry workload's handler fails them once)."""
    settings = load_settings(database_url=url, schema_name=SCHEMA, trigger_url=trigger_url,
                             trigger_token=TOKEN)
    payloads = [{"burst": name, "n": i, "triggered": triggered,
                 **({"fail": True} if i < failing else {})} for i in range(jobs)]
    with psycopg.connect(url, autocommit=True, application_name="bench-producer") as conn:
        if triggered:
            with transaction(conn, settings, timeout=1.0) as tx:
                for p in payloads:
                    tx.enqueue(QUEUE, p)
        else:  # plain SQL from "another language": nothing tells drainer
            with conn.transaction():
                for p in payloads:
                    conn.execute(sql.SQL("INSERT INTO {} (queue, payload) VALUES (%s, %s)")
                                 .format(sql.Identifier(SCHEMA, "jobs")),
                                 [QUEUE, json.dumps(p)])


APPS = {"bursts": "bench.noop_app", "recurring": "bench.recurring_app",
        "retry": "bench.retry_app"}


def run_contender(contender: str, server: str, database: str, *, window: float, idle: float,
                  warmup: float, workload: str = "bursts", retry_wait: float = 5.0,
                  linger: float = 10.0) -> Result:
    dbname = f"{database}_{contender.replace('-', '_')}"
    url = ensure_database(server, dbname)
    prepare(url, worker=contender == "worker")
    port = free_port()
    args = command_of(contender, idle, window, port, workload)
    env = {**{k: v for k, v in os.environ.items()
              if not k.startswith("DRAINER_") and k != "DATABASE_URL"},
           "DRAINER_DATABASE_URL": url, "DRAINER_SCHEMA": SCHEMA,
           "DRAINER_APP": APPS[workload],
           "DRAINER_IDLE_TIMEOUT": f"{idle:g}", "DRAINER_TRIGGER_TOKEN": TOKEN,
           "DRAINER_LOG_FORMAT": "json", "PYTHONPATH": str(ROOT),
           "BENCH_RETRY_WAIT": f"{retry_wait:g}"}
    retry_linger = linger if contender == "known-work-linger" else 0.0
    env["DRAINER_RETRY_LINGER"] = f"{retry_linger:g}"
    lingered: list[tuple[float, float]] = []  # (when, lingered_s) of each run report
    proc: subprocess.Popen[str] | None = None
    reports: list[float] = []
    drains: list[tuple[float, float]] = []  # (when, connected_s) of each run report
    stderr_tail: list[str] = []
    if args is not None:
        proc = subprocess.Popen([sys.executable, "-m", "drainer", *args], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def read_out() -> None:
            assert proc is not None and proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("{"):
                    reports.append(time.time())
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        report = json.loads(line)
                        drains.append((reports[-1], float(report["connected_s"])))
                        lingered.append((reports[-1], float(report.get("lingered_s") or 0)))

        def read_err() -> None:
            assert proc is not None and proc.stderr is not None
            for line in proc.stderr:
                stderr_tail.append(line)
                del stderr_tail[:-50]

        threading.Thread(target=read_out, daemon=True).start()
        threading.Thread(target=read_err, daemon=True).start()
    log(f"{contender}: {'drainer ' + ' '.join(args) if args else 'no drainer'} on {dbname}; "
        f"warm-up {warmup:g} s, window {window:g} s")
    time.sleep(warmup)
    if proc is not None and proc.poll() is not None:
        raise SystemExit(f"{contender} exited early:\n{''.join(stderr_tail)}")

    sampler_settings = load_settings(database_url=server, connect_retries=0)
    trigger_url = f"http://127.0.0.1:{port}/drain"
    stop = threading.Event()
    box: dict[str, Any] = {}

    def sample() -> None:
        box["activity"] = sample_activity(sampler_settings, duration=window,
                                          filters=SessionFilter(databases=[dbname]), stop=stop)

    sampler = threading.Thread(target=sample, daemon=True)
    start = time.time()
    sampler.start()
    producers: list[threading.Thread] = []
    bursts = {"bursts": WORKLOAD, "retry": RETRY_WORKLOAD}.get(workload, ())
    for name, at, jobs, triggered in bursts:
        delay = start + at * window - time.time()
        if delay > 0:
            time.sleep(delay)
        t = threading.Thread(target=produce, args=(url, trigger_url, name, jobs, triggered,
                                                   RETRY_FAILING if workload == "retry" else 0))
        t.start()
        producers.append(t)
    for t in producers:
        t.join()
    sampler.join(window + 30)
    end = time.time()
    result = judge(box["activity"], IdleTimeout(idle, "--idle-timeout"))
    AUDITS[contender] = result
    if proc is not None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT (payload->>'triggered')::bool, status, "
            "extract(epoch FROM finished_at - created_at) FROM {} "
            "WHERE recurring_key IS NULL").format(sql.Identifier(SCHEMA, "jobs"))).fetchall()
        occurrences = conn.execute(sql.SQL(
            "SELECT count(*) FROM {} WHERE recurring_key IS NOT NULL AND status = 'done' "
            "AND finished_at BETWEEN to_timestamp(%s) AND to_timestamp(%s)").format(
            sql.Identifier(SCHEMA, "jobs")), [start, end]).fetchone()
    trig = [float(r[2]) for r in rows if r[0] and r[1] == "done"]
    untrig = [float(r[2]) for r in rows if not r[0] and r[1] == "done"]
    notes: list[str] = []
    if result.counters != "on":
        notes.append(f"session counters {result.counters}")
    return Result(
        contender=contender,
        command="(producers only)" if args is None else "drainer " + " ".join(
            a if not a.startswith("127.0.0.1:") else "127.0.0.1:PORT" for a in args),
        database=dbname, window_s=round(result.duration_s, 1), awake_s=round(result.awake_s, 1),
        samples=result.samples, jobs=len(rows), done=sum(1 for r in rows if r[1] == "done"),
        triggered_median_s=round(statistics.median(trig), 2) if trig else None,
        triggered_max_s=round(max(trig), 2) if trig else None,
        untriggered_max_s=round(max(untrig), 2) if untrig else None,
        drains_in_window=sum(1 for t in reports if start <= t <= end),
        max_sleep_s=max_sleep_of(workload, window) if contender.startswith("known-work")
        else None, workload=workload,
        drain_s=[d for t, d in drains if start <= t <= end],
        occurrences_done=int(occurrences[0]) if occurrences else 0, notes=notes,
        sessions_seen=sum(1 for se in result.sessions
                          if se.application_name == "drainer"),
        unseen_connections=sum(u.connections for u in result.unseen_connections),
        retry_linger_s=retry_linger,
        lingered_s=round(sum(w for t, w in lingered if start <= t <= end), 3),
        drain_at_s=[round(t - start, 1) for t in reports if start <= t <= end],
        awake_reports_s=round(awake_by_idle_rule(
            [(t - d, t) for t, d in drains if start <= t <= end]
            + [(start + at * window,) * 2 for _n, at, _j, _t in bursts], idle, start, end), 1),
        activity_at_s=sorted({round(datetime.fromisoformat(a).timestamp() - start, 1)
                              for a in result.activity_times}))


def table(results: list[Result], idle: float, window: float) -> str:
    floor = next((r.awake_s for r in results if r.contender == "floor"), None)
    out = ["| contender | command | awake s | awake % of window | above floor | jobs done | "
           "triggered jobs: median / max latency | untriggered: max latency | drains in "
           "window |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        above = ("—" if floor is None or r.contender == "floor" else
                 f"+{r.awake_s - floor:.1f} s ({(r.awake_s - floor) / floor * 100:+.0f}%)"
                 if floor else "n/a")
        lat = ("—" if r.triggered_median_s is None else
               f"{r.triggered_median_s:.2f} s / {r.triggered_max_s:.2f} s")
        unt = "—" if r.untriggered_max_s is None else f"{r.untriggered_max_s:.1f} s"
        drains = "—" if r.contender in {"floor", "worker"} else str(r.drains_in_window)
        out.append(f"| {r.contender} | `{r.command}` | {r.awake_s:.1f} | "
                   f"{r.awake_s / r.window_s * 100:.0f}% | {above} | {r.done}/{r.jobs} | {lat} | "
                   f"{unt} | {drains} |")
    return "\n".join(out)


def awake_by_idle_rule(intervals: list[tuple[float, float]], idle: float, start: float,
                       end: float) -> float:
    """Seconds of [start, end] covered by [a, b + idle] over the connected intervals."""
    total, cur = 0.0, None
    for a, b in sorted((max(a, start), min(b + idle, end)) for a, b in intervals):
        if b <= a:
            continue
        if cur is not None and a <= cur[1]:
            cur = (cur[0], max(cur[1], b))
            continue
        if cur is not None:
            total += cur[1] - cur[0]
        cur = (a, b)
    return total + (cur[1] - cur[0] if cur is not None else 0.0)


def retry_table(results: list[Result]) -> str:
    """The retry workload: awake time and drains, from the sampled timeline."""
    out = ["| contender | retry_linger | awake s (sampled) | awake s (idle rule on the "
           "reports' connected intervals) | drains (run reports) | drain "
           "sessions seen by the sampler | connections between samples (counter) | "
           "connected s | lingered s | jobs done | reports at (s into the window) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        out.append(f"| {r.contender} | {r.retry_linger_s:g} s | {r.awake_s:.1f} | "
                   f"{r.awake_reports_s:.1f} | "
                   f"{r.drains_in_window} | {r.sessions_seen} | {r.unseen_connections} | "
                   f"{sum(r.drain_s):.2f} | "
                   f"{r.lingered_s:.2f} | {r.done}/{r.jobs} | "
                   f"{', '.join(f'{t:g}' for t in r.drain_at_s)} |")
    return "\n".join(out)


def recurring_verdict(results: list[Result], idle: float) -> list[str]:
    """awake = occurrences x (drain + idle timeout): what known-work should cost."""
    lines: list[str] = []
    for r in results:
        if r.contender != "known-work":
            continue
        drain = statistics.mean(r.drain_s) if r.drain_s else 0.0
        expected = r.occurrences_done * (drain + idle)
        off = (r.awake_s - expected) / expected if expected else float("inf")
        met = abs(off) <= 0.10 and r.drains_in_window == r.occurrences_done
        lines.append(
            f"known-work: {r.occurrences_done} occurrences done in the window, "
            f"{r.drains_in_window} drains; awake {r.awake_s:.1f} s vs occurrences x (drain "
            f"{drain:.3f} s + idle {idle:g} s) = {expected:.1f} s ({off * 100:+.1f}%; target "
            f"within 10% and drains = occurrences): {'met' if met else 'NOT met'}")
    return lines


def verdict(results: list[Result]) -> list[str]:
    by = {r.contender: r for r in results}
    lines: list[str] = []
    kw, floor = by.get("known-work"), by.get("floor")
    if kw is not None and floor is not None:
        extra = (kw.awake_s - floor.awake_s) / floor.awake_s if floor.awake_s else float("inf")
        lines.append(f"known-work above the floor: {extra * 100:+.1f}% (target at most +10%): "
                     f"{'met' if extra <= 0.10 else 'NOT met'}")
    if kw is not None:
        lines.append(f"known-work jobs done: {kw.done}/{kw.jobs}: "
                     f"{'met' if kw.done == kw.jobs else 'NOT met'}")
        med = kw.triggered_median_s
        lines.append(f"known-work triggered median latency {med} s (target under 2 s): "
                     f"{'met' if med is not None and med < 2 else 'NOT met'}")
        um, ms = kw.untriggered_max_s, kw.max_sleep_s
        lines.append(f"known-work untriggered max latency {um} s (target within --max-sleep "
                     f"{ms:g} s): {'met' if um is not None and ms and um <= ms else 'NOT met'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.awake", description=__doc__.split("\n")[0])
    p.add_argument("--server", default=os.environ.get("BENCH_SERVER_URL", DEFAULT_SERVER),
                   help="A URL of the server (any database; the sampler connects there).")
    p.add_argument("--database", default="drainer_awake",
                   help="Prefix of the databases created, one per contender "
                   "[default: drainer_awake].")
    p.add_argument("--window", type=float, default=300.0, help="Seconds sampled [300].")
    p.add_argument("--idle-timeout", type=float, default=20.0, help="Seconds [20].")
    p.add_argument("--warmup", type=float, default=None,
                   help="Seconds a contender runs before the window [idle timeout + 10].")
    p.add_argument("--only", default=",".join(CONTENDERS),
                   help=f"Comma-separated contenders [{','.join(CONTENDERS)}].")
    p.add_argument("--parallel", action="store_true",
                   help="Run the contenders at the same time (each has its own database; "
                   "the machine's CPU is shared).")
    p.add_argument("--json", metavar="PATH", help="Also write the results as JSON here.")
    p.add_argument("--html", metavar="PATH", help="Also write each contender's awake "
                   "timeline here (one self-contained page, as drainer audit --html).")
    p.add_argument("--workload", choices=("bursts", "recurring", "retry"), default="bursts",
                   help="bursts of enqueued jobs [default], a recurring definition every "
                   "minute and nothing else (bench/recurring_app.py), or one burst of 20 "
                   "jobs, 5 failing once with a short retry (bench/retry_app.py: "
                   "known-work with and without --retry-linger).")
    p.add_argument("--retry-wait", type=float, default=5.0,
                   help="--workload retry: seconds from the failure to the retry [5].")
    p.add_argument("--linger", type=float, default=10.0,
                   help="--workload retry: known-work-linger's --retry-linger [10].")
    a = p.parse_args(argv)
    if a.workload == "retry" and a.only == ",".join(CONTENDERS):
        a.only = ",".join(RETRY_CONTENDERS)
    # producers fire the trigger whoever listens; with no listener that POST is refused at
    # once (the job stays queued): expected here, not worth a warning per burst
    logging.getLogger("drainer.trigger").setLevel(logging.ERROR)
    only = [c.strip() for c in a.only.split(",") if c.strip()]
    known = CONTENDERS + EXTRA_CONTENDERS
    bad = [c for c in only if c not in known]
    if bad:
        p.error(f"unknown contender(s) {', '.join(bad)} (choose from {', '.join(known)})")
    warmup = a.warmup if a.warmup is not None else a.idle_timeout + 10
    kw = {"window": a.window, "idle": a.idle_timeout, "warmup": warmup,
          "workload": a.workload, "retry_wait": a.retry_wait, "linger": a.linger}
    started = datetime.now(timezone.utc)
    if a.parallel:
        found: dict[str, Result] = {}

        def one(c: str) -> None:
            found[c] = run_contender(c, a.server, a.database, **kw)

        threads = [threading.Thread(target=one, args=(c,)) for c in only]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        missing = [c for c in only if c not in found]
        if missing:
            sys.stderr.write(f"contender(s) failed: {', '.join(missing)}\n")
            return 1
        results = [found[c] for c in only]
    else:
        results = [run_contender(c, a.server, a.database, **kw) for c in only]
    workload = ", ".join(f"{n} at {at * a.window:.0f} s: {j} jobs "
                         f"{'+ trigger' if t else 'plain SQL, no trigger'}"
                         for n, at, j, t in WORKLOAD)
    if a.workload == "recurring":
        workload = "a recurring definition '* * * * *' (a no-op), no producers"
    if a.workload == "retry":
        workload = (f"R at {RETRY_WORKLOAD[0][1] * a.window:.0f} s: {RETRY_WORKLOAD[0][2]} "
                    f"jobs + trigger, {RETRY_FAILING} failing once, retried "
                    f"{a.retry_wait:g} s later")
    print(f"### Awake time: idle timeout {a.idle_timeout:g} s, window {a.window:g} s, "
          f"sampled every 0.5 s ({started:%Y-%m-%d %H:%M} UTC)\n")
    print(f"Workload: {workload}.\n")
    print(retry_table(results) if a.workload == "retry"
          else table(results, a.idle_timeout, a.window))
    print()
    lines = (recurring_verdict(results, a.idle_timeout) if a.workload == "recurring"
             else [] if a.workload == "retry" else verdict(results))
    for line in lines:
        print(f"- {line}")
    if a.html:
        write_html(a.html, [(f"{r.contender}: {r.command}", AUDITS[r.contender])
                            for r in results if r.contender in AUDITS],
                   title=f"bench.awake: idle timeout {a.idle_timeout:g} s, window "
                   f"{a.window:g} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"started_at": started.isoformat(), "args": vars(a),
                       "results": [asdict(r) for r in results]}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
