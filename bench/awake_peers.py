"""bench.awake's peers (procrastinate, pgqueuer, chancy, dbos): set-up, command, producer
inserts, and what their attempt log says (bench/peer_awake.py runs them in the peers venv)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg

from bench.contenders import PEERS_BIN, ensure_peers
from bench.core import ROOT

PEERS = ("procrastinate", "pgqueuer", "chancy", "dbos")
#: chancy's retry plugin reads the delay from each job's meta: exactly the wait, no jitter
#: (bench/peer_awake.py's BENCH_RETRY_WAIT is the same for the other peers)
CHANCY_FUNC = "bench.peer_awake.chancy_work"


def install(kind: str, url: str) -> None:
    """The peer's schema in its database (after the peers venv, installed on first use)."""
    problem = ensure_peers()
    if problem:
        raise SystemExit(problem)
    subprocess.run([str(PEERS_BIN / "python"), "-m", "bench.peer_awake", kind, url, "install"],
                   check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def command(kind: str, url: str) -> list[str]:
    return [str(PEERS_BIN / "python"), "-m", "bench.peer_awake", kind, url]


def insert(conn: psycopg.Connection[Any], kind: str, payloads: Sequence[dict[str, Any]],
           retry_wait: float = 5.0) -> None:
    """The producer's transaction for a peer (the peers have no HTTP trigger): plain inserts
    into its table, whose own trigger notifies its worker (procrastinate, pgqueuer); for
    chancy the inserts and the NOTIFY its ``push_many`` sends; for DBOS its own SQL
    enqueue, ``dbos.enqueue_workflow`` (its workers poll the queue, no notification)."""
    rows = [(json.dumps(p), datetime.fromtimestamp(p["due"], timezone.utc)) for p in payloads]
    now = datetime.now(timezone.utc).timestamp()
    with conn.transaction(), conn.cursor() as cur:
        if kind == "chancy":
            meta = json.dumps({"retry_settings": {
                "backoff": retry_wait, "backoff_factor": 1, "backoff_limit": retry_wait,
                "backoff_jitter": [0, 0]}})
            cur.executemany("INSERT INTO chancy_jobs (id, queue, func, kwargs, meta, "
                            "max_attempts, scheduled_at) VALUES (gen_random_uuid(), 'bench', "
                            "%s, jsonb_build_object('payload', %s::jsonb), %s::jsonb, 2, %s)",
                            [(CHANCY_FUNC, p, meta, due) for p, due in rows])
            cur.execute("SELECT pg_notify('chancy_events', %s)",
                        [json.dumps({"t": "queue.pushed", "q": "bench"})])
        elif kind == "dbos":
            cur.executemany("SELECT dbos.enqueue_workflow('work', 'bench', ARRAY[%s::json], "
                            "delay_until_epoch_ms => %s)",
                            [(json.dumps(p), round(p["due"] * 1000) if p["due"] > now else None)
                             for p in payloads])
        elif kind == "procrastinate":
            cur.executemany("INSERT INTO procrastinate_jobs (queue_name, task_name, args, "
                            "scheduled_at) VALUES ('bench', 'work', %s::jsonb, %s)", rows)
        else:
            cur.executemany("INSERT INTO pgqueuer (priority, entrypoint, status, payload, "
                            "execute_after) VALUES (0, 'work', 'queued', convert_to(%s, "
                            "'UTF8'), %s)", rows)


def attempts(path: Path) -> list[tuple[float, float, int, bool, str, float]]:
    """(started, ended, attempt, ok, key, due) of every call bench/peer_awake.py recorded."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        s, e, a, ok, key, due = line.split()
        out.append((float(s), float(e), int(a), ok == "1", key, float(due)))
    return out


def outcomes(path: Path, retry_wait: float) -> tuple[int, list[float],
                                                     list[tuple[float, float]], list[float]]:
    """From the attempt log: jobs done, latency after due of each, (due, latency) of the
    retries (due: the failed attempt's end + the retry wait), and when each call ended."""
    calls = attempts(path)
    failed_at = {key: e for _s, e, _a, ok, key, _d in calls if not ok}
    done: dict[str, float] = {}
    retried: list[tuple[float, float]] = []
    for _s, e, _a, ok, key, due in calls:
        if not ok or key in done:
            continue
        if key in failed_at:
            retry_due = failed_at[key] + retry_wait
            retried.append((retry_due, e - retry_due))
            done[key] = e - retry_due
        else:
            done[key] = e - due
    return len(done), list(done.values()), retried, [e for _s, e, *_ in calls]
