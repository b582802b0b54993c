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
  idle/2, --max-sleep 0.6 x window; past the window for the retry and long workloads);
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

Through a compute that really suspends (the default; ``--direct`` turns it off): each
contender's drainer and producers connect through a suspend simulator of their own
(bench/suspend.py: idle timeout = ``--idle-timeout``, ``--cold-start`` 1.5 s), which cuts
every connection after T seconds without activity and holds a connection that wakes it for
the cold start. The sampler still watches pg_stat_activity on the server, directly, so
each row has both: the simulator's awake seconds, resumes and wasted resumes (a resume
after which no producer and no handler ran: bench/awake_suspend.py), and the sampler's
estimate. ``serve`` is ``drainer serve`` (the producers' trigger is its POST /drain).

``--workload hard``: bursts of 200 triggered jobs (10% failing once, some delayed), a
plain-SQL insert, and a recurring definition (``*/2 * * * *``) beside them
(bench/hard_app.py); each row gives the latency after due of every job (``finished_at -
max(run_at, created_at)``: median / p95 / max) and of the retries, and the table's head
the least possible awake time (bench/awake_suspend.py). ``--workload long``: 10 jobs whose
handlers wait 60 s without touching the database, run at once (``--concurrency 10``).

``procrastinate``, ``pgqueuer``, ``chancy``, ``dbos`` (not in the default list; ``--only``):
the peers' always-on workers (bench/peer_awake.py, in bench/.peers-venv, installed on first
use), each in a database of its own, fed by the same producers with their own inserts
(bench/awake_peers.py: plain inserts whose triggers notify procrastinate and pgqueuer,
chancy's inserts and NOTIFY, DBOS's SQL ``enqueue_workflow``), through the simulator too;
they have no recurring definition.
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
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import awake_peers
from bench.awake_suspend import (
    HARD_CRON,
    HARD_WORKLOAD,
    LONG_CONCURRENCY,
    LONG_WORKLOAD,
    PRODUCER,
    Burst,
    Latency,
    due_instants,
    least_awake,
    read_attempts,
    union_seconds,
    wasted,
)
from bench.contenders import ensure_peers
from bench.core import ROOT, ensure_database, log
from bench.link import target_of, via
from bench.suspend import Period, SuspendSimulator
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
CONTENDERS = ("floor", "always", "known-work", "serve", "worker")
#: known-work with --retry-linger (the retry workload's second contender; not in the default).
EXTRA_CONTENDERS = ("known-work-linger",)
#: The retry workload's contenders when --only is not given.
RETRY_CONTENDERS = ("known-work", "known-work-linger")
#: The long workload's contenders when --only is not given.
LONG_CONTENDERS = ("known-work", "serve")

#: The workload, as fractions of the window.
WORKLOAD = (Burst("A", 20 / 300, 20, True), Burst("P", 80 / 300, 5, False),
            Burst("B", 150 / 300, 20, True))
#: --workload retry: one triggered burst; the jobs with n < RETRY_FAILING fail once.
RETRY_FAILING = 5
RETRY_WORKLOAD = (Burst("R", 0.1, 20, True, failing=RETRY_FAILING),)
BURSTS = {"bursts": WORKLOAD, "retry": RETRY_WORKLOAD, "hard": HARD_WORKLOAD,
          "long": LONG_WORKLOAD}
