"""The numbered defects of issue 20, each reproduced on the real database.

Every test here fails on the main of 2026-12-01 for the reason its mark names, and is
marked ``xfail(strict=True)``: it is reported as xfail until the defect is fixed, and then
turns the suite red (XPASS) until whoever fixed it removes the mark. What must never touch
the shared server (frozen backends) runs on the test's own cluster (tests/_cluster.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.migrate import migrate
from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings
from tests._cluster import Cluster, cluster  # noqa: F401  (the fixture)
from tests.conftest import ROOT, cli_env, finish, run_cli
from tests.reliability._helpers import executions, jobs, runs_per_job, wait_for

Conn = psycopg.Connection[Any]
APP = "issue20_jobs"


def start(args: list[str], *, pg_url: str, schema: str, log_dir: Path,
          **env: str) -> subprocess.Popen[str]:
    """``drainer <args>`` with the issue20_jobs app; executions go to ``log_dir``."""
    return subprocess.Popen(
        [sys.executable, "-m", "drainer", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env=cli_env(pg_url, schema, **{"DRAINER_APP": APP, "REL_LOG_DIR": str(log_dir),
                                       "DRAINER_LOG_FORMAT": "json", **env}))


def drain(pg_url: str, schema: str, log_dir: Path, *args: str, timeout: float = 60,
          **env: str) -> tuple[int, str, str]:
    return finish(start(["run-once", *args], pg_url=pg_url, schema=schema, log_dir=log_dir,
                        **env), timeout=timeout)


def insert_raw(conn: Conn, schema: str, rows: list[dict[str, Any]]) -> None:
    """Rows written by plain SQL, as the producer role may: no drainer code in between."""
    for r in rows:
        cols = list(r)
        conn.execute(sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            sql.Identifier(schema, "jobs"), sql.SQL(", ").join(map(sql.Identifier, cols)),
            sql.SQL(", ").join(sql.SQL("{}::{}").format(sql.Placeholder(), sql.SQL(t))
                               for t in (_TYPES[c] for c in cols))), [r[c] for c in cols])


_TYPES = {"queue": "text", "payload": "jsonb", "run_at": "timestamptz", "max_attempts": "int"}


def good_jobs(conn: Conn, schema: str, n: int, queue: str = "rec", **kw: Any) -> None:
    enqueue_many(conn, [JobSpec(queue, {"n": i}, **kw) for i in range(n)], schema=schema)


def statuses(conn: Conn, schema: str, queue: str | None = None) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in jobs(conn, schema).values():
        if queue is None or r["queue"] == queue:
            out[r["status"]] = out.get(r["status"], 0) + 1
    return out


def wait_leases_expired(conn: Conn, schema: str, timeout: float = 15) -> None:
    wait_for(lambda: all(r["expired"] for r in jobs(conn, schema).values()
                         if r["status"] == "running"), timeout, "the leases to expire")


# -- item 1: rows drainer cannot decode ------------------------------------------------------


@pytest.mark.parametrize("bad", [
    {"queue": "rec", "run_at": "-infinity"},
    {"queue": "rec", "payload": "[" * 5000 + "]" * 5000},
], ids=["run_at_-infinity", "payload_nested_5000"])
def test_item1_an_undecodable_row_fails_alone_and_the_rest_drains(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path, bad: dict[str, Any]
) -> None:
    schema = migrated.schema_name
    good_jobs(conn, schema, 9)
    try:
        insert_raw(conn, schema, [bad])
        refused = False
    except psycopg.errors.CheckViolation:
        refused = True  # the schema refusing the row is a fix too
    code, out, err = drain(pg_url, schema, tmp_path, "--batch-size", "10", "--lease", "30")
    assert code == 0, f"run-once exit {code}: {err.strip().splitlines()[-1:]}"
    report = json.loads(out)
    assert report["succeeded"] == 9, report
    rows = jobs(conn, schema).values()
    assert sum(r["status"] == "done" for r in rows) == 9
    if not refused:
        (row,) = [r for r in rows if r["status"] != "done"]
        assert row["status"] == "failed" and row["last_error"], row
    for cmd in (["status", "--json"], ["jobs"]):
        p = run_cli(cmd, pg_url=pg_url, schema=schema)
        assert p.returncode == 0, (cmd, p.stderr)


def test_item1_a_far_future_run_at_does_not_break_the_run_or_the_ops_commands(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    schema = migrated.schema_name
    good_jobs(conn, schema, 3)
    # refused by the schema is a fix too: what follows must hold all the same
    with contextlib.suppress(psycopg.errors.CheckViolation):
        insert_raw(conn, schema, [{"queue": "rec", "run_at": "20000-01-01 00:00:00+00"}])
    code, out, err = drain(pg_url, schema, tmp_path)
    assert code == 0, f"run-once exit {code}: {err.strip().splitlines()[-1:]}"
    assert json.loads(out)["succeeded"] == 3
    for cmd in (["status", "--json"], ["jobs"], ["jobs", "--status", "queued"]):
        p = run_cli(cmd, pg_url=pg_url, schema=schema)
        assert p.returncode == 0, (cmd, p.stderr.strip())


# -- item 2: attempts that were never attempts ----------------------------------------------


def test_item2_jobs_claimed_but_never_started_are_not_charged_by_a_death(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    schema = migrated.schema_name
    # the poison job first (priority), 10 good ones claimed in the same batch behind it
    enqueue_many(conn, [JobSpec("i20_mixed", {"exit": True}, priority=10, max_attempts=1)],
                 schema=schema)
    good_jobs(conn, schema, 10, queue="i20_mixed", max_attempts=1)
    code, _out, _err = drain(pg_url, schema, tmp_path, "--batch-size", "11", "--lease", "1")
    assert code == 7, "the poison job kills the drainer"
    assert len(executions(tmp_path)) == 1, "only the poison job started"
    wait_leases_expired(conn, schema)
    code, _out, err = drain(pg_url, schema, tmp_path, "--lease", "30")
    assert code == 0, err[-2000:]
    good = [r for r in jobs(conn, schema).values() if r["id"] != min(jobs(conn, schema))]
    never_ran = [r for r in good if r["status"] == "failed"]
    assert not never_ran, (f"{len(never_ran)} good jobs failed with 0 executions: "
                           f"{never_ran[0]['last_error']!r}")
    assert {r["status"] for r in good} == {"done"}
    assert set(runs_per_job(tmp_path).values()) == {1}


def test_item2_the_reaper_honours_the_tasks_max_attempts(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("i20_exit", {})], schema=schema)  # row max_attempts 5
    for _ in range(6):
        code, _out, _err = drain(pg_url, schema, tmp_path, "--lease", "1")
        if code == 0:
            break
        wait_leases_expired(conn, schema)
    (row,) = jobs(conn, schema).values()
    assert len(executions(tmp_path)) == 2, (
        f"ran {len(executions(tmp_path))} times, the task allows 2; row: {row['status']} "
        f"attempts={row['attempts']}")
    assert row["status"] == "failed"


# -- item 3: transaction=True tasks ---------------------------------------------------------


def test_item3_a_transaction_task_that_kills_the_process_is_charged_an_attempt(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("i20_tx_exit", {}, max_attempts=2)], schema=schema)
    for _ in range(4):
        code, _out, _err = drain(pg_url, schema, tmp_path, "--lease", "1")
        if code == 0:
            break
        wait_leases_expired(conn, schema)
    (row,) = jobs(conn, schema).values()
    assert len(executions(tmp_path)) <= 2, (
        f"ran {len(executions(tmp_path))} times with max_attempts=2; row: {row['status']} "
        f"attempts={row['attempts']}")
    assert row["status"] == "failed", row


def test_item3_a_transaction_tasks_timeout_is_enforced(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("i20_tx_slow", {"sleep": 3}, max_attempts=1)], schema=schema)
    code, out, err = drain(pg_url, schema, tmp_path, "--lease", "30")
    assert code == 0, err[-2000:]
    (row,) = jobs(conn, schema).values()
    assert row["status"] == "failed", (f"a 3 s handler with timeout=1 ended {row['status']}; "
                                       f"report {out.strip()}")
    assert "timeout" in (row["last_error"] or "").lower() or "timed out" in (
        row["last_error"] or "").lower(), row["last_error"]


def test_item3_sigterm_during_a_transaction_task_is_bounded_by_grace(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("i20_tx_long", {"sleep": 10})], schema=schema)
    proc = start(["run-once", "--grace", "2", "--lease", "30"], pg_url=pg_url, schema=schema,
                 log_dir=tmp_path)
    try:
        wait_for(lambda: executions(tmp_path), 20, "the handler to start")
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=14)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.wait(timeout=30)
        proc.communicate()
    assert took < 6, f"exit {took:.1f}s after SIGTERM with --grace 2"


# -- item 4: the fence repeats after a retry ------------------------------------------------


def test_item4_retry_never_repeats_the_fence(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("i20_verdict", {"sleep": 2}, max_attempts=1)], schema=schema)
    (job_id,) = jobs(conn, schema)
    old = start(["run-once", "--lease", "1"], pg_url=pg_url, schema=schema, log_dir=tmp_path,
                I20_VERDICT="ok")
    try:
        wait_for(lambda: executions(tmp_path), 20, "the first owner to start")
        os.kill(old.pid, signal.SIGSTOP)
        wait_leases_expired(conn, schema)
        # another run reaps it (max_attempts=1: failed), the operator retries it
        code, _out, err = drain(pg_url, schema, tmp_path, "--lease", "30")
        assert code == 0, err[-2000:]
        assert jobs(conn, schema)[job_id]["status"] == "failed"
        p = run_cli(["retry", "--id", str(job_id)], pg_url=pg_url, schema=schema)
        assert p.returncode == 0, p.stderr
        new = start(["run-once", "--lease", "30"], pg_url=pg_url, schema=schema,
                    log_dir=tmp_path, I20_VERDICT="fail")
        wait_for(lambda: len(executions(tmp_path)) >= 2, 20, "the new owner to start")
    finally:
        os.kill(old.pid, signal.SIGCONT)
    code_old, out_old, err_old = finish(old, timeout=30)
    code_new, out_new, err_new = finish(new, timeout=30)
    assert (code_old, code_new) == (0, 0), (err_old[-1500:], err_new[-1500:])
    row = jobs(conn, schema)[job_id]
    old_report, new_report = json.loads(out_old), json.loads(out_new)
    assert row["status"] == "failed" and "new owner's verdict" in (row["last_error"] or ""), (
        f"job {row['status']} ({row['last_error']!r}): the stalled worker's report "
        f"{old_report}, the new owner's {new_report}")
    assert new_report["lost"] == 0 and old_report["lost"] == 1


# -- item 5: the end-of-run VACUUM under statement_timeout ----------------------------------


def test_item5_a_cancelled_end_of_run_vacuum_does_not_fail_the_run(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    schema = migrated.schema_name
    good_jobs(conn, schema, 20)
    table = sql.Identifier(schema, "jobs")
    conn.execute(sql.SQL("UPDATE {} SET priority = priority").format(table))  # dead tuples
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")
    with psycopg.connect(pg_url) as blocker:
        # VACUUM waits for this lock (claims and completions do not): the wait is what a
        # VACUUM longer than statement_timeout looks like
        blocker.execute(sql.SQL("LOCK TABLE {} IN SHARE UPDATE EXCLUSIVE MODE").format(table))
        proc = start(["run-once", "--vacuum-threshold", "1", "--statement-timeout", "2",
                      "--lock-timeout", "0"], pg_url=pg_url, schema=schema, log_dir=tmp_path)
        wait_for(lambda: statuses(conn, schema) == {"done": 20}, 30, "the 20 jobs")
        # past statement_timeout; then the lock goes (a fix that waits must not hang here)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        blocker.rollback()
        code, out, err = finish(proc, timeout=60)
    assert statuses(conn, schema) == {"done": 20}
    last = err.strip().splitlines()[-1:] if err.strip() else []
    assert code == 0, f"run-once exit {code} after all 20 jobs were done: {last}"
    assert json.loads(out)["succeeded"] == 20


# -- item 6: a silent connection hangs run-once past --max-runtime --------------------------


def test_item6_max_runtime_bounds_the_process_when_the_server_freezes(
        cluster: Cluster, tmp_path: Path) -> None:  # noqa: F811
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with cluster.connect() as c:
        migrate(c, schema, "jobs")
        enqueue_many(c, [JobSpec("rec", {"n": i, "sleep": 0.2}) for i in range(200)],
                     schema=schema)
    proc = start(["run-once", "--max-runtime", "5", "--lease", "2", "--batch-size", "2",
                  "--connect-timeout", "2"], pg_url=cluster.url, schema=schema,
                 log_dir=tmp_path)
    started = time.monotonic()
    try:
        wait_for(lambda: len(executions(tmp_path)) >= 3, 20, "jobs to start")
        cluster.freeze()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(1.0, started + 20 - time.monotonic()))
        alive_after = time.monotonic() - started
        still_alive = proc.poll() is None
    finally:
        cluster.thaw()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert not still_alive, f"run-once --max-runtime 5 alive after {alive_after:.0f}s"


# -- item 7: the smaller ones ----------------------------------------------------------------


def test_item7_concurrent_migrate_notify_trigger(pg_url: str, schema: str, conn: Conn) -> None:
    migrate(conn, schema, "jobs")  # the table exists: each migrate goes straight on
    key = f"drainer.migrate:{schema}.jobs"  # drainer.migrate's advisory lock
    failures: list[str] = []
    for _round in range(3):
        # hold the migrate lock until all 6 wait on it, then let them go at once
        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", [key])
        procs = [subprocess.Popen([sys.executable, "-m", "drainer", "migrate",
                                   "--notify-trigger"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                  env=cli_env(pg_url, schema)) for _ in range(6)]
        try:
            until = time.monotonic() + 20  # (a fix that changes the lock: go on regardless)
            while time.monotonic() < until and conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                    "AND objid = hashtext(%s)::oid", [key]).fetchone()[0] < 6:  # type: ignore[index]
                time.sleep(0.05)
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", [key])
        for p in procs:
            _out, err = p.communicate(timeout=60)
            if p.returncode != 0:
                failures.append(f"exit {p.returncode}: {err.strip().splitlines()[-1:]}")
        if failures:
            break
    assert not failures, f"{len(failures)} of 6 concurrent migrate --notify-trigger: {failures}"


@pytest.mark.parametrize("args", [
    ["enqueue", "q", "NaN"],
    ["enqueue", "q", '{"x": Infinity}'],
    ["enqueue", "q", '"\\u0000"'],
    ["enqueue", "q", '"\\ud800"'],
    ["enqueue", "--priority", "2147483648", "q", "{}"],
    ["retry", "--id", str(2**63)],
    ["purge", "--status", "done", "--older-than", "1000000000d"],
], ids=["nan", "infinity", "nul", "lone_surrogate", "priority", "retry_id", "purge_age"])
def test_item7_invalid_input_is_a_usage_error(migrated: Settings, pg_url: str,
                                              args: list[str]) -> None:
    p = run_cli(args, pg_url=pg_url, schema=migrated.schema_name)
    assert p.returncode == 2, (p.returncode, p.stderr.strip()[-500:])
    assert "Traceback" not in p.stderr


def test_item7_a_long_queue_name_enqueues_with_the_notify_trigger(
        pg_url: str, schema: str) -> None:
    p = run_cli(["migrate", "--notify-trigger"], pg_url=pg_url, schema=schema)
    assert p.returncode == 0, p.stderr
    p = run_cli(["enqueue", "q" * 9000, "{}"], pg_url=pg_url, schema=schema)
    assert p.returncode == 0, (p.returncode, p.stderr.strip()[-500:])
