"""The real ``drainer`` command as a subprocess: outputs and exit codes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from typing import Any

import psycopg
from psycopg import sql

from tests.conftest import ROOT, cli_env, finish, run_cli


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The error: exactly one line that is not a JSON log line (retries log warnings)."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("{")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_help_lists_the_subcommands() -> None:
    proc = run_cli(["--help"], pg_url=None, schema=None)
    assert proc.returncode == 0
    for name in ("migrate", "enqueue", "status", "run-once", "demo", "schedule", "serve",
                 "worker", "audit"):
        assert name in proc.stdout


def test_migrate_enqueue_status_run_once(pg_url: str, schema: str) -> None:
    proc = run_cli(["migrate"], pg_url=pg_url, schema=schema)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["to_version"] >= 1
    again = run_cli(["migrate"], pg_url=pg_url, schema=schema)
    assert json.loads(again.stdout)["applied"] == []

    proc = run_cli(["enqueue", "noop", '{"n": 1}', "--priority", "3"], pg_url=pg_url,
                   schema=schema)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["enqueued"] == 1
    lines = "\n".join(json.dumps({"n": i}) for i in range(50)) + "\n"
    proc = run_cli(["enqueue", "noop"], pg_url=pg_url, schema=schema, input=lines)
    assert json.loads(proc.stdout) == {"enqueued": 50, "skipped_duplicates": 0}
    proc = run_cli(["enqueue", "noop", "{}", "--dedup-key", "k"], pg_url=pg_url, schema=schema)
    proc = run_cli(["enqueue", "noop", "{}", "--dedup-key", "k"], pg_url=pg_url, schema=schema)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["skipped_duplicates"] == 1
    assert "skipped" in proc.stderr

    proc = run_cli(["status", "--json"], pg_url=pg_url, schema=schema)
    assert proc.returncode == 0, proc.stderr
    st = json.loads(proc.stdout)
    assert st["queues"]["noop"]["queued"] == 52 and st["queues"]["noop"]["due"] == 52

    began = time.monotonic()
    proc = run_cli(["run-once", "--app", "sample_jobs", "--queue", "noop"], pg_url=pg_url,
                   schema=schema)
    lived = time.monotonic() - began
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["claimed"], report["succeeded"], report["remaining_due"]) == (52, 52, 0)
    for key in ("claimed", "succeeded", "retried", "failed", "released", "reaped",
                "archived", "vacuumed", "remaining_due", "next_due_at", "duration_s",
                "connected_s", "deadline_hit"):
        assert key in report
    # the process start beside the session: the interpreter, imports and app came first
    # (more than nothing, less than the subprocess's whole life as this test saw it, plus
    # the clock tick the OS rounds a start down to: /proc/stat's btime, whole seconds, had
    # put the start up to a second early)
    assert 0 < report["process_start_s"] < lived + 0.011, (report["process_start_s"], lived)
    # logs on stderr are JSON lines when stderr is not a TTY
    for line in proc.stderr.splitlines():
        json.loads(line)


def test_flags_after_the_subcommand_and_env(pg_url: str, schema: str) -> None:
    assert run_cli(["migrate"], pg_url=pg_url, schema=schema).returncode == 0
    for _ in range(2):
        proc = run_cli(["enqueue", "noop", "{}"], pg_url=pg_url, schema=schema)
        assert proc.returncode == 0, proc.stderr
    proc = run_cli(["run-once", "--batch-size", "5", "--max-jobs", "1"], pg_url=pg_url,
                   schema=schema, DRAINER_APP="sample_jobs")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["claimed"], report["remaining_due"], report["stopped_by"]) == (
        1, 1, "max_jobs"), proc.stdout + proc.stderr


def test_a_table_migrations_behind_is_exit_4_for_the_drain_too(pg_url: str,
                                                                 schema: str) -> None:
    """An upgrade without `drainer migrate`: the statements read a column the table does
    not have yet. The drain says to migrate (exit 4) as status does, not UndefinedColumn."""
    from drainer.migrate import migrate

    with psycopg.connect(pg_url, autocommit=True) as conn:
        migrate(conn, schema, "jobs")
        # back to 0007: undo 0009 (the max_attempts CHECK) and 0008 (the
        # recurring_schedule column, the cancelled index)
        conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT jobs_max_attempts_check, "
                             "DROP COLUMN recurring_schedule").format(
            sql.Identifier(schema, "jobs")))
        conn.execute(sql.SQL("DROP INDEX {}").format(
            sql.Identifier(schema, "jobs_cancelled_idx")))
        conn.execute(sql.SQL("DELETE FROM {} WHERE version >= 8").format(
            sql.Identifier(schema, "drainer_migrations")))
    for args in (["run-once", "--app", "sample_jobs"], ["status"]):
        proc = run_cli(args, pg_url=pg_url, schema=schema)
        assert proc.returncode == 4, proc.stderr
        assert "drainer migrate" in _one_line_error(proc)


def test_exit_codes(pg_url: str, schema: str) -> None:
    proc = run_cli(["run-once", "--app", "sample_jobs"], pg_url=None, schema=schema)
    assert proc.returncode == 2 and "DRAINER_DATABASE_URL" in _one_line_error(proc)

    proc = run_cli(["run-once", "--app", "sample_jobs"], pg_url=pg_url, schema=schema)
    assert proc.returncode == 4 and "drainer migrate" in _one_line_error(proc)
    proc = run_cli(["status"], pg_url=pg_url, schema=schema)
    assert proc.returncode == 4 and "drainer migrate" in _one_line_error(proc)
    proc = run_cli(["enqueue", "q", "{}"], pg_url=pg_url, schema=schema)
    assert proc.returncode == 4

    url = "postgresql://postgres:Pw_9xQ@127.0.0.1:1/nowhere"
    proc = run_cli(["run-once", "--app", "sample_jobs", "--connect-retries", "1"],
                   pg_url=url, schema=schema)
    line = _one_line_error(proc)
    assert proc.returncode == 3 and "unreachable" in line and "Pw_9xQ" not in proc.stderr

    run_cli(["migrate"], pg_url=pg_url, schema=schema)
    proc = run_cli(["run-once", "--app", "no_such_module_xyz"], pg_url=pg_url, schema=schema)
    assert proc.returncode == 2 and "no_such_module_xyz" in _one_line_error(proc)
    proc = run_cli(["run-once", "--app", "sample_jobs", "--batch-size", "0"], pg_url=pg_url,
                   schema=schema)
    assert proc.returncode == 2 and "--batch-size" in _one_line_error(proc)
    proc = run_cli(["run-once", "--bogus"], pg_url=pg_url, schema=schema)
    assert proc.returncode == 2 and _one_line_error(proc) == (  # the command's, not drainer's
        "drainer run-once: error: unrecognized arguments: --bogus "
        "(see drainer run-once --help)")
    proc = run_cli(["show", "1", "2"], pg_url=pg_url, schema=schema)
    assert proc.returncode == 2 and _one_line_error(proc).startswith(
        "drainer show: error: unrecognized arguments: 2")
    proc = run_cli(["enqueue", "q", "{not json"], pg_url=pg_url, schema=schema)
    assert proc.returncode == 2 and "invalid JSON" in _one_line_error(proc)
    proc = run_cli(["enqueue", "q"], pg_url=pg_url, schema=schema, input='{"a": 1}\n{oops\n')
    assert proc.returncode == 2 and "line 2" in _one_line_error(proc)
    with psycopg.connect(pg_url) as conn:
        left = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
            sql.Identifier(schema, "jobs"))).fetchone()
    assert left == (0,)  # all or nothing


def test_short_commands_start_and_a_bad_duration_is_one_line(pg_url: str, schema: str
                                                            ) -> None:
    """run-once and status start through drainer.cli; a value pydantic refuses gets its
    one-line error that names the flag and the variable."""
    assert run_cli(["migrate"], pg_url=pg_url, schema=schema).returncode == 0
    for args in (["run-once", "--app", "sample_jobs", "--queue", "noop", "--lease", "15m"],
                 ["status", "--json"]):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "drainer", *args], capture_output=True,
            text=True, timeout=120, env=cli_env(pg_url, schema), cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        imported = [ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines()
                    if ln.startswith("import time:")]
        assert "drainer.cli" in imported and "psycopg" in imported
    proc = run_cli(["run-once", "--app", "sample_jobs", "--lease", "15 minutes"],
                   pg_url=pg_url, schema=schema)
    assert proc.returncode == 2
    assert _one_line_error(proc) == (
        "drainer run-once: invalid setting --lease / DRAINER_LEASE: Value error, not a "
        "duration: '15 minutes' (use seconds or 30s, 15m, 12h, 7d)")


def test_sigterm_releases_unstarted_jobs(pg_url: str, schema: str,
                                         conn: psycopg.Connection[Any]) -> None:
    run_cli(["migrate"], pg_url=pg_url, schema=schema)
    conn.execute(sql.SQL("CREATE TABLE {} (job_id bigint, attempt int, pid int, note text)")
                 .format(sql.Identifier(schema, "executions")))
    lines = "".join(json.dumps({"sleep": 1.5}) + "\n" for _ in range(10))
    run_cli(["enqueue", "sleepy"], pg_url=pg_url, schema=schema, input=lines)
    proc = subprocess.Popen(
        [sys.executable, "-m", "drainer", "run-once", "--app", "sample_jobs", "--batch-size",
         "10", "--grace", "10"], env=cli_env(pg_url, schema), cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE note = 'start'").format(
            sql.Identifier(schema, "executions"))).fetchone()
        if row and row[0] >= 1:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, out, err = finish(proc, 30)
    assert proc.returncode == 0, err
    report = json.loads(out)
    assert (report["claimed"], report["succeeded"], report["released"]) == (10, 1, 9)
    rows = conn.execute(sql.SQL("SELECT status, attempts, count(*) FROM {} GROUP BY 1, 2 "
                                "ORDER BY 1").format(sql.Identifier(schema, "jobs"))).fetchall()
    assert rows == [("done", 1, 1), ("queued", 0, 9)]


def test_run_once_stdout_is_the_report_alone_when_handlers_print(pg_url: str,
                                                                 schema: str) -> None:
    """`drainer run-once | jq` reads one JSON object: what handlers write to stdout (print,
    fd 1, a child process) goes to stderr."""
    assert run_cli(["migrate"], pg_url=pg_url, schema=schema).returncode == 0
    for _ in range(2):
        assert run_cli(["enqueue", "chatty", "{}"], pg_url=pg_url, schema=schema
                       ).returncode == 0
    proc = run_cli(["run-once", "--app", "printing_jobs"], pg_url=pg_url, schema=schema)
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stdout.splitlines()
    assert json.loads(line)["succeeded"] == 2
    for said in ("print from job", "fd 1 from job", "child of job"):
        assert proc.stderr.count(said) == 2, proc.stderr