#: Seconds the simulator's compute takes to resume [--cold-start].
COLD_START_S = 1.5


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
    #: through the suspend simulator (else None): its awake seconds in the window (from the
    #: end of each cold start to its suspend), resumes, and those nothing came of
    sim_awake_s: float | None = None
    resumes: int = 0
    wasted_resumes: int = 0
    suspends: int = 0
    cold_start_s: float = 0.0
    #: resumes by the application_name of the connection that caused each
    resumed_by: dict[str, int] = field(default_factory=dict)
    #: finished_at - max(run_at, created_at), seconds: every job done; retried jobs alone
    latency: Latency = field(default_factory=lambda: Latency(None, None, None))
    retry_latency: Latency = field(default_factory=lambda: Latency(None, None, None))
    #: the retries that came due while the compute was up (through the simulator)
    retry_awake_latency: Latency = field(default_factory=lambda: Latency(None, None, None))
    running_left: int = 0  # jobs still 'running' when the window ended
    runs_failed: int = 0  # log lines of a failed run (schedule) or a lost connection
    #: the producers' sessions through the simulator: (opened, closed), time.time()
    producer_sessions: list[tuple[float, float]] = field(default_factory=list)
    started_at: float = 0.0  # the window's start, time.time()
    #: through the simulator: each awake period (seconds from the window's start: resumed,
    #: ready, suspended, its cause) and the sessions forwarded in it (application_name,
    #: opened, closed, statements, cut), to explain each awake interval (--json)
    periods: list[dict[str, Any]] = field(default_factory=list)
    #: the contender's stderr (its log), kept for --json readers
    log_path: str = ""


#: Each contender's audit of its window, for --html.
AUDITS: dict[str, AuditResult] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def max_sleep_of(workload: str, window: float) -> float:
    """known-work's --max-sleep: 0.6 x window; past the window (and its warm-up) for the
    retry and long workloads, so that no safety-net drain falls in the window: the drains
    counted are those the workload costs (the long workload's last run ends at about 73 s
    of its 420 s window: 0.6 x window later, at 325 s, a safety-net drain that finds nothing
    would resume the compute once more, drain + T that serve, which has no safety net,
    does not pay)."""
    return 10 * window if workload in ("retry", "long") else 0.6 * window


def command_of(contender: str, idle: float, window: float, port: int,
               workload: str = "bursts") -> list[str] | None:
    if contender == "floor":
        return None
    more = ["--concurrency", str(LONG_CONCURRENCY)] if workload == "long" else []
    if contender == "always":
        return ["schedule", "--interval", f"{3 * idle:g}", *more]
    if contender in ("known-work", "known-work-linger"):
        return ["schedule", "--wake-policy", "known-work", "--interval", f"{idle / 2:g}",
                "--max-sleep", f"{max_sleep_of(workload, window):g}",
                "--listen", f"127.0.0.1:{port}", *more]
    if contender == "serve":
        return ["serve", "--port", str(port), *more]
    if contender == "worker":
        return ["worker", *more]
    raise ValueError(contender)


def bursts_of(workload: str, handler_s: float) -> tuple[Burst, ...]:
    """The workload's bursts; the long workload's handlers wait ``handler_s`` seconds."""
    if workload == "long":
        return tuple(replace(b, sleep=handler_s) for b in LONG_WORKLOAD)
    return BURSTS.get(workload, ())


def prepare(url: str, worker: bool) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
        migrate(conn, SCHEMA, "jobs")
        if worker:
            install_notify_trigger(conn, SCHEMA, "jobs")


def produce(url: str, trigger_url: str, burst: Burst, window: float,
            peer: str | None = None, retry_wait: float = 5.0) -> None:
    """A short-lived producer: connect, one transaction, commit, (fire the trigger,) close.
    The first ``burst.failing`` jobs say ``fail`` (the handler fails them once), the last
    ``burst.delayed`` run ``burst.delay`` x window later; each payload says when it is due."""
    settings = load_settings(database_url=url, schema_name=SCHEMA, trigger_url=trigger_url,
                             trigger_token=TOKEN)
    now = time.time()
    later = now + burst.delay * window
    delayed_from = burst.jobs - burst.delayed
    payloads: list[dict[str, Any]] = [{"burst": burst.name, "n": i, "triggered": burst.triggered,
                 "due": later if i >= delayed_from else now,
                 **({"fail": True} if i < burst.failing else {}),
                 **({"sleep": burst.sleep} if burst.sleep else {})}
                for i in range(burst.jobs)]
    now_jobs, later_jobs = payloads[:delayed_from], payloads[delayed_from:]
    run_at = datetime.fromtimestamp(later, timezone.utc)
    with psycopg.connect(url, autocommit=True, application_name=PRODUCER) as conn:
        if peer is not None:
            awake_peers.insert(conn, peer, payloads, retry_wait)
        elif burst.triggered:
            with transaction(conn, settings, timeout=1.0) as tx:
                if now_jobs:
                    tx.enqueue_many(now_jobs, queue=QUEUE)
                if later_jobs:
                    tx.enqueue_many(later_jobs, queue=QUEUE, run_at=run_at)
        else:  # plain SQL from "another language": nothing tells drainer
            insert = sql.SQL("INSERT INTO {} (queue, payload, run_at) VALUES (%s, %s, %s)"
                             ).format(sql.Identifier(SCHEMA, "jobs"))
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(insert, [(QUEUE, json.dumps(p), datetime.fromtimestamp(
                    p["due"], timezone.utc)) for p in payloads])


