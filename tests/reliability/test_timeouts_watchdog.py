"""Timeouts are not lost connections, maintenance has its own budget, every connection
notices a dead peer, and --max-runtime bounds the process even when the server freezes. On
the real database; what freezes a server runs on the test's own cluster (tests/_cluster.py)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer import db
from drainer.db.connect import KEEPALIVE_COUNT
from drainer.drain.watchdog import WATCHDOG_EXIT_AFTER_S, WATCHDOG_MARGIN_S
from drainer.errors import EXIT_TIMEOUT, EXIT_WATCHDOG
from drainer.migrate import migrate
from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings
from tests._cluster import Cluster, cluster  # noqa: F401  (the fixture)
from tests.conftest import finish, run_cli
from tests.reliability._helpers import (
    enqueue_jobs,
    executions,
    jobs,
    start_drainer,
    status_counts,
    wait_for,
)

Conn = psycopg.Connection[Any]


def test_keepalive_options_notice_a_dead_peer_within_the_setting() -> None:
    opts = db.keepalive_options(10)
    assert opts["keepalives"] == 1 and opts["tcp_user_timeout"] == 10_000
    # idle + interval * count: an idle connection notices a dead peer within the setting
    assert opts["keepalives_idle"] + opts["keepalives_interval"] * opts["keepalives_count"] <= 10
    assert db.keepalive_options(0) == {}
    assert db.keepalive_options(1)["keepalives_idle"] >= 1


def test_every_connection_sets_keepalives_and_tcp_user_timeout(settings: Settings) -> None:
    for purpose in ("work", "heartbeat", "listen"):
        with db.connect(settings, purpose=purpose) as c:
            params = c.info.get_parameters()
            assert params.get("keepalives") == "1", (purpose, params)
            assert params.get("tcp_user_timeout") == str(int(settings.dead_peer_timeout * 1000))
            assert params.get("keepalives_count") == str(KEEPALIVE_COUNT)


def _lock_table(pg_url: str, schema: str, mode: str) -> Conn:
    blocker = psycopg.connect(pg_url)
    blocker.execute(sql.SQL("LOCK TABLE {} IN {} MODE").format(
        sql.Identifier(schema, "jobs"), sql.SQL(mode)))
    return blocker


@pytest.mark.parametrize(("flags", "kind"), [
    (["--lock-timeout", "1"], "lock timeout"),
    (["--lock-timeout", "0", "--statement-timeout", "1"], "statement timeout"),
], ids=["lock_timeout", "statement_timeout"])
def test_a_timeout_is_not_a_lost_connection(migrated: Settings, pg_url: str,
                                            flags: list[str], kind: str) -> None:
    schema = migrated.schema_name
    blocker = _lock_table(pg_url, schema, "ACCESS EXCLUSIVE")
    try:
        p = run_cli(["run-once", "--app", "sample_jobs", *flags], pg_url=pg_url, schema=schema,
                    timeout=60)
    finally:
        blocker.close()
    lines = p.stderr.strip().splitlines()
    assert p.returncode == EXIT_TIMEOUT, (p.returncode, p.stderr[-1000:])
    assert lines[-1].startswith(f"drainer run-once: {kind}: "), lines[-1]
    assert "connection lost" not in p.stderr and "Traceback" not in p.stderr


def test_a_vacuum_cancelled_by_the_lock_timeout_is_a_warning(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    """With the default lock_timeout a VACUUM waiting for its lock is cancelled: the run
    whose jobs are done still exits 0 with its report, vacuumed false."""
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("rec", {"n": i}) for i in range(5)], schema=schema)
    conn.execute(sql.SQL("UPDATE {} SET priority = priority").format(
        sql.Identifier(schema, "jobs")))
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")
    blocker = _lock_table(pg_url, schema, "SHARE UPDATE EXCLUSIVE")
    try:
        proc = start_drainer(["run-once", "--vacuum-threshold", "1", "--lock-timeout", "1"],
                             pg_url=pg_url, schema=schema, log_dir=tmp_path)
        code, out, err = finish(proc, timeout=60)
    finally:
        blocker.close()
    assert code == 0, err[-1500:]
    report = json.loads(out)
    assert report["succeeded"] == 5 and report["vacuumed"] is False, report
    assert "cancelled by lock timeout" in err


def test_the_vacuum_runs_under_maintenance_timeout_not_statement_timeout(
        migrated: Settings, pg_url: str) -> None:
    """The end of run's VACUUM held on a lock: under a session statement_timeout of 0.3 s
    and a maintenance timeout of 30 s it waits for the lock and runs; under 30 s and 0.3 s
    it is cancelled within the maintenance timeout. Either way the session's
    statement_timeout is back after it, as after the VACUUM between batches (which skips
    a locked table rather than wait)."""
    from drainer.maintenance.vacuum import timeout_kind

    schema = migrated.schema_name

    def vacuum(session: float, maintenance: float, hold: float) -> tuple[Any, float, Any]:
        s = migrated.model_copy(update={"statement_timeout": session, "lock_timeout": 0.0})
        with db.connect(s) as c:
            q = db.Queries(c, s.schema_name, s.table)
            blocker = _lock_table(pg_url, schema, "SHARE UPDATE EXCLUSIVE")
            timer = threading.Timer(hold, blocker.close)
            timer.start()
            started, error = time.monotonic(), None
            try:
                q.vacuum_after_drain(analyze=False, timeout=maintenance)
            except psycopg.errors.QueryCanceled as exc:
                error = exc
            took = time.monotonic() - started
            timer.join()
            return error, took, c.execute("SHOW statement_timeout").fetchone()

    error, took, after = vacuum(0.3, 30.0, 1.0)
    assert error is None and took >= 0.9 and after == ("300ms",)
    error, took, after = vacuum(30.0, 0.3, 5.0)
    assert timeout_kind(error) == "statement timeout" and took < 4.0, (error, took)
    assert after == ("30s",)
    s = migrated.model_copy(update={"statement_timeout": 0.3})
    with db.connect(s) as c:
        db.Queries(c, s.schema_name, s.table).vacuum_during_drain(30.0)
        assert c.execute("SHOW statement_timeout").fetchone() == ("300ms",)


def test_an_end_of_run_vacuum_held_past_the_statement_timeout_does_not_fail_the_run(
        migrated: Settings, conn: Conn, pg_url: str, tmp_path: Path) -> None:
    """--lock-timeout 0: the VACUUM waits for its lock longer than --statement-timeout
    (what a VACUUM longer than the statement timeout looks like); the run whose jobs are
    done still exits 0 with its report, whether the VACUUM then runs or is cancelled."""
    schema = migrated.schema_name
    enqueue_jobs(conn, schema, 20)
    table = sql.Identifier(schema, "jobs")
    conn.execute(sql.SQL("UPDATE {} SET priority = priority").format(table))  # dead tuples
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")
    # VACUUM waits for this lock (claims and completions do not)
    blocker = _lock_table(pg_url, schema, "SHARE UPDATE EXCLUSIVE")
    try:
        proc = start_drainer(["run-once", "--vacuum-threshold", "1", "--statement-timeout",
                              "2", "--lock-timeout", "0"], pg_url=pg_url, schema=schema,
                             log_dir=tmp_path)
        wait_for(lambda: status_counts(conn, schema) == {"done": 20}, 30, "the 20 jobs")
        # past statement_timeout; then the lock goes (a run that waits must not hang here)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    finally:
        blocker.close()
    code, out, err = finish(proc, timeout=60)
    assert status_counts(conn, schema) == {"done": 20}
    last = err.strip().splitlines()[-1:] if err.strip() else []
    assert code == 0, f"run-once exit {code} after all 20 jobs were done: {last}"
    assert json.loads(out)["succeeded"] == 20


def test_max_runtime_is_a_hard_bound_when_the_server_freezes(
        cluster: Cluster, tmp_path: Path) -> None:  # noqa: F811
    """Frozen mid-drain: run-once --max-runtime 5 prints its report (stopped_by
    max_runtime) and exits 0 within max_runtime + margin + the exit delay; after the thaw,
    the jobs it held come back through the reaper: none lost, none done twice in a lease."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with cluster.connect() as c:
        migrate(c, schema, "jobs")
        enqueue_many(c, [JobSpec("rec", {"n": i, "sleep": 0.2}) for i in range(40)],
                     schema=schema)
    proc = start_drainer(["run-once", "--max-runtime", "5", "--lease", "2", "--batch-size",
                          "2", "--connect-timeout", "2"], pg_url=cluster.url, schema=schema,
                         log_dir=tmp_path)
    started = time.monotonic()
    try:
        wait_for(lambda: len(executions(tmp_path)) >= 3, 20, "jobs to start")
        cluster.freeze()
        bound = 5 + WATCHDOG_MARGIN_S + WATCHDOG_EXIT_AFTER_S + 2  # + 2 s of slack: load
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(1.0, started + bound + 10 - time.monotonic()))
        took = time.monotonic() - started
    finally:
        cluster.thaw()
        if proc.poll() is None:
            proc.kill()
    code, out, err = finish(proc, timeout=10)
    print(f"frozen mid-drain: exit {code} {took:.1f}s after the start")
    assert took < bound, f"exit {code} {took:.1f}s after the start (bound {bound}s): {err[-3000:]}"
    assert code == 0, err[-1500:]
    report = json.loads(out)
    assert report["stopped_by"] == "max_runtime", report
    # the leases it held expire; the next run reaps them and drains everything
    with cluster.connect() as c:
        wait_for(lambda: all(r["expired"] for r in jobs(c, schema).values()
                             if r["status"] == "running"), 15, "the leases to expire")
    proc = start_drainer(["run-once", "--lease", "30"], pg_url=cluster.url, schema=schema,
                         log_dir=tmp_path)
    code, out, err = finish(proc, timeout=60)
    assert code == 0, err[-1500:]
    with cluster.connect() as c:
        assert {r["status"] for r in jobs(c, schema).values()} == {"done"}


