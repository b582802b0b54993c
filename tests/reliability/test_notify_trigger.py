"""The notify trigger (``drainer migrate --notify-trigger``): six migrations at once all
succeed, and its payload stays within NOTIFY's limit whatever the queue name, so a long one
still enqueues and the listener still wakes."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import psycopg

from drainer.migrate import install_notify_trigger, migrate
from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings
from tests.conftest import ROOT, cli_env, run_cli

Conn = psycopg.Connection[Any]


def test_concurrent_migrate_notify_trigger_all_succeed(pg_url: str, schema: str,
                                                        conn: Conn) -> None:
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
            # (should the lock change, go on after 20 s regardless: the race is still run)
            until = time.monotonic() + 20
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


def test_the_notify_payload_is_bounded_and_the_listener_still_wakes(
        migrated: Settings, conn: Conn, pg_url: str) -> None:
    schema = migrated.schema_name
    install_notify_trigger(conn, schema, "jobs")
    install_notify_trigger(conn, schema, "jobs")  # idempotent
    with psycopg.connect(pg_url, autocommit=True) as listen:
        listen.execute("LISTEN drainer")
        enqueue_many(conn, [JobSpec("q" * 9000, {}), JobSpec("short", {})], schema=schema)
        got = [n.payload for n in listen.notifies(timeout=5, stop_after=2)]
    assert sorted(got) == ["", "short"], got  # '': look at every queue (drainer worker does)



def test_a_long_queue_name_enqueues_with_the_notify_trigger(
        pg_url: str, schema: str) -> None:
    p = run_cli(["migrate", "--notify-trigger"], pg_url=pg_url, schema=schema)
    assert p.returncode == 0, p.stderr
    p = run_cli(["enqueue", "q" * 9000, "{}"], pg_url=pg_url, schema=schema)
    assert p.returncode == 0, (p.returncode, p.stderr.strip()[-500:])