APPS = {"bursts": "bench.noop_app", "recurring": "bench.recurring_app",
        "retry": "bench.retry_app", "hard": "bench.hard_app", "long": "bench.hard_app"}


@dataclass
class Outcomes:
    """What a contender did with the workload, read after its window."""

    jobs: int
    done: int
    triggered_s: list[float]  # finished_at - created_at, triggered jobs done
    untriggered_s: list[float]
    after_due_s: list[float]  # finished_at - max(run_at, created_at), every job done
    retried: list[tuple[float, float]]  # (due, latency after due) of the retries done
    finished: list[float]  # when each job (or handler call) finished, time.time()
    occurrences: int = 0
    running_left: int = 0


def drainer_outcomes(url: str, start: float, end: float, running_left: int) -> Outcomes:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT (payload->>'triggered')::bool, status, "
            "extract(epoch FROM finished_at - created_at), "
            "extract(epoch FROM finished_at - greatest(run_at, created_at)), attempts, "
            "extract(epoch FROM finished_at), extract(epoch FROM run_at) FROM {} "
            "WHERE recurring_key IS NULL").format(sql.Identifier(SCHEMA, "jobs"))).fetchall()
        occurrences = conn.execute(sql.SQL(
            "SELECT extract(epoch FROM finished_at - greatest(run_at, created_at)), "
            "extract(epoch FROM finished_at) FROM {} "
            "WHERE recurring_key IS NOT NULL AND status = 'done' "
            "AND finished_at BETWEEN to_timestamp(%s) AND to_timestamp(%s)").format(
            sql.Identifier(SCHEMA, "jobs")), [start, end]).fetchall()
    done = [r for r in rows if r[1] == "done"]
    return Outcomes(
        jobs=len(rows), done=len(done),
        triggered_s=[float(r[2]) for r in done if r[0]],
        untriggered_s=[float(r[2]) for r in done if not r[0]],
        after_due_s=[float(r[3]) for r in done] + [float(o[0]) for o in occurrences],
        # run_at is the retry's due time once the first attempt failed
        retried=[(float(r[6]), float(r[3])) for r in done if int(r[4]) > 1],
        finished=[float(r[5]) for r in done] + [float(o[1]) for o in occurrences],
        occurrences=len(occurrences), running_left=running_left)


def peer_outcomes(attempt_log: Path, bursts: tuple[Burst, ...], retry_wait: float) -> Outcomes:
    done, after_due, retried, finished = awake_peers.outcomes(attempt_log, retry_wait)
    return Outcomes(jobs=sum(b.jobs for b in bursts), done=done, triggered_s=[],
                    untriggered_s=[], after_due_s=after_due, retried=retried,
                    finished=finished)


