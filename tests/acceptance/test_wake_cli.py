"""``drainer schedule --wake-policy known-work`` as a real process: a restart drains in
full, skipped ticks say why at debug level, --listen, --dry-run and the refusals."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import psycopg

from drainer.settings import Settings
from tests.acceptance._proc import DrainerProcess
from tests.conftest import run_cli
from tests.integration.test_wake_policy import insert_plain, status

ARGS = ["schedule", "--interval", "0.3", "--wake-policy", "known-work", "--max-sleep", "1h",
        "--idle-timeout", "1"]


def reports(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def start(pg_url: str, schema: str, *extra: str) -> DrainerProcess:
    return DrainerProcess([*ARGS, *extra], pg_url=pg_url, schema=schema,
                          DRAINER_APP="sample_jobs", DRAINER_LOG_LEVEL="DEBUG",
                          DRAINER_TRIGGER_TOKEN="cli-trigger-token")


def test_a_restart_drains_in_full_once_then_skips(
        migrated: Settings, conn: psycopg.Connection[Any], pg_url: str) -> None:
    schema = migrated.schema_name
    first = insert_plain(conn, schema, "noop")
    proc = start(pg_url, schema)
    try:
        proc.wait_log("wake: start: one full drain", timeout=20)
        proc.wait_log("tick skipped, no connection: no known work", timeout=10)
        assert status(conn, schema, first) == "done"
        second = insert_plain(conn, schema, "noop")  # no trigger: the running process cannot know
        time.sleep(1.5)
        assert status(conn, schema, second) == "queued"
        skipped = [r for r in proc.logs if "tick skipped" in str(r.get("msg"))]
        assert len(skipped) >= 3 and {r["level"] for r in skipped} == {"debug"}
        assert proc.terminate() == 0
        assert len(reports(proc.stdout)) == 1
    finally:
        proc.kill()
    again = start(pg_url, schema)
    try:
        proc = again
        proc.wait_log("wake: start: one full drain", timeout=20)
        deadline = time.monotonic() + 10
        while status(conn, schema, second) != "done":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1.0)
        assert proc.terminate() == 0
        runs = reports(proc.stdout)
        assert len(runs) == 1 and runs[0]["succeeded"] == 1
        assert proc.count_logs("wake:") == 1
    finally:
        proc.kill()


def test_listen_takes_the_serve_contract(
        migrated: Settings, conn: psycopg.Connection[Any], pg_url: str) -> None:
    schema = migrated.schema_name
    proc = start(pg_url, schema, "--listen", "127.0.0.1:0")
    try:
        rec = proc.wait_log("listening on http://127.0.0.1:", timeout=20)
        port = rec["port"]
        proc.wait_log("wake: start", timeout=20)
        proc.wait_log("tick skipped", timeout=10)
        job = insert_plain(conn, schema, "noop")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert r.status == 200 and json.loads(r.read())["status"] == "ok"
        req = urllib.request.Request(f"http://127.0.0.1:{port}/drain", data=b"",
                                     method="POST",
                                     headers={"Authorization": "Bearer cli-trigger-token"})
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 202
        deadline = time.monotonic() + 5
        while status(conn, schema, job) != "done":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.wait_log("wake: trigger (POST /drain)")
        assert proc.terminate() == 0
    finally:
        proc.kill()


def test_dry_run_and_refusals(pg_url: str, schema: str) -> None:
    res = run_cli([*ARGS, "--dry-run"], pg_url=pg_url, schema=schema)
    assert res.returncode == 0, res.stderr
    assert "wake policy: known-work" in res.stdout
    assert ("awake estimate (known-work, with no work: the --max-sleep safety net only): "
            "per wake ≈ drain time + 1.0 s idle timeout (--idle-timeout); 24 wakes a day"
            in res.stdout)
    res = run_cli(["schedule", "--interval", "0.3", "--idle-timeout", "1", "--dry-run"],
                  pg_url=pg_url, schema=schema)
    assert res.returncode == 2 and "--interval 0.3 s is not longer" in res.stderr
    res = run_cli([*ARGS[:-4], "--max-sleep", "1", "--idle-timeout", "5", "--dry-run"],
                  pg_url=pg_url, schema=schema)
    assert res.returncode == 2
    assert "--max-sleep 1.0 s is not longer than the 5.0 s idle timeout" in res.stderr
    res = run_cli([*ARGS, "--wake-policy", "sometimes"], pg_url=pg_url, schema=schema)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    res = run_cli([*ARGS, "--no-auth", "--dry-run"], pg_url=pg_url, schema=schema)
    assert res.returncode == 2 and "--no-auth only goes with --listen" in res.stderr
    res = run_cli([*ARGS, "--listen", "nowhere", "--dry-run"], pg_url=pg_url, schema=schema,
                  DRAINER_TRIGGER_TOKEN="longer-token")
    assert res.returncode == 2 and "--listen: expected HOST:PORT" in res.stderr
    res = run_cli([*ARGS, "--listen", "127.0.0.1:0", "--dry-run"], pg_url=pg_url,
                  schema=schema)
    assert res.returncode == 2 and "no trigger token" in res.stderr


def test_known_work_starts_without_interval_or_cron(
        migrated: Settings, conn: psycopg.Connection[Any], pg_url: str) -> None:
    """known-work knows when to wake: with no --interval or --cron it looks every second,
    drains in full at the start, and wakes for the later job the start saw once it is due
    and the idle timeout has passed."""
    from psycopg import sql

    schema = migrated.schema_name
    first = insert_plain(conn, schema, "noop")
    later = conn.execute(sql.SQL("INSERT INTO {} (queue, payload, run_at) VALUES ('noop', "
                                 "'{{}}', now() + interval '2 seconds') RETURNING id").format(
                             sql.Identifier(schema, "jobs"))).fetchone()
    assert later is not None
    proc = DrainerProcess(["schedule", "--wake-policy", "known-work", "--max-sleep", "1h",
                           "--idle-timeout", "1"], pg_url=pg_url, schema=schema,
                          DRAINER_APP="sample_jobs", DRAINER_LOG_LEVEL="DEBUG")
    try:
        proc.wait_log("wake: start: one full drain", timeout=20)
        assert proc.wait_log("scheduled: every 1.0 s", timeout=5)
        proc.wait_log("wake: retry due", timeout=20)
        deadline = time.monotonic() + 10
        while status(conn, schema, later[0]) != "done":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert status(conn, schema, first) == "done"
        assert proc.terminate() == 0
        assert [r["succeeded"] for r in reports(proc.stdout)] == [1, 1]
    finally:
        proc.kill()
    res = run_cli(["schedule", "--idle-timeout", "1", "--dry-run"], pg_url=pg_url,
                  schema=schema)
    assert res.returncode == 2
    assert ("give either --interval SECONDS or --cron 'm h dom mon dow': when to wake and "
            "drain (--wake-policy known-work needs neither") in res.stderr
