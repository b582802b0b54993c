"""Crashes: kill -9, a terminated backend, SIGTERM, and a worker that stalls.

Real ``drainer run-once`` processes against the real database; the rel_jobs handlers
record every execution in files so that "ran at most twice" is counted, not assumed.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings
from tests.conftest import finish
from tests.reliability._helpers import (
    executions,
    jobs,
    runs_per_job,
    secret_dsn,
    start_drainer,
    status_counts,
    wait_for,
)


def _enqueue(conn: psycopg.Connection[Any], schema: str, n: int, queue: str = "rec",
             **payload: Any) -> None:
    enqueue_many(conn, [JobSpec(queue, {"n": i, **payload}) for i in range(n)], schema=schema)


def _leases_expired(conn: psycopg.Connection[Any], schema: str) -> bool:
    return all(r["expired"] for r in jobs(conn, schema).values() if r["status"] == "running")


def _drain_again(pg_url: str, schema: str, log_dir: Path, *args: str) -> dict[str, Any]:
    code, out, err = finish(start_drainer(["run-once", *args], pg_url=pg_url, schema=schema,
                                          log_dir=log_dir), timeout=60)
    assert code == 0, err[-2000:]
    report: dict[str, Any] = json.loads(out)
    return report


@pytest.mark.slow
def test_kill_9_mid_jobs_loses_nothing_and_runs_killed_jobs_at_most_twice(
    migrated: Settings, conn: psycopg.Connection[Any], pg_url: str, tmp_path: Path
) -> None:
    schema = migrated.schema_name
    _enqueue(conn, schema, 12, sleep=0.4)
    args = ["--concurrency", "3", "--batch-size", "6", "--lease", "2"]
    proc = start_drainer(["run-once", *args], pg_url=pg_url, schema=schema, log_dir=tmp_path)
    wait_for(lambda: len(executions(tmp_path)) >= 5, 30, "five jobs to start")
    proc.send_signal(signal.SIGKILL)
    code, _out, _err = finish(proc, timeout=10)
    assert code == -signal.SIGKILL
    # a claim the drainer sent ahead before it died still runs on the server, and commits,
    # until its backend reads the closed socket: the jobs as the kill left them are the
    # jobs once that backend has ended (read before, 3 more were claimed after)
    wait_for(lambda: not _drainer_backends(conn, schema), 10, "the drainer's backend to end")
    at_kill = jobs(conn, schema)
    running = {i for i, r in at_kill.items() if r["status"] == "running"}
    done_before = {i for i, r in at_kill.items() if r["status"] == "done"}
    assert running, "the kill came too late: nothing was running"
    assert all(r["locked_until"] is not None for i, r in at_kill.items() if i in running)

    # Nobody extends a dead drainer's leases: they expire, and the next run reaps them.
    wait_for(lambda: _leases_expired(conn, schema), 10, "the leases to expire")
    report = _drain_again(pg_url, schema, tmp_path, *args)
    assert report["reaped"] == len(running)

    after = jobs(conn, schema)
    assert len(after) == 12 and {r["status"] for r in after.values()} == {"done"}
    runs = runs_per_job(tmp_path)
    assert set(runs) == set(after)
    assert max(runs.values()) <= 2
    twice = {i for i, n in runs.items() if n == 2}
    assert twice <= running, "only jobs the kill interrupted may run again"
    assert all(runs[i] == 1 for i in done_before)
    # the death is charged to no job that was no suspect (a claim proves no start): each
    # job is charged the one run whose outcome was written
    assert not any(at_kill[i]["charged"] for i in running)
    assert all(r["attempts"] == 1 for r in after.values())


def _drainer_backends(conn: psycopg.Connection[Any], schema: str) -> list[int]:
    """The drainer sessions of our test's schema (application_name drainer, their last
    statement naming it)."""
    return [r[0] for r in conn.execute(
        "SELECT pid FROM pg_stat_activity "
        "WHERE application_name = 'drainer' AND pid <> pg_backend_pid() "
        "AND datname = current_database() AND position(%s in query) > 0",
        [f'"{schema}"']).fetchall()]


def _terminate_drainer_backend(conn: psycopg.Connection[Any], schema: str) -> int:
    """pg_terminate_backend on the drainer's work connection, recognised by its
    application_name and by its last statement naming our test's schema."""
    pids = _drainer_backends(conn, schema)
    for pid in pids:
        conn.execute("SELECT pg_terminate_backend(%s)", [pid])
    return len(pids)