def run_contender(contender: str, server: str, database: str, *, window: float, idle: float,
                  warmup: float, workload: str = "bursts", retry_wait: float = 5.0,
                  linger: float = 10.0, cold_start: float | None = COLD_START_S,
                  handler_s: float = LONG_WORKLOAD[0].sleep) -> Result:
    """One contender's window; through a suspend simulator unless ``cold_start`` is None."""
    dbname = f"{database}_{contender.replace('-', '_')}"
    url = ensure_database(server, dbname)
    if contender in awake_peers.PEERS:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(dbname)))
        url = ensure_database(server, dbname)
        awake_peers.install(contender, url)
    else:
        prepare(url, worker=contender == "worker")
    sim: SuspendSimulator | None = None
    run_url = url
    if cold_start is not None:
        sim = SuspendSimulator(idle, cold_start, target_of(server))
        sim.start()
        run_url = via(url, sim)
    try:
        return _window(contender, server, dbname, url, run_url, sim, window=window, idle=idle,
                       warmup=warmup, workload=workload, retry_wait=retry_wait,
                       linger=linger, handler_s=handler_s)
    finally:
        if sim is not None:
            sim.stop()


def _window(contender: str, server: str, dbname: str, url: str, run_url: str,
            sim: SuspendSimulator | None, *, window: float, idle: float, warmup: float,
            workload: str, retry_wait: float, linger: float, handler_s: float) -> Result:
    """The contender's window: ``run_url`` is what its drainer and producers connect to,
    ``url`` its database directly (setup and results), ``server`` the sampler's."""
    port = free_port()
    peer = contender in awake_peers.PEERS
    args = None if peer else command_of(contender, idle, window, port, workload)
    attempt_log = Path(tempfile.mkdtemp(prefix="bench-awake-")) / "attempts.log"
    env = {**{k: v for k, v in os.environ.items()
              if not k.startswith("DRAINER_") and k != "DATABASE_URL"},
           "DRAINER_DATABASE_URL": run_url, "DRAINER_SCHEMA": SCHEMA,
           "DRAINER_APP": APPS[workload],
           "DRAINER_IDLE_TIMEOUT": f"{idle:g}", "DRAINER_TRIGGER_TOKEN": TOKEN,
           "DRAINER_LOG_FORMAT": "json", "PYTHONPATH": str(ROOT),
           "BENCH_RETRY_WAIT": f"{retry_wait:g}", "BENCH_ATTEMPT_LOG": str(attempt_log)}
    if workload == "hard":
        env["BENCH_CRON"] = HARD_CRON
    retry_linger = linger if contender == "known-work-linger" else 0.0
    env["DRAINER_RETRY_LINGER"] = f"{retry_linger:g}"
    lingered: list[tuple[float, float]] = []  # (when, lingered_s) of each run report
    proc: subprocess.Popen[str] | None = None
    reports: list[float] = []
    drains: list[tuple[float, float]] = []  # (when, connected_s) of each run report
    stderr_tail: list[str] = []
    stderr_log = attempt_log.with_name("stderr.log")
    failures: list[float] = []  # when a run failed or lost its connection
    argv = awake_peers.command(contender, run_url) if peer else \
        None if args is None else [sys.executable, "-m", "drainer", *args]
    if argv is not None:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

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
            with stderr_log.open("w") as keep:
                for line in proc.stderr:
                    keep.write(line)
                    if "run failed" in line or "connection lost" in line:
                        failures.append(time.time())
                    stderr_tail.append(line)
                    del stderr_tail[:-50]

        threading.Thread(target=read_out, daemon=True).start()
        threading.Thread(target=read_err, daemon=True).start()
    what = (f"{contender} worker" if peer else "drainer " + " ".join(args) if args
            else "no drainer")
    log(f"{contender}: {what} on {dbname}"
        f"{' through the suspend simulator' if sim else ''}; warm-up {warmup:g} s, window "
        f"{window:g} s")
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
    bursts = bursts_of(workload, handler_s)
    for burst in bursts:
        delay = start + burst.at * window - time.time()
        if delay > 0:
            time.sleep(delay)
        t = threading.Thread(target=produce, args=(run_url, trigger_url, burst, window,
                                                   contender if peer else None, retry_wait))
        t.start()
        producers.append(t)
    for t in producers:
        t.join()
    sampler.join(window + 30)
    end = time.time()
    result = judge(box["activity"], IdleTimeout(idle, "--idle-timeout"))
    AUDITS[contender] = result
    running_left = 0
    if not peer:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE status = 'running'")
                               .format(sql.Identifier(SCHEMA, "jobs"))).fetchone()
            running_left = int(row[0]) if row else 0
    exited = None if proc is None else proc.poll()
    if proc is not None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    got = (peer_outcomes(attempt_log, bursts, retry_wait) if peer
           else drainer_outcomes(url, start, end, running_left))
    trig, untrig, retried = got.triggered_s, got.untriggered_s, got.retried
    notes: list[str] = []
    if exited is not None:
        last = next((line.strip() for line in reversed(stderr_tail) if line.strip()), "")
        notes.append(f"exited during the window (code {exited}): {last[-200:]}")
    if result.counters != "on":
        notes.append(f"session counters {result.counters}")
    out = Result(
        contender=contender,
        command=f"{contender} worker (bench/peer_awake.py)" if peer else
        "(producers only)" if args is None else "drainer " + " ".join(
            "127.0.0.1:PORT" if a.startswith("127.0.0.1:") else
            "PORT" if i and args[i - 1] == "--port" else a for i, a in enumerate(args)),
        database=dbname, window_s=round(result.duration_s, 1), awake_s=round(result.awake_s, 1),
        samples=result.samples, jobs=got.jobs, done=got.done,
        triggered_median_s=round(statistics.median(trig), 2) if trig else None,
        triggered_max_s=round(max(trig), 2) if trig else None,
        untriggered_max_s=round(max(untrig), 2) if untrig else None,
        drains_in_window=sum(1 for t in reports if start <= t <= end),
        max_sleep_s=max_sleep_of(workload, window) if contender.startswith("known-work")
        else None, workload=workload,
        drain_s=[d for t, d in drains if start <= t <= end],
        occurrences_done=got.occurrences, notes=notes,
        sessions_seen=sum(1 for se in result.sessions
                          if se.application_name == "drainer"),
        unseen_connections=sum(u.connections for u in result.unseen_connections),
        retry_linger_s=retry_linger,
        lingered_s=round(sum(w for t, w in lingered if start <= t <= end), 3),
        drain_at_s=[round(t - start, 1) for t in reports if start <= t <= end],
        awake_reports_s=round(awake_by_idle_rule(
            [(t - d, t) for t, d in drains if start <= t <= end]
            + [(start + b.at * window,) * 2 for b in bursts], idle, start, end), 1),
        activity_at_s=sorted({round(datetime.fromisoformat(a).timestamp() - start, 1)
                              for a in result.activity_times}),
        latency=Latency.of(got.after_due_s),
        retry_latency=Latency.of([x for _d, x in retried]), running_left=running_left,
        runs_failed=sum(1 for t in failures if start <= t <= end), started_at=start,
        log_path=str(stderr_log) if proc is not None else "")
    if sim is not None:
        resumes = sim.resumes(start, end)
        out.sim_awake_s = round(sim.awake_seconds(start, end), 1)
        out.resumes = len(resumes)
        out.suspends = len(sim.suspends(start, end))
        out.cold_start_s = round(sim.cold_seconds(start, end), 1)
        out.wasted_resumes = len(wasted(resumes, read_attempts(attempt_log), got.finished,
                                        start, end))
        for p in resumes:
            out.resumed_by[p.cause or "?"] = out.resumed_by.get(p.cause or "?", 0) + 1
        periods = sim.periods()
        out.retry_awake_latency = Latency.of([x for d, x in retried if any(
            p.ready_at is not None and p.ready_at <= d <= (p.suspended_at or end)
            for p in periods)])
        out.periods = [period_of(p, start) for p in periods
                       if (p.suspended_at or end) >= start and p.resumed_at <= end]
        out.producer_sessions = [(se.accepted, se.closed or end) for se in sim.sessions()
                                 if se.application_name == PRODUCER
                                 and start <= se.accepted <= end]
    return out


