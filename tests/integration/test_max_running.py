"""max_running: at most N jobs of a queue under a live lease, whatever the number
of drainer processes, proved from the handlers' own start/end log."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings
from tests.conftest import ROOT, cli_env

#: One drainer process: run-once again and again (as a scheduler or a worker would wake it)
#: until nothing is due. A drain that finds the queue's slots all taken by other drainers
#: claims nothing and exits (it does not wait on an open connection); this loop starts the
#: next one, so four processes keep contending for the three slots.
DRAINER_LOOP = """
import json, time
from drainer import load_settings, run_once
settings = load_settings()
succeeded, until = 0, time.monotonic() + 90
while time.monotonic() < until:
    report = run_once(settings)
    succeeded += report.succeeded
    if not report.claimed and not report.remaining_due:
        break
    if not report.claimed:
        time.sleep(0.02)
print(json.dumps({"succeeded": succeeded}))
"""


def max_overlap(log: Path) -> tuple[int, set[str]]:
    """The most handlers running at once, from start/end lines (an end at the same instant
    as a start counts first: a slot is freed by the completion, written after the end)."""
    events = []
    pids = set()
    for line in log.read_text().splitlines():
        kind, t, pid, _job = line.split()
        events.append((float(t), 0 if kind == "end" else 1))
        pids.add(pid)
    running = peak = 0
    for _t, kind in sorted(events):
        running += 1 if kind else -1
        peak = max(peak, running)
    return peak, pids


def test_max_running_holds_across_four_drainer_processes(
        migrated: Settings, pg_url: str, conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    jobs = 36
    enqueue_many(conn, [JobSpec("capped", {"sleep": 0.15}) for _ in range(jobs)],
                 schema=migrated.schema_name)
    log = tmp_path / "handlers.log"
    env = cli_env(pg_url, migrated.schema_name, CAPPED_LOG=str(log), DRAINER_APP="capped_jobs")
    # 2 handlers a process: together the four could run 8 at once, and the cap of 3 can only
    # be reached by two processes at the same time (a capped queue claims no more than the
    # free handler slots, nothing ahead). With 8 a process, one could hold all three slots
    # the whole drain, refilling each as it freed it (seen once in a full-suite run), and
    # the test would not see the processes contend (single-process caps:
    # test_queue_limits.py::test_operator_max_running_caps_the_claim, concurrency 8)
    env.update(DRAINER_CONCURRENCY="2", DRAINER_BATCH_SIZE="2")
    procs = [subprocess.Popen([sys.executable, "-c", DRAINER_LOOP], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for _ in range(4)]
    succeeded = 0
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        succeeded += json.loads(out)["succeeded"]
    peak, pids = max_overlap(log)
    assert peak <= 3, f"{peak} handlers of a max_running=3 queue ran at once"
    assert peak == 3  # the cap was reached, not just respected by a single slow drainer
    assert succeeded == jobs
    cur = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE status = 'done'").format(
        sql.Identifier(migrated.schema_name, migrated.table)))
    assert cur.fetchone() == (jobs,)
    assert len(pids) >= 2, "the jobs were shared between drainer processes"
