"""Helpers of the reliability tests: drainer subprocesses, execution logs, table snapshots."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from drainer.producer import JobSpec, enqueue_many
from tests.conftest import ROOT, cli_env, finish


def start_drainer(args: list[str], *, pg_url: str, schema: str, log_dir: Path,
                  app: str = "rel_jobs", **env: str) -> subprocess.Popen[str]:
    """Start ``drainer <args>`` with the ``app`` module of tests/apps/; executions go to
    ``log_dir``."""
    return subprocess.Popen(
        [sys.executable, "-m", "drainer", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env=cli_env(pg_url, schema, DRAINER_APP=app, REL_LOG_DIR=str(log_dir),
                    DRAINER_LOG_FORMAT="json", **env),
    )


def run_once(pg_url: str, schema: str, log_dir: Path, *args: str, app: str = "rel_jobs",
             timeout: float = 60, **env: str) -> tuple[int, str, str]:
    """``drainer run-once <args>`` to its end: (exit code, stdout, stderr)."""
    return finish(start_drainer(["run-once", *args], pg_url=pg_url, schema=schema,
                                log_dir=log_dir, app=app, **env), timeout=timeout)


def run_once_through_deaths(conn: psycopg.Connection[Any], pg_url: str, schema: str,
                            log_dir: Path, runs: int, *, app: str = "rel_jobs") -> None:
    """Up to ``runs`` ``run-once --lease 1``, each after the last one's leases expired,
    until one exits 0: a job that kills its process is run until it is given up."""
    for _ in range(runs):
        code, _out, _err = run_once(pg_url, schema, log_dir, "--lease", "1", app=app)
        if code == 0:
            return
        wait_leases_expired(conn, schema)


def enqueue_jobs(conn: psycopg.Connection[Any], schema: str, n: int, queue: str = "rec",
                 **kw: Any) -> None:
    """``n`` jobs ``{"n": i}`` on ``queue`` (JobSpec options in ``kw``)."""
    enqueue_many(conn, [JobSpec(queue, {"n": i}, **kw) for i in range(n)], schema=schema)


def executions(log_dir: Path, event: str = "start") -> list[tuple[int, int, int]]:
    """Every recorded ``(job_id, attempt, pid)`` of one event, in no particular order."""
    out = []
    for f in log_dir.glob("*.log"):
        for line in f.read_text().splitlines():
            job_id, attempt, pid, ev = line.split()
            if ev == event:
                out.append((int(job_id), int(attempt), int(pid)))
    return out


def runs_per_job(log_dir: Path) -> Counter[int]:
    return Counter(job_id for job_id, _a, _p in executions(log_dir))


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s."""
    until = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > until:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def jobs(conn: psycopg.Connection[Any], schema: str, table: str = "jobs"
         ) -> dict[int, dict[str, Any]]:
    """The whole jobs table by id (status, attempts, max_attempts, last_error, lease)."""
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    cur.execute(sql.SQL(
        "SELECT id, queue, status, attempts, max_attempts, last_error, "
        "locked_until, locked_until < now() AS expired, run_at, finished_at, fence, charged, "
        "suspect FROM {}"
    ).format(sql.Identifier(schema, table)))
    return {r["id"]: r for r in cur.fetchall()}


def status_counts(conn: psycopg.Connection[Any], schema: str) -> dict[str, int]:
    return dict(Counter(r["status"] for r in jobs(conn, schema).values()))


def wait_leases_expired(conn: psycopg.Connection[Any], schema: str,
                        timeout: float = 15) -> None:
    """Until every running job's lease has expired (the reaper may take them back)."""
    wait_for(lambda: all(r["expired"] for r in jobs(conn, schema).values()
                         if r["status"] == "running"), timeout, "the leases to expire")


SECRET = "S3cretPw_xyz"


def secret_dsn(pg_url: str) -> tuple[str, str] | None:
    """A working DSN holding a recognisable password, and that password; None when the
    server checks passwords and the test URL has none."""
    from drainer._redact import password_of
    from tests.conftest import _reachable

    existing = password_of(pg_url)
    if existing:
        return pg_url, existing
    scheme, rest = pg_url.split("://", 1)
    userinfo, host = rest.split("@", 1)
    url = f"{scheme}://{userinfo.split(':', 1)[0]}:{SECRET}@{host}"
    return (url, SECRET) if _reachable(url) else None