def test_the_watchdog_exits_when_even_connecting_hangs(
        cluster: Cluster, tmp_path: Path) -> None:  # noqa: F811
    """Frozen before the run connects (the kernel accepts, nothing answers, connect
    retries go on): nothing to cut, so run-once exits EXIT_WATCHDOG with one line."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with cluster.connect() as c:
        migrate(c, schema, "jobs")
    cluster.freeze()
    try:
        started = time.monotonic()
        proc = start_drainer(["run-once", "--max-runtime", "2", "--connect-timeout", "2",
                              "--connect-retries", "10"], pg_url=cluster.url, schema=schema,
                             log_dir=tmp_path)
        code, _out, err = finish(proc, timeout=30)
        took = time.monotonic() - started
    finally:
        cluster.thaw()
    print(f"frozen before connecting: exit {code} {took:.1f}s after the start")
    assert code == EXIT_WATCHDOG, (code, err[-1500:])
    assert took < 2 + WATCHDOG_MARGIN_S + WATCHDOG_EXIT_AFTER_S + 3, took
    last = err.strip().splitlines()[-1]
    assert last.startswith("drainer run-once: still running") and "--max-runtime" in last


def test_timeout_kinds_name_what_ended_the_statement(pg_url: str) -> None:
    with psycopg.connect(pg_url, options="-c idle_in_transaction_session_timeout=300") as c:
        c.execute("SELECT 1")
        time.sleep(0.8)
        with pytest.raises(psycopg.Error) as idle:
            c.execute("SELECT 2")
    assert db.timeout_kind(idle.value) == "idle-in-transaction timeout"
    with psycopg.connect(pg_url, autocommit=True, options="-c statement_timeout=100") as c, \
            pytest.raises(psycopg.errors.QueryCanceled) as cancelled:
        c.execute("SELECT pg_sleep(2)")
    assert db.timeout_kind(cancelled.value) == "statement timeout"
    assert db.timeout_kind(psycopg.OperationalError("server closed the connection")) is None
