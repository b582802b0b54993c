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
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.migrate import migrate
from drainer.producer import JobSpec, enqueue_many
from tests._pgbouncer import POOL_SIZE, Bouncer, pgbouncer  # noqa: F401  (the fixture)
from tests.conftest import ROOT, cli_env, finish, run_cli
from tests.reliability._helpers import executions, jobs, runs_per_job, start_drainer

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
    assert sorted(r["status"] for r in rows.values()) == ["cancelled"] * 2 + ["queued"] * 3


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
        _, out, err = finish(proc, 30)
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
    p = run_cli(["status"], pg_url=pgbouncer.url, schema=schema, timeout=60,
                DRAINER_SESSION_OPTIONS="true", DRAINER_CONNECT_RETRIES="5")
    # PgBouncer < 1.20 rejects 'options' altogether, later ones the settings they do not
    # track (statement_timeout among them): the same message, the same answer
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "unsupported startup parameter" in p.stderr
    assert "DRAINER_SESSION_OPTIONS=false" in p.stderr and "ALTER ROLE" in p.stderr
    # not retried: each retry logs "connect attempt N/6 failed ...; retrying" (a bound on
    # the elapsed time said the same, and failed on a loaded machine)
    assert "retrying" not in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def _on_every_server_session(bouncer: Bouncer, *statements: str) -> None:
    """Run ``statements`` on each server session of the pool: POOL_SIZE clients each hold
    a transaction at once, so each holds a session of its own."""
    clients = [psycopg.connect(bouncer.url, prepare_threshold=None) for _ in range(POOL_SIZE)]
    try:
        for c in clients:
            for statement in statements:
                c.execute(statement)
        for c in clients:
            c.commit()
    finally:
        for c in clients:
            c.close()


#: jobs a command's table holds, one claim each (batch size 1): enough for psycopg to prepare
#: the claim (its 6th run on a connection) and for the pipeline's transactions to move
JOBS = 40


def _busy_client(bouncer: Bouncer, stop: threading.Event) -> None:
    with psycopg.connect(bouncer.url, autocommit=True, prepare_threshold=None) as c:
        while not stop.is_set():
            c.execute("SELECT 1")


def _ended(proc: subprocess.Popen[str], timeout: float) -> tuple[int | None, str]:
    """The exit code (None: still running after ``timeout``, then killed) and stderr."""
    try:
        _out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate()
        return None, err
    return proc.returncode, err


