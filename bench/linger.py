"""``python -m bench.linger``: what ``retry_linger`` does to the wakes a short retry costs.

The workload: 20 jobs, 5 of which fail on their first attempt with a task retry policy whose
first wait is ``--retry-wait`` seconds. The waker is modelled as the known-work policy does
it: run a drain, and when the report's ``next_due_at`` is set, sleep until then and drain
again. Each mode is run for real (real drains on the real database); the compute's awake
time is modelled from the drains' connected intervals: a compute is up while connected and
for ``--idle-timeout`` seconds after the last connection closes (the suspend rule of Neon /
Aurora, see docs/waking.md). Printed: drains (= resumes when each falls after a suspend),
connected seconds, modelled awake seconds, and when the last job finished.

    python -m bench.linger [--retry-wait 5] [--idle-timeout 20] [--linger 10]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import datetime, timezone
from typing import Any

import psycopg

import drainer
from bench.core import ensure_database, fresh_schema
from drainer.producer import JobSpec, enqueue_many
from drainer.registry import Registry
from drainer.settings import load_settings

SCHEMA = "bench_linger"
DEFAULT_SERVER_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def awake_seconds(intervals: list[tuple[float, float]], idle: float) -> float:
    """Union of [start, end + idle] over the drains' connected intervals."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is not None and start <= cur_end:
            cur_end = max(cur_end, end + idle)
            continue
        if cur_start is not None and cur_end is not None:
            total += cur_end - cur_start
        cur_start, cur_end = start, end + idle
    if cur_start is not None and cur_end is not None:
        total += cur_end - cur_start
    return total


def run_mode(url: str, linger: float, retry_wait: float, idle: float) -> dict[str, Any]:
    fresh_schema(url, SCHEMA)
    registry = Registry()
    failed_once: set[int] = set()

    @registry.task("flaky", retry=drainer.Retry(base=retry_wait / 2, cap=retry_wait))
    def flaky(job: drainer.Job) -> None:
        if job.payload["flaky"] and job.id not in failed_once:
            failed_once.add(job.id)
            raise ConnectionError("try again soon")

    with psycopg.connect(url, autocommit=True) as conn:
        enqueue_many(conn, [JobSpec("flaky", {"flaky": i % 4 == 0}) for i in range(20)],
                     schema=SCHEMA)
    settings = load_settings(database_url=url, schema_name=SCHEMA, retry_linger=linger,
                             connect_retries=0)
    t0 = time.monotonic()
    intervals: list[tuple[float, float]] = []
    drains = succeeded = 0
    while True:
        report = drainer.run_once(settings, registry=registry)
        ended = time.monotonic() - t0
        intervals.append((ended - report.connected_s, ended))
        drains += 1
        succeeded += report.succeeded
        if os.environ.get("BENCH_VERBOSE"):
            print(json.dumps(report.as_dict()))
        if report.next_due_at is None or drains > 20:
            break
        wait = (datetime.fromisoformat(report.next_due_at)
                - datetime.now(timezone.utc)).total_seconds()
        time.sleep(max(0.0, wait))
    return {"linger_s": linger, "drains": drains, "succeeded": succeeded,
            "connected_s": round(sum(e - s for s, e in intervals), 2),
            "awake_s_model": round(awake_seconds(intervals, idle), 2),
            "last_job_done_s": round(intervals[-1][1], 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default=os.environ.get("BENCH_SERVER_URL", DEFAULT_SERVER_URL))
    p.add_argument("--database", default="drainer_linger")
    p.add_argument("--retry-wait", type=float, default=5.0)
    p.add_argument("--idle-timeout", type=float, default=20.0)
    p.add_argument("--linger", type=float, default=10.0)
    args = p.parse_args()
    url = ensure_database(args.server, args.database)
    for linger in (0.0, args.linger):
        print(json.dumps(run_mode(url, linger, args.retry_wait, args.idle_timeout)))


if __name__ == "__main__":
    main()
