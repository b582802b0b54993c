"""drainer through a real PgBouncer in transaction mode, with the settings the README documents.

Every command the README lists as working through a transaction-mode pooler runs through
the suite's own PgBouncer (tests/_pgbouncer.py): migrate, run-once (pipelined and not),
enqueue (one, and COPY from the library and from stdin), status, jobs, show, retry,
cancel, schedule, and the heartbeat that keeps a long job's lease. And a pooler that
rejects drainer's startup options gets a clear message and exit 2 at once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

from drainer.migrate import migrate
from drainer.producer import JobSpec, enqueue_many
from tests._pgbouncer import Bouncer, pgbouncer  # noqa: F401  (the fixture)
from tests.conftest import ROOT, cli_env, run_cli
from tests.reliability._helpers import executions, finish, jobs, runs_per_job, start_drainer

Conn = psycopg.Connection[Any]


def through(bouncer: Bouncer, args: list[str], schema: str, *, input: str | None = None,
            **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(args, pg_url=bouncer.url, schema=schema, input=input, timeout=60,
                   DRAINER_APP="rel_jobs", **{**bouncer.drainer_env(), **env})


def ok_json(bouncer: Bouncer, args: list[str], schema: str, **env: str) -> Any:
    p = through(bouncer, args, schema, **env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def pooled(bouncer: Bouncer) -> Conn:
    """A library connection through the pooler, as the README says to open one."""
    conn = psycopg.connect(bouncer.url, autocommit=True)
    if not bouncer.supports_prepared_statements:
        conn.prepare_threshold = None
    return conn


def test_the_suites_pgbouncer_is_transaction_mode(pgbouncer: Bouncer) -> None:  # noqa: F811
    with pooled(pgbouncer) as a, pooled(pgbouncer) as b:
        # in transaction mode two statements of one client may land on different server
        # connections; a session-level SET must not be relied upon (drainer never does)
        pids = {a.execute("SELECT pg_backend_pid()").fetchone()[0] for _ in range(3)}  # type: ignore[index]
        assert pids
        b.execute("SELECT 1")
    assert pgbouncer.version >= (1, 18)


@pytest.mark.parametrize("depth", ["1", "2"])
def test_migrate_enqueue_and_drain_through_pgbouncer(
        pgbouncer: Bouncer, schema: str, tmp_path: Path, depth: str) -> None:  # noqa: F811
    p = through(pgbouncer, ["migrate"], schema)
    assert p.returncode == 0, p.stderr
    # one job from the CLI, many from stdin (COPY), many from the library (COPY)
    p = through(pgbouncer, ["enqueue", "rec", '{"n": 0}'], schema)
    assert p.returncode == 0, p.stderr
    lines = "".join(json.dumps({"n": i}) + "\n" for i in range(1, 41))
    p = through(pgbouncer, ["enqueue", "rec"], schema, input=lines)
    assert p.returncode == 0, p.stderr
    with pooled(pgbouncer) as conn:
        enqueue_many(conn, [JobSpec("rec", {"n": i}) for i in range(41, 101)], schema=schema)
        assert len(jobs(conn, schema)) == 101

    env = {**pgbouncer.drainer_env(), "DRAINER_PIPELINE_DEPTH": depth,
           "DRAINER_BATCH_SIZE": "7", "DRAINER_CONCURRENCY": "2"}
    code, out, err = finish(start_drainer(["run-once"], pg_url=pgbouncer.url, schema=schema,
                                          log_dir=tmp_path, **env), timeout=60)
    assert code == 0, err[-3000:]
    report = json.loads(out)
    assert report["succeeded"] == 101 and report["failed"] == 0, report
    assert set(runs_per_job(tmp_path).values()) == {1}
    with pooled(pgbouncer) as conn:
        assert {r["status"] for r in jobs(conn, schema).values()} == {"done"}


def test_status_and_operator_commands_through_pgbouncer(
        pgbouncer: Bouncer, schema: str, conn: Conn) -> None:  # noqa: F811
    assert through(pgbouncer, ["migrate"], schema).returncode == 0
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    with pooled(pgbouncer) as pc:
        enqueue_many(pc, [JobSpec("p_raise", {"n": i}, max_attempts=1) for i in range(3)]
                     + [JobSpec("rec", {"n": i}, run_at=later) for i in range(2)],
                     schema=schema)
    report = ok_json(pgbouncer, ["run-once"], schema)
    assert report["failed"] == 3, report

    st = ok_json(pgbouncer, ["status", "--json"], schema)
    assert st["totals"]["failed"] == 3 and st["queues"]["p_raise"]["failed"] == 3
    failed = ok_json(pgbouncer, ["jobs", "--status", "failed"], schema)
    assert len(failed) == 3
    first = failed[0]["id"]
    shown = ok_json(pgbouncer, ["show", str(first)], schema)
    assert "poison: always raises" in shown["last_error"]

    retried = ok_json(pgbouncer, ["retry", "--id", str(first)], schema)
    assert retried["retried"] == 1
    assert ok_json(pgbouncer, ["retry", "--queue", "p_raise"], schema)["retried"] == 2
    delayed = [j["id"] for j in ok_json(pgbouncer, ["jobs", "--queue", "rec"], schema)]
    cancelled = ok_json(pgbouncer, ["cancel", "--id", *map(str, delayed)], schema)
    assert cancelled["cancelled"] == 2
    rows = jobs(conn, schema)
    assert sorted(r["status"] for r in rows.values()) == ["failed"] * 2 + ["queued"] * 3


def test_schedule_through_pgbouncer(pgbouncer: Bouncer, schema: str, conn: Conn,  # noqa: F811
                                    tmp_path: Path) -> None:
    assert through(pgbouncer, ["migrate"], schema).returncode == 0
    enqueue_many(conn, [JobSpec("rec", {"n": i}) for i in range(5)], schema=schema)
    env = cli_env(pgbouncer.url, schema, DRAINER_APP="rel_jobs", REL_LOG_DIR=str(tmp_path),
                  DRAINER_LOG_FORMAT="json", **pgbouncer.drainer_env())
    proc = subprocess.Popen(
        [sys.executable, "-m", "drainer", "schedule", "--interval", "1", "--idle-timeout",
         "0.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while len(executions(tmp_path)) < 5 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.1)
        # a second wake, after the first drained everything, finds nothing
        enqueue_many(conn, [JobSpec("rec", {"n": 5})], schema=schema)
        while len(executions(tmp_path)) < 6 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-3000:]
    reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert sum(r.get("succeeded", 0) for r in reports) == 6, (reports, err[-2000:])
    assert set(runs_per_job(tmp_path).values()) == {1}
    assert "error" not in {json.loads(x).get("level") for x in err.splitlines()
                           if x.startswith("{")}, err[-3000:]


def test_heartbeat_through_pgbouncer_keeps_a_long_jobs_lease(
        pgbouncer: Bouncer, schema: str, conn: Conn, tmp_path: Path) -> None:  # noqa: F811
    migrate(conn, schema, "jobs")
    enqueue_many(conn, [JobSpec("rec", {"sleep": 4})], schema=schema)
    env = pgbouncer.drainer_env()
    slow = start_drainer(["run-once", "--lease", "1"], pg_url=pgbouncer.url, schema=schema,
                         log_dir=tmp_path, **env)
    deadline = time.monotonic() + 20
    while not executions(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert executions(tmp_path), "the long job did not start"
    # three leases later, the job is still leased: other drainers find nothing to reap
    time.sleep(3)
    (row,) = jobs(conn, schema).values()
    assert row["status"] == "running" and not row["expired"], row
    code, out, err = finish(start_drainer(["run-once"], pg_url=pgbouncer.url, schema=schema,
                                          log_dir=tmp_path, **env), timeout=30)
    assert code == 0, err[-2000:]
    assert json.loads(out)["claimed"] == 0
    code, out, err = finish(slow, timeout=30)
    assert code == 0, err[-2000:]
    assert json.loads(out)["succeeded"] == 1
    assert runs_per_job(tmp_path) == {row["id"]: 1}
    assert jobs(conn, schema)[row["id"]]["status"] == "done"


def test_a_pooler_that_rejects_the_startup_options_is_a_config_error(
        pgbouncer: Bouncer, schema: str) -> None:  # noqa: F811
    started = time.monotonic()
    p = run_cli(["status"], pg_url=pgbouncer.url, schema=schema, timeout=60,
                DRAINER_SESSION_OPTIONS="true", DRAINER_CONNECT_RETRIES="5")
    elapsed = time.monotonic() - started
    # PgBouncer < 1.20 rejects 'options' altogether, later ones the settings they do not
    # track (statement_timeout among them): the same message, the same answer
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert elapsed < 5, f"retried for {elapsed:.1f}s"
    assert "unsupported startup parameter" in p.stderr
    assert "DRAINER_SESSION_OPTIONS=false" in p.stderr and "ALTER ROLE" in p.stderr
    assert "retrying" not in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
