"""bench.awake's peers (procrastinate, pgqueuer): set-up, command, producer inserts, and
what their attempt log says (bench/peer_awake.py runs them in the peers venv)."""

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

PEERS = ("procrastinate", "pgqueuer")


def install(kind: str, url: str) -> None:
    """The peer's schema in its database (after the peers venv, installed on first use)."""
    problem = ensure_peers()
    if problem:
        raise SystemExit(problem)
    subprocess.run([str(PEERS_BIN / "python"), "-m", "bench.peer_awake", kind, url, "install"],
                   check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def command(kind: str, url: str) -> list[str]:
    return [str(PEERS_BIN / "python"), "-m", "bench.peer_awake", kind, url]


def insert(conn: psycopg.Connection[Any], kind: str, payloads: Sequence[dict[str, Any]]
           ) -> None:
    """The producer's transaction for a peer: plain inserts into its table, whose own
    trigger notifies its worker (the peers have no HTTP trigger)."""
    rows = [(json.dumps(p), datetime.fromtimestamp(p["due"], timezone.utc)) for p in payloads]
    with conn.transaction(), conn.cursor() as cur:
        if kind == "procrastinate":
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
