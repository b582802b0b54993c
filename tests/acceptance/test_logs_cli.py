"""Logs of `drainer run-once`: JSON lines with the job fields when piped, text and a live
progress line on a terminal."""

from __future__ import annotations

import json
import re
import socket
from typing import Any

import psycopg

from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings
from tests.acceptance.test_ops_cli import run_in_pty
from tests.conftest import cli_env, run_cli


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_json_logs_carry_run_and_job_fields(migrated: Settings, conn: psycopg.Connection[Any],
                                            pg_url: str, schema: str) -> None:
    enqueue_many(conn, [JobSpec("slowish", {"sleep": 0}) for _ in range(3)]
                 + [JobSpec("fails", {"n": 1}, max_attempts=1),
                    JobSpec("fails", {"n": 2})], schema=schema)
    p = run_cli(["run-once", "--app", "ops_jobs", "--log-level", "DEBUG"], pg_url=pg_url,
                schema=schema, DRAINER_PUSHGATEWAY_URL=f"http://127.0.0.1:{_free_port()}")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert (report["succeeded"], report["retried"], report["failed"]) == (3, 1, 1)
    lines = [json.loads(line) for line in p.stderr.splitlines()]  # every line is JSON
    jobs = [r for r in lines if "job_id" in r]
    assert {r["outcome"] for r in jobs} == {"succeeded", "retried", "failed"}
    for r in jobs:
        assert r["run_id"] == report["run_id"]
        assert r["queue"] in ("slowish", "fails")
        assert r["attempt"] == 1
        assert isinstance(r["duration_s"], float) and r["duration_s"] >= 0
        assert set(r) >= {"ts", "level", "logger", "msg"}
    succeeded = [r for r in jobs if r["outcome"] == "succeeded"]
    assert len(succeeded) == 3 and all(r["level"] == "debug" for r in succeeded)
    [failed] = [r for r in jobs if r["outcome"] == "failed"]
    assert failed["level"] == "info" and failed["error"] == "ValueError: cannot handle {'n': 1}"
    assert "failed for good" in failed["msg"]
    [retried] = [r for r in jobs if r["outcome"] == "retried"]
    assert "retry at" in retried["msg"]
    # the failed push is a warning, and the run still exits 0
    assert any(r["level"] == "warning" and "pushing metrics failed" in r["msg"] for r in lines)

    enqueue_many(conn, [JobSpec("slowish", {"sleep": 0}), JobSpec("fails", {})],
                 schema=schema)
    quiet = run_cli(["run-once", "--app", "ops_jobs", "--log-level", "WARNING"],
                    pg_url=pg_url, schema=schema)
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_progress_line_and_text_logs_on_a_terminal(
        migrated: Settings, conn: psycopg.Connection[Any], pg_url: str, schema: str) -> None:
    enqueue_many(conn, [JobSpec("slowish", {"sleep": 0.1}) for _ in range(16)]
                 + [JobSpec("fails", {})], schema=schema)
    env = cli_env(pg_url, schema)
    code, out = run_in_pty(["run-once", "--app", "ops_jobs", "--batch-size", "2"], env)
    assert code == 0, out
    assert re.search(r"\r\x1b\[Kclaimed \d+  done \d+  retried \d  failed 0  [\d,]+ jobs/s  "
                     r"due \d+", out), out
    assert re.search(r"\d\d:\d\d:\d\d info +job \d+ failed \(attempt 1/5\)", out), out
    # the report starts on a line of its own after the progress line
    last = out.strip().splitlines()[-1]
    report = json.loads(last)
    assert report["succeeded"] == 16 and report["retried"] == 1
