"""What a handler hands back that the table refuses fails that job alone.

A follow-up, a result or a retry policy no column can hold used to fail the one batch
statement it joined: the run exited 1, again at every run, and the innocent jobs of its
batch ran until their leases expired for good. Now it is checked before it joins a
statement (the job fails with a clear error), and a batch statement that still fails on
one row is split so that only that job fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

from drainer import Job
from drainer import run_once as drain
from drainer.job import FollowUp
from drainer.producer import JobSpec, enqueue_many
from drainer.registry import Registry
from drainer.settings import Settings
from tests.apps.rel_hostile_jobs import BAD_FOLLOWUPS
from tests.conftest import ROOT, cli_env, make_settings
from tests.reliability._helpers import executions, jobs, run_once, runs_per_job, wait_leases_expired

APP = "tests.apps.rel_hostile_jobs"


def _drain_ten_times(conn: psycopg.Connection[Any], pg_url: str, schema: str,
                     log_dir: Path) -> list[tuple[int, str]]:
    """The issue's reproduction: ten ``run-once --batch-size 10 --concurrency 4 --lease 1``."""
    out = []
    for _ in range(10):
        code, _out, err = run_once(pg_url, schema, log_dir, "--batch-size", "10",
                                   "--concurrency", "4", "--lease", "1", app=APP)
        out.append((code, err))
        if code != 0:  # what a failed run leaves is reaped by the next one
            wait_leases_expired(conn, schema)
    return out


@pytest.mark.parametrize("bad", [*BAD_FOLLOWUPS, "appended"])
def test_a_bad_follow_up_fails_its_job_alone(
    bad: str, migrated: Settings, conn: psycopg.Connection[Any], pg_url: str, tmp_path: Path
) -> None:
    schema = migrated.schema_name
    specs = [JobSpec("hostile", {"bad": bad} if i == 10 else {"n": i}, max_attempts=1)
             for i in range(1, 21)]
    enqueue_many(conn, specs, schema=schema)
    bad_id = min(jobs(conn, schema)) + 9

    runs = _drain_ten_times(conn, pg_url, schema, tmp_path)

    assert [code for code, _err in runs] == [0] * 10, runs[0][1][-3000:]
    table = jobs(conn, schema)
    parents = {i: r for i, r in table.items() if r["queue"] == "hostile"}
    assert parents[bad_id]["status"] == "failed"
    assert "follow-up" in (parents[bad_id]["last_error"] or ""), parents[bad_id]
    assert all(r["status"] == "done" for i, r in parents.items() if i != bad_id), parents
    children = [r for r in table.values() if r["queue"] == "child"]
    assert len(children) == 19 and all(r["status"] == "done" for r in children)
    assert set(runs_per_job(tmp_path).values()) == {1}  # nobody ran twice


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_batch_statement_that_fails_on_one_row_is_split(
    concurrency: int, migrated: Settings, registry: Registry, conn: psycopg.Connection[Any],
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # rows the checks miss (here: no checks at all) reach the batch statement itself
    monkeypatch.setattr(FollowUp, "check", lambda self: None, raising=False)
    bad = {7: ("child", {"k": "a\x00b"}, {}), 15: ("child", {}, {"priority": 2**40})}

    @registry.task("parent")
    def parent(job: Job) -> None:
        queue, payload, kw = bad.get(job.payload["n"], ("child", {"ok": 1}, {}))
        job.enqueue(queue, payload, **kw)

    @registry.task("child")
    def child(job: Job) -> None:
        pass

    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("parent", {"n": i}) for i in range(1, 21)], schema=schema)
    report = drain(make_settings(pg_url, schema, batch_size=10, concurrency=concurrency),
                   registry=registry)

    table = jobs(conn, schema)
    by_n = {r["id"] - min(table) + 1: r for r in table.values() if r["queue"] == "parent"}
    assert {n for n, r in by_n.items() if r["status"] == "failed"} == set(bad)
    assert {n for n, r in by_n.items() if r["status"] == "done"} == set(range(1, 21)) - set(bad)
    for n in bad:  # failed for good at once, with the database's reason
        assert by_n[n]["last_error"].startswith("UnstorableOutcome: the job's outcome cannot "
                                                "be stored: "), by_n[n]
        assert by_n[n]["attempts"] == 1
    assert [r["status"] for r in table.values() if r["queue"] == "child"] == ["done"] * 18
    assert (report.succeeded, report.failed) == (18 + 18, 2)