@pytest.mark.slow
def test_a_prepared_statement_clash_through_the_pooler_is_a_config_error(
        pgbouncer: Bouncer, schema: str, conn: Conn, tmp_path: Path) -> None:  # noqa: F811
    """DRAINER_PREPARED_STATEMENTS on (the wrong setting for PgBouncer < 1.21) while other
    clients use the pool: psycopg prepares a statement run often enough on one connection
    under the name "_pg3_0", which another client's session already holds, or a statement
    prepared in one transaction runs in the next on a session that never saw it. Every
    command that repeats a statement exits 2 with one line that says what to set (before:
    exit 1 with the raw error; the worker logged it and went on, failing every drain)."""
    clashes = not pgbouncer.supports_prepared_statements
    done_long_ago = {"n": 0}
    commands: dict[str, tuple[list[str], dict[str, str]]] = {
        "run-once": (["run-once"], {"DRAINER_PIPELINE_DEPTH": "1"}),
        "run-once-pipelined": (["run-once"], {"DRAINER_PIPELINE_DEPTH": "2"}),
        "worker": (["worker", "--min-poll-interval", "1", "--max-poll-interval", "1"],
                   {"DRAINER_PIPELINE_DEPTH": "1"}),
        "purge": (["purge", "--status", "done", "--older-than", "1h"],
                  {"DRAINER_ARCHIVE_BATCH_SIZE": "1"}),
        # long-running: the failed drain is logged, the process goes on (stopped below)
        "schedule": (["schedule", "--interval", "1", "--idle-timeout", "0.5"],
                     {"DRAINER_PIPELINE_DEPTH": "1"}),
        # one statement each: never prepared, so never a clash, whatever the pooler
        "status": (["status", "--json"], {}),
        "enqueue": (["enqueue", "rec", '{"n": 99}'], {}),
    }
    for name in commands:
        migrate(conn, schema, name.replace("-", "_"))
        # 20 ms jobs: claims stay at a job or two (what runs in half the clock's limit), so
        # that a drain repeats its claim often enough for psycopg to prepare it; no-op jobs
        # grow the second claim to the whole queue
        enqueue_many(conn, [JobSpec("rec", done_long_ago if name == "purge"
                                    else {"n": i, "sleep": 0.02})
                            for i in range(JOBS)], schema=schema, table=name.replace("-", "_"))
    conn.execute(sql.SQL("UPDATE {} SET status = 'done', finished_at = now() - interval '2h'"
                         ).format(sql.Identifier(schema, "purge")))
    # another client's "_pg3_0" on every server session, as other drainers leave it
    _on_every_server_session(pgbouncer, "DEALLOCATE ALL", "PREPARE _pg3_0 AS SELECT 1")
    # and busy neighbours: a drainer's consecutive transactions land on other sessions
    stop = threading.Event()
    neighbours = [threading.Thread(target=_busy_client, args=(pgbouncer, stop))
                  for _ in range(2)]
    for t in neighbours:
        t.start()
    try:
        procs = {
            name: start_drainer(args, pg_url=pgbouncer.url, schema=schema, log_dir=tmp_path,
                                DRAINER_TABLE=name.replace("-", "_"),
                                DRAINER_SESSION_OPTIONS="false",
                                DRAINER_PREPARED_STATEMENTS="true", DRAINER_BATCH_SIZE="1",
                                DRAINER_CONCURRENCY="1", **env)
            for name, (args, env) in commands.items()}
        # once schedule's first drain has claimed (and, with a clash, failed), stop it;
        # PgBouncer >= 1.21 tracks prepared statements: the worker drains, then is stopped
        long_running = ["schedule"] + ([] if clashes else ["worker"])

        def far_enough(table: str) -> bool:
            statuses = [r["status"] for r in jobs(conn, schema, table).values()]
            if clashes:  # psycopg prepares the claim at its 6th run
                return sum(st != "queued" for st in statuses) >= 6
            return set(statuses) == {"done"}

        deadline = time.monotonic() + 30
        for name in long_running:
            while not far_enough(name):
                assert time.monotonic() < deadline and procs[name].poll() is None, name
                time.sleep(0.1)
        # the clash comes at the next claim, after the running job's handler and its
        # completion: on a loaded machine that took longer than half a second
        time.sleep(2.0 if clashes else 0.5)
        for name in long_running:
            procs[name].send_signal(signal.SIGTERM)
        results = {name: _ended(p, timeout=20) for name, p in procs.items()}
    finally:
        stop.set()
        for t in neighbours:
            t.join()
        _on_every_server_session(pgbouncer, "DEALLOCATE ALL")
    wrong = {}
    for name, (code, err) in results.items():
        plain = [line for line in err.splitlines() if not line.startswith("{")]
        command = commands[name][0][0]
        if name == "schedule":
            errors = [json.loads(line)["msg"] for line in err.splitlines()
                      if line.startswith("{") and json.loads(line)["level"] == "error"]
            named = all("DRAINER_PREPARED_STATEMENTS=false" in e
                        and "(next wake as scheduled)" in e for e in errors)
            ok = code == 0 and not plain and (bool(errors) and named if clashes else not errors)
        elif not clashes or name in ("status", "enqueue"):
            ok = code == 0 and not plain
        elif name == "run-once-pipelined" and code == 0:
            # the pipeline's statement has a name of its own: it clashes only when PgBouncer
            # hands the pipeline's next transaction another session (the neighbours make
            # that likely, not certain); never exit 1, never a raw error
            ok = not plain and {r["status"] for r in jobs(conn, schema, "run_once_pipelined")
                                .values()} == {"done"}
        else:
            ok = code == 2 and len(plain) == 1 and plain[0].startswith(f"drainer {command}: ") \
                and "prepared statement" in plain[0] and "PgBouncer < 1.21" in plain[0] \
                and "DRAINER_PREPARED_STATEMENTS=false" in plain[0]
        if not ok or "Traceback" in err:
            wrong[name] = (code, plain[-3:] or err[-1500:])
    assert not wrong, (sorted(wrong), wrong)
    # nothing lost: the clashed runs' jobs are queued, running under their lease, or done
    for name in ("run-once", "run-once-pipelined", "worker"):
        rows = jobs(conn, schema, name.replace("-", "_")).values()
        assert len(rows) == JOBS and {r["status"] for r in rows} <= {"queued", "running", "done"}


def test_both_prepared_statement_clashes_are_named_as_configuration(pg_url: str) -> None:
    """The two errors a pooler that does not track prepared statements produces, raised by
    the real server: each is a configuration error (exit 2) naming the setting; any other
    error is not."""
    from drainer.db import prepared_statement_clash
    from drainer.errors import EXIT_USAGE

    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute("PREPARE _pg3_0 AS SELECT 1")
        with pytest.raises(psycopg.errors.DuplicatePreparedStatement) as duplicate:
            c.execute("PREPARE _pg3_0 AS SELECT 2")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName) as missing:
            c.execute("EXECUTE drainer_complete_many_and_claim_1")
        with pytest.raises(psycopg.errors.UndefinedTable) as other:
            c.execute("SELECT * FROM no_such_table_here")
    for raised in (duplicate.value, missing.value):
        error = prepared_statement_clash(raised)
        assert error is not None and error.exit_code == EXIT_USAGE
        text = str(error)
        assert type(raised).__name__ in text and "DRAINER_PREPARED_STATEMENTS=false" in text
        assert "\n" not in text
    assert prepared_statement_clash(other.value) is None