def period_of(p: Period, start: float) -> dict[str, Any]:
    """One awake period for --json, times in seconds from the window's start."""
    def at(t: float | None) -> float | None:
        return None if t is None else round(t - start, 2)

    return {"resumed": at(p.resumed_at), "ready": at(p.ready_at),
            "suspended": at(p.suspended_at), "cause": p.cause,
            "sessions": [{"application_name": se.application_name, "opened": at(se.accepted),
                          "closed": at(se.closed), "statements": se.statements,
                          "cut": se.cut} for se in p.sessions]}


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
    return union_seconds([(a, b + idle) for a, b in intervals], start, end)


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


def with_least(results: list[Result], workload: str, idle: float, window: float,
               retry_wait: float, handler_s: float = LONG_WORKLOAD[0].sleep
               ) -> dict[str, float]:
    """Each contender's least possible awake seconds (bench/awake_suspend.py) over its own
    window: the workload's due instants, its producers' sessions, and one drain of the
    median length known-work's drains took (else the contender's own, else 0)."""
    if workload not in ("bursts", "hard", "retry", "long"):
        return {}
    kw = next((r for r in results if r.contender == "known-work" and r.drain_s), None)
    out: dict[str, float] = {}
    for r in results:
        if r.sim_awake_s is None:
            continue
        drains = (kw or r).drain_s
        # the long workload's drains last as long as its handlers, which the compute may
        # sleep through: what they keep it up for is the claim and the outcome write
        # (milliseconds each), which the due instants give
        drain = statistics.median(drains) if drains and workload != "long" else 0.0
        due = due_instants(bursts_of(workload, handler_s) if workload == "long"
                           else BURSTS[workload], r.started_at, window, retry_wait,
                           HARD_CRON if workload == "hard" else None)
        out[r.contender] = round(least_awake(due, r.producer_sessions, drain, idle,
                                             r.started_at, r.started_at + window), 1)
    return out


