"""What the server says is what the command says: disk full, read-only, a terminated
session, no connection slot, each with its own one line and exit code, none of them
"database connection lost" (exit 3)."""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.errors import (
    EXIT_READ_ONLY,
    EXIT_SERVER_RESOURCES,
    EXIT_SERVER_SHUTDOWN,
    EXIT_TIMEOUT,
)
from drainer.migrate import migrate
from drainer.producer import enqueue
from tests._cluster import Cluster, cluster  # noqa: F401 - a fixture
from tests.conftest import cli_env, finish, run_cli

APP = ["--app", "condition_jobs"]


def _one_line(stderr: str, *words: str) -> str:
    lines = [ln for ln in stderr.splitlines() if "drainer run-once:" in ln
             or "drainer status:" in ln]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr and "connection lost" not in stderr, stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def small_mount(cluster: Cluster) -> Iterator[Path]:  # noqa: F811
    """A 3 MB tmpfs in the cluster's directory (which the server's user can reach), owned
    by that user, for a tablespace that fills up."""
    where = cluster.root / "small"
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
    try:
        owner = pwd.getpwuid(cluster.root.stat().st_uid)
        os.chown(where, owner.pw_uid, owner.pw_gid)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_disk_full_is_said_so_with_exit_8(cluster: Cluster,  # noqa: F811
                                          small_mount: Path) -> None:
    with cluster.connect() as c:
        migrate(c, "drainer", "jobs")
        c.execute(sql.SQL("CREATE TABLESPACE small LOCATION {}").format(
            sql.Literal(str(small_mount))))
        c.execute("ALTER TABLE drainer.jobs SET TABLESPACE small")
        for i in range(200):
            enqueue(c, "quick", {"n": i})
        # the rest of the tablespace: a filler table up to the last page
        c.execute("CREATE TABLE drainer.filler (pad text) TABLESPACE small")
        with contextlib.suppress(psycopg.errors.DiskFull):
            for _ in range(10_000):
                c.execute("INSERT INTO drainer.filler SELECT repeat('x', 1500) "
                          "FROM generate_series(1, 50)")
        with contextlib.suppress(psycopg.errors.DiskFull):
            for _ in range(10_000):
                c.execute("INSERT INTO drainer.filler VALUES (repeat('x', 1500))")
    result = run_cli(["run-once", *APP], pg_url=cluster.url, schema="drainer")
    assert result.returncode == EXIT_SERVER_RESOURCES, result.stderr
    _one_line(result.stderr, "disk is full", "SQLSTATE 53100")


def test_a_read_only_database_is_said_so_with_exit_9(own_database_url: str) -> None:
    with psycopg.connect(own_database_url, autocommit=True) as c:
        migrate(c, "drainer", "jobs")
        enqueue(c, "quick", {})
        c.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(
            sql.Identifier(c.info.dbname)))
    result = run_cli(["run-once", *APP], pg_url=own_database_url, schema="drainer")
    assert result.returncode == EXIT_READ_ONLY, result.stderr
    _one_line(result.stderr, "read-only", "SQLSTATE 25006", "primary")


def test_a_terminated_session_is_said_so_with_exit_10(
        pg_url: str, schema: str, conn: psycopg.Connection[Any]) -> None:
    migrate(conn, schema, "jobs")
    enqueue(conn, "nap", {"s": 3}, schema=schema)
    name = f"cond-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "drainer", "run-once", *APP], text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=cli_env(pg_url, schema, DRAINER_APPLICATION_NAME=name))
    deadline = time.monotonic() + 20
    terminated: list[Any] = []
    while not terminated and time.monotonic() < deadline:
        running = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE status = 'running'")
                               .format(sql.Identifier(schema, "jobs"))).fetchone()
        if running == (1,):
            terminated = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s", [name]).fetchall()
        time.sleep(0.05)
    assert terminated, "the run never started its job"
    code, _out, err = finish(proc, 60)
    assert code == EXIT_SERVER_SHUTDOWN, err
    _one_line(err, "ended the session", "SQLSTATE 57P01")


def test_no_connection_slot_is_said_so_with_exit_8(
        pg_url: str, schema: str, conn: psycopg.Connection[Any]) -> None:
    role = f"{schema}_nolimit"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 0").format(
        sql.Identifier(role)))
    try:
        url = psycopg.conninfo.make_conninfo(pg_url, user=role)
        result = run_cli(["status"], pg_url=url, schema=schema)
    finally:
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    assert result.returncode == EXIT_SERVER_RESOURCES, result.stderr
    _one_line(result.stderr, "no connection slot", "SQLSTATE 53300")


def test_a_cancelled_statement_is_said_cancelled_not_a_timeout(
        pg_url: str, schema: str, conn: psycopg.Connection[Any]) -> None:
    """pg_cancel_backend of the drain's statement: exit 5 as for a timeout, but the line
    says it was cancelled and points to no timeout flag (none fired)."""
    migrate(conn, schema, "jobs")
    name = f"cancel-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url) as blocker:
        blocker.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
            sql.Identifier(schema, "jobs")))
        proc = subprocess.Popen(
            [sys.executable, "-m", "drainer", "run-once", *APP, "--lock-timeout", "0",
             "--statement-timeout", "0"], text=True, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=cli_env(pg_url, schema, DRAINER_APPLICATION_NAME=name))
        cancelled: list[Any] = []
        deadline = time.monotonic() + 20
        while not cancelled and time.monotonic() < deadline:
            cancelled = conn.execute(
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name "
                "= %s AND wait_event_type = 'Lock'", [name]).fetchall()
            time.sleep(0.05)
        code, _out, err = finish(proc, 60)
    assert cancelled, "the run never waited for the lock"
    assert code == EXIT_TIMEOUT, err
    line = [ln for ln in err.splitlines() if ln.startswith("drainer run-once:")]
    assert len(line) == 1 and line[0].startswith("drainer run-once: cancelled: "), err
    assert "--statement-timeout" not in err and "timeout" not in line[0].split(": ", 2)[1]
    assert "pg_cancel_backend" in line[0]