def test_an_uncapped_retry_policy_fails_only_its_own_job(
    migrated: Settings, conn: psycopg.Connection[Any], pg_url: str, tmp_path: Path
) -> None:
    schema = migrated.schema_name
    specs = [JobSpec("child", {"n": i}) for i in range(20)]
    specs += [JobSpec(q, {}, max_attempts=3) for q in ("retry_inf_cap", "retry_huge_base")]
    enqueue_many(conn, specs, schema=schema)

    for _ in range(3):
        code, _out, err = run_once(pg_url, schema, tmp_path, "--batch-size", "10",
                                   "--concurrency", "4", "--lease", "1", app=APP)
        assert code == 0, err[-3000:]

    table = jobs(conn, schema)
    assert [r["status"] for r in table.values() if r["queue"] == "child"] == ["done"] * 20
    for r in table.values():
        if r["queue"].startswith("retry_"):  # retried, its own policy kept
            assert (r["status"], r["attempts"]) == ("queued", 1), r
            assert r["last_error"].startswith("RuntimeError: fails"), r
            # inf cap: base * 2^1 (two hours); a base of 1e308: the settings' cap (an hour)
            assert r["run_at"] > datetime.now(timezone.utc) + timedelta(minutes=59), r
    assert set(runs_per_job(tmp_path).values()) == {1}


def _read_to_eof(proc: subprocess.Popen[bytes], timeout: float) -> tuple[bytes, bool]:
    """What ``drainer run-once | cat`` gets: stdout read to its end (every process holding
    it gone), and whether the end came within ``timeout`` s."""
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    out, until = b"", time.monotonic() + timeout
    while time.monotonic() < until:
        try:
            chunk = proc.stdout.read()
        except BlockingIOError:
            chunk = None
        if chunk == b"":
            return out, True
        out += chunk or b""
        time.sleep(0.05)
    return out, False


@pytest.mark.parametrize(("queue", "concurrency"), [("forks", "1"), ("forks", "4"),
                                                    ("forks_async", "4")])
def test_a_handler_that_forks_runs_nothing_twice_and_the_pipe_ends(
    queue: str, concurrency: str, migrated: Settings, conn: psycopg.Connection[Any],
    pg_url: str, tmp_path: Path
) -> None:
    schema = migrated.schema_name
    specs = [JobSpec(queue, {"n": i}) for i in range(3)]
    specs += [JobSpec("child", {"n": i}) for i in range(6)]
    enqueue_many(conn, specs, schema=schema)

    proc = subprocess.Popen(  # its own session: whatever it leaves behind is killed below
        [sys.executable, "-m", "drainer", "run-once", "--concurrency", concurrency,
         "--batch-size", "4"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT,
        start_new_session=True,
        env=cli_env(pg_url, schema, DRAINER_APP=APP, REL_LOG_DIR=str(tmp_path)))
    try:
        out, ended = _read_to_eof(proc, timeout=30)
        code = proc.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the forked children left, if any
            os.killpg(proc.pid, signal.SIGKILL)
        assert proc.stdout is not None
        proc.stdout.close()
    assert ended, "stdout still open 30 s on: a forked child kept running"
    assert code == 0 and json.loads(out)["succeeded"] == 9, out
    assert set(runs_per_job(tmp_path).values()) == {1}, runs_per_job(tmp_path)
    assert {e[2] for e in executions(tmp_path)} == {proc.pid}  # all in the drainer
    assert [r["status"] for r in jobs(conn, schema).values()] == ["done"] * 9