@pytest.mark.slow
def test_backend_terminated_mid_drain_exits_10_or_recovers_and_loses_nothing(
    migrated: Settings, conn: psycopg.Connection[Any], pg_url: str, tmp_path: Path
) -> None:
    schema = migrated.schema_name
    _enqueue(conn, schema, 16, sleep=0.3)
    args = ["--concurrency", "2", "--batch-size", "4", "--lease", "2"]
    url, password = secret_dsn(pg_url) or (pg_url, None)  # the error must not print it
    proc = start_drainer(["run-once", *args], pg_url=url, schema=schema, log_dir=tmp_path)
    wait_for(lambda: len(executions(tmp_path, "end")) >= 3, 30, "three jobs to finish")
    assert wait_for(lambda: _terminate_drainer_backend(conn, schema), 5,
                    "the drainer's backend") == 1
    code, out, err = finish(proc, timeout=30)  # never hangs
    lines = err.strip().splitlines()
    # 10: the server ended the session (57P01 admin shutdown), said so; 3 when the
    # connection broke before the server's message was read
    assert code in (0, 3, 10), err[-2000:]
    if code == 10:
        assert "ended the session (admin shutdown)" in lines[-1]
    if code == 3:
        assert "database connection lost" in lines[-1]
    assert "Traceback" not in err
    assert password is None or password not in out + err

    wait_for(lambda: _leases_expired(conn, schema), 10, "the leases to expire")
    _drain_again(pg_url, schema, tmp_path, *args)
    after = jobs(conn, schema)
    assert len(after) == 16 and {r["status"] for r in after.values()} == {"done"}
    runs = runs_per_job(tmp_path)
    assert set(runs) == set(after) and max(runs.values()) <= 2
    print(f"\nterminated backend: first run exit {code}; "
          f"{sum(1 for n in runs.values() if n == 2)} jobs ran twice")


@pytest.mark.slow
def test_sigterm_finishes_in_flight_releases_the_rest_and_exits_0(
    migrated: Settings, conn: psycopg.Connection[Any], pg_url: str, tmp_path: Path
) -> None:
    schema = migrated.schema_name
    # the jobs in flight take 4 s: the release must be seen well before they end, also
    # on a loaded machine (with 2 s jobs a 1.5 s wait was too tight under a parallel suite)
    _enqueue(conn, schema, 10, sleep=4.0)
    proc = start_drainer(["run-once", "--concurrency", "2", "--batch-size", "10",
                          "--grace", "20", "--lease", "30"],
                         pg_url=pg_url, schema=schema, log_dir=tmp_path)
    try:
        started = wait_for(lambda: executions(tmp_path) if len(executions(tmp_path)) >= 2
                           else None, 30, "two jobs to start")
        in_flight = {job_id for job_id, _a, _p in started}
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()

        # The claimed jobs that had not started are back to queued at once, attempts
        # given back, while the two in flight are still running.
        def released() -> dict[int, dict[str, Any]] | None:
            table = jobs(conn, schema)
            queued = [r for r in table.values() if r["status"] == "queued"]
            return table if len(queued) == 8 else None

        table = wait_for(released, 3.0, "the unstarted jobs to be released")
        assert {i for i, r in table.items() if r["status"] == "running"} == in_flight
        assert all(r["attempts"] == 0 and r["locked_until"] is None
                   for r in table.values() if r["status"] == "queued")
    except BaseException:
        proc.kill()
        proc.communicate()
        raise

    code, out, err = finish(proc, timeout=25)
    assert code == 0, err[-2000:]
    assert time.monotonic() - signalled < 10
    report = json.loads(out)
    assert report["released"] == 8 and report["succeeded"] == 2
    assert report["stopped_by"] == "signal"
    after = jobs(conn, schema)
    assert {i for i, r in after.items() if r["status"] == "done"} == in_flight
    assert status_counts(conn, schema) == {"done": 2, "queued": 8}
    assert all(r["attempts"] == 0 for r in after.values() if r["status"] == "queued")
    assert {j for j, _a, _p in executions(tmp_path, "end")} == in_flight