def suspend_table(results: list[Result], least: dict[str, float]) -> str:
    """Through the suspend simulator: what the compute did, beside the sampler's estimate."""
    out = ["| contender | awake s (simulator) | x least | resumes | wasted resumes | "
           "resumed by | cold starts s | awake s (sampler) | jobs done | left running | "
           "latency after due s: median / p95 / max | retries after due s: median / max | "
           "retries due while awake: median / max | failed runs |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.sim_awake_s is None:
            continue
        lo = least.get(r.contender)
        ratio = f"{r.sim_awake_s / lo:.2f}x" if lo and r.contender != "floor" else "—"
        by = ", ".join(f"{k} {v}" for k, v in sorted(r.resumed_by.items())) or "—"
        retry, awake = (("—" if x.median is None else f"{x.median:.2f} / {x.max:.2f}")
                        for x in (r.retry_latency, r.retry_awake_latency))
        name = r.contender + (f" ({'; '.join(r.notes)})" if r.notes else "")
        out.append(f"| {name} | {r.sim_awake_s:.1f} | {ratio} | {r.resumes} | "
                   f"{r.wasted_resumes} | {by} | {r.cold_start_s:.1f} | {r.awake_s:.1f} | "
                   f"{r.done}/{r.jobs} | {r.running_left} | {r.latency.text()} | {retry} | "
                   f"{awake} | {r.runs_failed} |")
    return "\n".join(out)


def suspend_verdict(results: list[Result], least: dict[str, float]) -> list[str]:
    """The hard workload's targets for known-work and serve."""
    lines: list[str] = []
    for r in results:
        if r.contender not in ("known-work", "serve") or r.sim_awake_s is None:
            continue
        lo = least.get(r.contender)
        if lo:
            ratio = r.sim_awake_s / lo
            # below the least only by leaving work undone (or late): not a pass
            met = ratio <= 1.05 and r.done == r.jobs
            lines.append(f"{r.contender}: awake {r.sim_awake_s:.1f} s = {ratio:.2f}x the "
                         f"least possible {lo:.1f} s (target at most 1.05x, every job "
                         f"done): {'met' if met else 'NOT met'}")
        lines.append(f"{r.contender}: {r.wasted_resumes} wasted resumes (target 0): "
                     f"{'met' if r.wasted_resumes == 0 else 'NOT met'}")
        rm = r.retry_awake_latency.max
        if rm is not None or r.retry_latency.max is not None:  # the workload has retries
            lines.append(f"{r.contender}: retries due while the compute was up done at most "
                         f"{rm} s after due (target within 1 s): "
                         f"{'met' if rm is None or rm <= 1 else 'NOT met'}")
        lines.append(f"{r.contender}: jobs done {r.done}/{r.jobs}: "
                     f"{'met' if r.done == r.jobs else 'NOT met'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.awake", description=__doc__.split("\n")[0])
    p.add_argument("--server", default=os.environ.get("BENCH_SERVER_URL", DEFAULT_SERVER),
                   help="A URL of the server (any database; the sampler connects there).")
    p.add_argument("--database", default="drainer_awake",
                   help="Prefix of the databases created, one per contender "
                   "[default: drainer_awake].")
    p.add_argument("--window", type=float, default=None,
                   help="Seconds sampled [300; 420 for --workload long].")
    p.add_argument("--idle-timeout", type=float, default=20.0, help="Seconds [20].")
    p.add_argument("--warmup", type=float, default=None,
                   help="Seconds a contender runs before the window [idle timeout + 10].")
    p.add_argument("--only", default=",".join(CONTENDERS),
                   help=f"Comma-separated contenders [{','.join(CONTENDERS)}]; also "
                   f"{', '.join(EXTRA_CONTENDERS + awake_peers.PEERS)} (the peers' always-on "
                   "workers, in bench/.peers-venv).")
    p.add_argument("--parallel", action="store_true",
                   help="Run the contenders at the same time (each has its own database; "
                   "the machine's CPU is shared).")
    p.add_argument("--json", metavar="PATH", help="Also write the results as JSON here.")
    p.add_argument("--html", metavar="PATH", help="Also write each contender's awake "
                   "timeline here (one self-contained page, as drainer audit --html).")
    p.add_argument("--workload", choices=("bursts", "recurring", "retry", "hard", "long"),
                   default="bursts",
                   help="bursts of enqueued jobs [default], a recurring definition every "
                   "minute and nothing else (bench/recurring_app.py), one burst of 20 "
                   "jobs, 5 failing once with a short retry (bench/retry_app.py: "
                   "known-work with and without --retry-linger), bursts of 200 with "
                   "failures, delays, plain SQL and a recurring definition (hard), or 10 "
                   "handlers of 60 s at once (long; known-work and serve).")
    p.add_argument("--cold-start", type=float, default=COLD_START_S,
                   help="Seconds the suspend simulator's compute takes to resume "
                   f"[{COLD_START_S:g}].")
    p.add_argument("--handler-seconds", type=float, default=LONG_WORKLOAD[0].sleep,
                   help="--workload long: seconds each handler waits "
                   f"[{LONG_WORKLOAD[0].sleep:g}].")
    p.add_argument("--direct", action="store_true",
                   help="Connect to the server directly, not through the suspend simulator "
                   "(the sampler's estimate only).")
    p.add_argument("--retry-wait", type=float, default=5.0,
                   help="--workload retry: seconds from the failure to the retry [5].")
    p.add_argument("--linger", type=float, default=10.0,
                   help="--workload retry: known-work-linger's --retry-linger [10].")
    a = p.parse_args(argv)
    if a.workload == "retry" and a.only == ",".join(CONTENDERS):
        a.only = ",".join(RETRY_CONTENDERS)
    if a.workload == "long" and a.only == ",".join(CONTENDERS):
        a.only = ",".join(LONG_CONTENDERS)
    if a.window is None:
        a.window = 420.0 if a.workload == "long" else 300.0
    if a.cold_start < 0:
        p.error("--cold-start must be >= 0")
    # producers fire the trigger whoever listens; with no listener that POST is refused at
    # once (the job stays queued): expected here, not worth a warning per burst
    logging.getLogger("drainer.trigger").setLevel(logging.ERROR)
    only = [c.strip() for c in a.only.split(",") if c.strip()]
    known = CONTENDERS + EXTRA_CONTENDERS + awake_peers.PEERS
    bad = [c for c in only if c not in known]
    if bad:
        p.error(f"unknown contender(s) {', '.join(bad)} (choose from {', '.join(known)})")
    warmup = a.warmup if a.warmup is not None else a.idle_timeout + 10
    kw = {"window": a.window, "idle": a.idle_timeout, "warmup": warmup,
          "workload": a.workload, "retry_wait": a.retry_wait, "linger": a.linger,
          "cold_start": None if a.direct else a.cold_start, "handler_s": a.handler_seconds}
    started = datetime.now(timezone.utc)
    if any(c in awake_peers.PEERS for c in only):
        # once, before any contender's thread: the peers venv is made (or completed) here
        problem = ensure_peers()
        if problem:
            sys.stderr.write(f"bench.awake: {problem}\n")
            return 1
    if a.parallel:
        found: dict[str, Result] = {}
        failed: dict[str, str] = {}

        def one(c: str) -> None:
            # a thread drops SystemExit (a contender that exited early raises it) and
            # prints other exceptions far from the table: keep the reason for the summary
            try:
                found[c] = run_contender(c, a.server, a.database, **kw)
            except BaseException as exc:  # reported below, with the others
                failed[c] = f"{type(exc).__name__}: {exc}".strip()
                sys.stderr.write(f"{c} failed:\n{traceback.format_exc()}\n")

        threads = [threading.Thread(target=one, args=(c,)) for c in only]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        missing = [c for c in only if c not in found]
        if missing:  # the others' figures are still printed (a run takes minutes)
            sys.stderr.write("contender(s) failed: " + "; ".join(
                f"{c}: {failed.get(c, 'no result')[-600:]}" for c in missing) + "\n")
            if not found:
                return 1
        results = [found[c] for c in only if c in found]
    else:
        results = [run_contender(c, a.server, a.database, **kw) for c in only]
    workload = "; ".join(b.describe(a.window)
                         for b in bursts_of(a.workload, a.handler_seconds))
    if a.workload == "recurring":
        workload = "a recurring definition '* * * * *' (a no-op), no producers"
    if a.workload == "retry":
        workload += f", retried {a.retry_wait:g} s later"
    if a.workload == "hard":
        workload += (f"; failures retried {a.retry_wait:g} s later; a recurring definition "
                     f"'{HARD_CRON}' (a no-op)")
    if a.workload == "long":
        workload += f", --concurrency {LONG_CONCURRENCY}"
    print(f"### Awake time: idle timeout {a.idle_timeout:g} s, window {a.window:g} s, "
          f"sampled every 0.5 s ({started:%Y-%m-%d %H:%M} UTC)\n")
    print(f"Workload: {workload}.\n")
    print(retry_table(results) if a.workload == "retry"
          else table(results, a.idle_timeout, a.window))
    print()
    lines = (recurring_verdict(results, a.idle_timeout) if a.workload == "recurring"
             else [] if a.workload in ("retry", "hard", "long") else verdict(results))
    for line in lines:
        print(f"- {line}")
    least = with_least(results, a.workload, a.idle_timeout, a.window, a.retry_wait,
                       a.handler_seconds)
    if not a.direct:
        print(f"\n#### Through the suspend simulator: idle timeout {a.idle_timeout:g} s, cold "
              f"start {a.cold_start:g} s\n")
        print(suspend_table(results, least))
        print()
        if least:
            print("x least: the simulator's awake seconds over the least possible (the "
                  "union over due instants d of [d, d + drain + T] and the producers' "
                  "sessions + T; bench/awake_suspend.py).\n")
        for line in (suspend_verdict(results, least) if a.workload in ("hard", "long")
                     else []):
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
    return 1 if a.parallel and len(results) < len(only) else 0


if __name__ == "__main__":
    raise SystemExit(main())