@pytest.mark.slow
def test_sigterm_grace_runs_out_exits_0_and_leaves_the_job_to_its_lease(
    migrated: Settings, conn: psycopg.Connection[Any], pg_url: str, tmp_path: Path
) -> None:
    schema = migrated.schema_name
    _enqueue(conn, schema, 3, sleep=20.0)
    proc = start_drainer(["run-once", "--concurrency", "1", "--batch-size", "3",
                          "--grace", "0.5", "--lease", "30"],
                         pg_url=pg_url, schema=schema, log_dir=tmp_path)
    wait_for(lambda: executions(tmp_path), 30, "a job to start")
    proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    code, out, err = finish(proc, timeout=15)
    assert code == 0, err[-2000:]
    assert time.monotonic() - signalled < 5, "the grace period was not enforced"
    report = json.loads(out)
    assert report["released"] == 2
    assert status_counts(conn, schema) == {"running": 1, "queued": 2}


@pytest.mark.slow
def test_stalled_worker_late_completion_writes_nothing(
    migrated: Settings, conn: psycopg.Connection[Any], pg_url: str, tmp_path: Path
) -> None:
    """A drainer frozen (SIGSTOP) past its lease: another run reaps and re-runs the job;
    the first one's late success is fenced out (UPDATE 0) and the second's verdict stays."""
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("first_slow_then_fail", {"sleep": 1.5}, max_attempts=1)],
                 schema=schema)
    slow = start_drainer(["run-once", "--lease", "1"], pg_url=pg_url, schema=schema,
                         log_dir=tmp_path)
    try:
        wait_for(lambda: executions(tmp_path), 30, "attempt 1 to start")
        os.kill(slow.pid, signal.SIGSTOP)
        wait_for(lambda: _leases_expired(conn, schema), 10, "the lease to expire")
        report = _drain_again(pg_url, schema, tmp_path, "--lease", "1")
        assert report["reaped"] == 1 and report["failed"] == 1
    finally:
        os.kill(slow.pid, signal.SIGCONT)
    code, out, err = finish(slow, timeout=30)
    assert code == 0, err[-2000:]
    assert json.loads(out)["lost"] == 1
    assert "no longer ours" in err or "not written" in err

    (job,) = jobs(conn, schema).values()
    # the expired lease gave the first claim's attempt back (no start is proven by a claim)
    assert job["status"] == "failed" and job["attempts"] == 1
    assert "new owner's verdict: claim 2 failed" in job["last_error"]
    assert sorted((a, ev) for ev in ("start", "end")
                  for _j, a, _p in executions(tmp_path, ev)) == [
        (1, "end"), (1, "end"), (1, "start"), (1, "start")]


def test_sigterm_during_a_pipelined_drain_loses_nothing(
    migrated: Settings, conn: psycopg.Connection[Any], pg_url: str, tmp_path: Path
) -> None:
    """Fast jobs, so claims are in flight on the pipeline when SIGTERM comes: the claims
    in flight are read, every claimed job that did not run goes back with its attempt,
    every job that ran is written, and none is left running."""
    schema = migrated.schema_name
    n = 30_000
    _enqueue(conn, schema, n)
    proc = start_drainer(["run-once"], pg_url=pg_url, schema=schema, log_dir=tmp_path)
    wait_for(lambda: len(executions(tmp_path, "end")) >= 3_000, 30, "3,000 jobs to run")
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc, timeout=30)
    assert code == 0, err[-2000:]
    report = json.loads(out)
    assert report["stopped_by"] == "signal" and report["failed"] == report["lost"] == 0
    table = jobs(conn, schema)
    counts = status_counts(conn, schema)
    assert set(counts) <= {"done", "queued"} and counts.get("done", 0) < n, counts
    assert counts["done"] == report["succeeded"]
    assert report["claimed"] == report["succeeded"] + report["released"]
    ran = runs_per_job(tmp_path)
    done = {i for i, r in table.items() if r["status"] == "done"}
    assert set(ran) == done and set(ran.values()) == {1}  # each ran once, and was written
    assert all(r["attempts"] == 0 and r["locked_until"] is None
               for r in table.values() if r["status"] == "queued")
