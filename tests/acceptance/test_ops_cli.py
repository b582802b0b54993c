"""The operator commands through the real ``drainer`` CLI (subprocesses, real PostgreSQL)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.cli import build_parser
from drainer.settings import Settings
from tests.conftest import ROOT, cli_env, run_cli
from tests.integration.test_ops import add, ago, row, snapshot

Conn = psycopg.Connection[Any]


def ok_json(args: list[str], pg_url: str, schema: str) -> Any:
    p = run_cli(args, pg_url=pg_url, schema=schema)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1, p.stdout
    return json.loads(lines[0])


def run_in_pty(args: list[str], env: dict[str, str], timeout: float = 30
               ) -> tuple[int, str]:
    """Run the CLI with stdout and stderr on a pseudo-terminal; return (code, output)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "drainer", *args], stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    code = proc.wait(timeout=10)
    return code, b"".join(chunks).decode("utf-8", "replace")


def test_commands_print_json_counts(migrated: Settings, conn: Conn, pg_url: str,
                                    schema: str) -> None:
    s = migrated
    failed = add(conn, s, "mail", 2, status="failed", last_error="SMTP 451\ntail")
    queued = add(conn, s, "mail", 2)
    old_done = add(conn, s, "mail", 3, status="done", finished_at=ago(9 * 86400))

    st = ok_json(["status", "--json"], pg_url, schema)
    assert st["totals"]["failed"] == 2 and st["queues"]["mail"]["done"] == 3
    assert st["queues"]["mail"]["top_failed_error"] == {"error": "SMTP 451", "jobs": 2}

    listed = ok_json(["jobs", "--queue", "mail", "--status", "failed"], pg_url, schema)
    assert [j["id"] for j in listed] == sorted(failed, reverse=True)
    assert len(ok_json(["jobs", "--limit", "3"], pg_url, schema)) == 3

    shown = ok_json(["show", str(failed[0])], pg_url, schema)
    assert shown["last_error"] == "SMTP 451\ntail"

    retried = ok_json(["retry", "--id", str(failed[0]), str(queued[0])], pg_url, schema)
    assert retried["retried"] == 1 and retried["not_failed_ids"] == [queued[0]]
    assert row(conn, s, failed[0])["status"] == "queued"
    assert ok_json(["retry", "--queue", "mail"], pg_url, schema)["retried"] == 1

    cancelled = ok_json(["cancel", "--id", str(queued[1]), "--id", str(old_done[0])],
                        pg_url, schema)
    assert cancelled["cancelled"] == 1 and cancelled["already_finished_ids"] == [old_done[0]]
    assert (row(conn, s, queued[1])["status"], row(conn, s, queued[1])["last_error"]) == (
        "cancelled", "cancelled")
    assert ok_json(["retry", "--all-failed"], pg_url, schema)["retried"] == 0

    purged = ok_json(["purge", "--status", "done", "--older-than", "7d"], pg_url, schema)
    assert purged["purged"] == 3
    assert not {r[0] for r in snapshot(conn, s)} & set(old_done)


def test_dry_runs_change_nothing(migrated: Settings, conn: Conn, pg_url: str,
                                 schema: str) -> None:
    s = migrated
    failed = add(conn, s, "a", 2, status="failed", attempts=5)
    queued = add(conn, s, "a", 2)
    add(conn, s, "a", 2, status="done", finished_at=ago(30 * 86400))
    before = snapshot(conn, s)
    assert ok_json(["retry", "--all-failed", "--dry-run"], pg_url, schema)["retried"] == 2
    assert ok_json(["retry", "--id", *map(str, failed), "--dry-run"], pg_url,
                   schema)["retried"] == 2
    assert ok_json(["cancel", "--id", *map(str, queued), "--dry-run"], pg_url,
                   schema)["cancelled"] == 2
    assert ok_json(["purge", "--status", "done", "--older-than", "1d", "--dry-run"], pg_url,
                   schema)["purged"] == 2
    assert snapshot(conn, s) == before


@pytest.mark.parametrize("args", [
    ["retry"],
    ["retry", "--dry-run"],
    ["retry", "--id", "1", "--all-failed"],
    ["retry", "--queue", "a", "--all-failed"],
    ["retry", "--id", "1", "--queue", "a"],
    ["retry", "--id", "0"],
    ["retry", "1", "--queue", "a"],
    ["retry", "1", "--id", "2"],
    ["retry", "0"],
    ["cancel"],
    ["cancel", "1", "--id", "2"],
    ["cancel", "x"],
    ["cancel", "--id", "x"],
    ["purge", "--older-than", "7d"],
    ["purge", "--status", "done"],
    ["purge", "--status", "queued", "--older-than", "7d"],
    ["purge", "--status", "done", "--older-than", "soon"],
    ["jobs", "--limit", "0"],
    ["jobs", "--status", "stuck"],
    ["show"],
    ["show", "abc"],
])
def test_ambiguous_or_bad_input_is_refused(args: list[str], migrated: Settings, conn: Conn,
                                           pg_url: str, schema: str) -> None:
    add(conn, migrated, "a", 1, status="failed")
    before = snapshot(conn, migrated)
    p = run_cli(args, pg_url=pg_url, schema=schema)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "Traceback" not in p.stderr
    assert snapshot(conn, migrated) == before


def test_show_missing_job_and_missing_schema(migrated: Settings, pg_url: str,
                                             schema: str) -> None:
    p = run_cli(["show", "424242"], pg_url=pg_url, schema=schema)
    assert p.returncode == 1 and p.stderr.strip() == \
        f"drainer show: no job 424242 in {schema}.jobs"
    p = run_cli(["jobs"], pg_url=pg_url, schema=schema + "_none")
    assert p.returncode == 4 and "drainer migrate" in p.stderr


def test_status_and_jobs_are_tables_on_a_terminal(migrated: Settings, conn: Conn,
                                                  pg_url: str, schema: str) -> None:
    add(conn, migrated, "mail", 2, status="failed", last_error="SMTP 451: later")
    add(conn, migrated, "mail", 1)
    env = cli_env(pg_url, schema)
    code, out = run_in_pty(["status"], env)
    assert code == 0, out
    assert "queue" in out and "oldest due" in out and "SMTP 451: later" in out
    assert not out.lstrip().startswith("{")
    code, out = run_in_pty(["jobs"], env)
    assert code == 0 and "last_error" in out and "SMTP 451: later" in out
    code, out = run_in_pty(["retry", "--all-failed", "--dry-run"], env)
    assert code == 0 and out.startswith("dry run, nothing changed: retried 2"), out
    code, out = run_in_pty(["status", "--json"], env)
    assert code == 0 and json.loads(out)["totals"]["failed"] == 2


def test_every_command_and_option_has_help() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    choices: dict[str, Any] = sub.choices  # type: ignore[assignment]
    for name in ("status", "jobs", "show", "retry", "cancel", "purge"):
        assert name in choices
    for name, p in choices.items():
        assert p.description, name
        for action in p._actions:
            if action.dest == "help":
                continue
            assert action.help and len(action.help) > 10, (name, action.dest)
    p = run_cli(["retry", "--help"], pg_url=None, schema=None)
    assert p.returncode == 0 and "--all-failed" in p.stdout and "--dry-run" in p.stdout


def test_purge_counts_are_exact_on_a_bigger_table(migrated: Settings, conn: Conn,
                                                  pg_url: str, schema: str) -> None:
    conn.execute(sql.SQL(
        "INSERT INTO {} (queue, status, finished_at) SELECT 'bulk', 'done', "
        "now() - interval '10 days' FROM generate_series(1, 25000)").format(
            sql.Identifier(schema, "jobs")))
    add(conn, migrated, "bulk", 3, status="done")
    purged = ok_json(["purge", "--status", "done", "--older-than", "7d"], pg_url, schema)
    assert purged["purged"] == 25000 and purged["statements"] == 3  # 10,000 a statement
    left = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
        sql.Identifier(schema, "jobs"))).fetchone()
    assert left == (3,)


def test_attempts_are_shown_against_the_task_max_attempts_with_app(
        migrated: Settings, conn: Conn, pg_url: str, schema: str) -> None:
    """A job failed for good by @task(max_attempts=2) is 2/2 (task) with --app, not 2/5;
    without --app the row's 5 stays, with a note that it may not be what applied."""
    enq = ok_json(["enqueue", "fails_twice", "{}"], pg_url, schema)
    for _ in range(2):  # one attempt a run: the retry is due 1 ms later
        conn.execute(sql.SQL("UPDATE {} SET run_at = now() WHERE status = 'queued'").format(
            sql.Identifier(schema, "jobs")))
        p = run_cli(["run-once", "--app", "ops_jobs", "--retry-base", "0.001"], pg_url=pg_url,
                    schema=schema)
        assert p.returncode == 0, p.stderr
    job = row(conn, migrated, enq["id"])
    assert (job["status"], job["attempts"], job["max_attempts"]) == ("failed", 2, 5)
    env = cli_env(pg_url, schema)

    code, out = run_in_pty(["jobs", "--app", "ops_jobs"], env)
    assert code == 0 and " 2/2 (task) " in out and "2/5" not in out, out
    code, out = run_in_pty(["jobs"], env)
    assert code == 0 and " 2/5 " in out and "pass --app" in out, out
    code, out = run_in_pty(["show", str(enq["id"]), "--app", "ops_jobs"], env)
    assert code == 0 and re.search(r"max_attempts: +2 \(task; the row's column: 5\)", out), out
    assert "pass --app" not in out
    code, out = run_in_pty(["show", str(enq["id"])], env)
    assert code == 0 and re.search(r"max_attempts: +5\s", out) and "pass --app" in out, out

    listed = ok_json(["jobs", "--app", "ops_jobs"], pg_url, schema)
    assert listed[0]["max_attempts"] == 5  # the row's column, unchanged by the task's
    assert (listed[0]["max_attempts_applied"], listed[0]["max_attempts_source"]) == (2, "task")
    assert "max_attempts_applied" not in ok_json(["jobs"], pg_url, schema)[0]
    shown = ok_json(["show", str(enq["id"]), "--app", "ops_jobs"], pg_url, schema)
    assert (shown["max_attempts_applied"], shown["max_attempts_source"]) == (2, "task")


def test_retry_and_cancel_of_unknown_ids_name_them_and_exit_1_when_none_exists(
        migrated: Settings, conn: Conn, pg_url: str, schema: str) -> None:
    """As `drainer show` of an unknown id: exit 1 when no --id exists (the report still on
    stdout, its keys unchanged); some found: exit 0, a warning naming the others."""
    [failed] = add(conn, migrated, "mail", 1, status="failed")
    [queued] = add(conn, migrated, "mail", 1)
    before = snapshot(conn, migrated)
    for command in (["retry"], ["cancel"], ["retry", "--dry-run"]):
        p = run_cli([*command, "--id", "424242", "424243"], pg_url=pg_url, schema=schema)
        assert p.returncode == 1, (p.stdout, p.stderr)
        assert _said(p.stderr) == [f"drainer {command[0]}: no jobs 424242, 424243 in "
                                   f"{schema}.jobs"]
        report = json.loads(p.stdout)
        assert report["not_found"] == 2 and report["not_found_ids"] == [424242, 424243]
    assert snapshot(conn, migrated) == before

    for command, some in ((["retry"], failed), (["cancel"], queued)):
        p = run_cli([*command, "--id", str(some), "424242"], pg_url=pg_url, schema=schema)
        assert p.returncode == 0, (p.stdout, p.stderr)
        assert _said(p.stderr) == [
            f"drainer {command[0]}: warning: no job 424242 in {schema}.jobs (counted as "
            "not_found; the other ids were handled)"]
        assert json.loads(p.stdout)["not_found"] == 1
    p = run_cli(["cancel", "--id", str(failed)], pg_url=pg_url, schema=schema)
    assert p.returncode == 0 and _said(p.stderr) == []  # found, finished: no warning


def test_retry_and_cancel_take_the_ids_positionally_as_show_does(
        migrated: Settings, conn: Conn, pg_url: str, schema: str) -> None:
    failed = add(conn, migrated, "mail", 2, status="failed")
    queued = add(conn, migrated, "mail", 2)
    shown = ok_json(["show", str(failed[0])], pg_url, schema)
    assert shown["status"] == "failed"
    retried = ok_json(["retry", *map(str, failed)], pg_url, schema)
    assert retried["retried"] == 2 and retried["retried_ids"] == failed
    cancelled = ok_json(["cancel", str(queued[0]), str(queued[1]), "--dry-run"], pg_url,
                        schema)
    assert cancelled["cancelled"] == 2 and cancelled["dry_run"]
    cancelled = ok_json(["cancel", str(queued[0])], pg_url, schema)
    assert cancelled["cancelled_ids"] == [queued[0]]
    assert row(conn, migrated, queued[1])["status"] == "queued"
    # the flag form as before
    assert ok_json(["cancel", "--id", str(queued[1])], pg_url, schema)["cancelled"] == 1


def _said(stderr: str) -> list[str]:
    """The lines of stderr that are not log records (JSON lines)."""
    return [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("{")]


def test_pause_and_limit_warn_for_a_queue_never_seen_as_enqueue_does(
        migrated: Settings, conn: Conn, pg_url: str, schema: str) -> None:
    add(conn, migrated, "mail", 1, status="done")
    p = run_cli(["pause", "no such queue!", "mail"], pg_url=pg_url, schema=schema)
    assert p.returncode == 0, p.stderr
    assert _said(p.stderr) == [
        f"drainer pause: warning: queue 'no such queue!' never seen in {schema}.jobs (no "
        "job of it, of any status): a misspelt queue name? Paused all the same."]
    assert json.loads(p.stdout) == {"paused": ["mail", "no such queue!"], "already_paused": [],
                                    "never_seen": ["no such queue!"]}
    # paused once, it is known: no warning the second time, nor for a queue with jobs
    p = run_cli(["pause", "no such queue!", "mail"], pg_url=pg_url, schema=schema)
    assert p.returncode == 0 and _said(p.stderr) == [], p.stderr
    p = run_cli(["limit", "mial", "--max-running", "2"], pg_url=pg_url, schema=schema)
    assert p.returncode == 0 and _said(p.stderr) == [
        f"drainer limit: warning: queue 'mial' never seen in {schema}.jobs (no job of it, of "
        "any status): a misspelt queue name? Limited all the same."], p.stderr
    p = run_cli(["limit", "mail", "--max-running", "2"], pg_url=pg_url, schema=schema)
    assert p.returncode == 0 and _said(p.stderr) == [], p.stderr


def test_enqueue_with_app_stores_the_task_max_attempts(
        migrated: Settings, conn: Conn, pg_url: str, schema: str) -> None:
    """@task("fails_twice", max_attempts=2): the row says 2, so `jobs` shows 0/2 without
    --app; --max-attempts (or its variable) still wins."""
    one = ok_json(["enqueue", "fails_twice", "{}", "--app", "ops_jobs"], pg_url, schema)
    assert row(conn, migrated, one["id"])["max_attempts"] == 2
    p = run_cli(["enqueue", "fails_twice", "--app", "ops_jobs"], pg_url=pg_url, schema=schema,
                input='{"a": 1}\n{"a": 2}\n')
    assert p.returncode == 0, p.stderr
    listed = ok_json(["jobs"], pg_url, schema)
    assert [j["max_attempts"] for j in listed] == [2, 2, 2]
    code, out = run_in_pty(["jobs"], cli_env(pg_url, schema))
    assert code == 0 and out.count(" 0/2 ") == 3, out
    given = ok_json(["enqueue", "fails_twice", "{}", "--app", "ops_jobs", "--max-attempts", "4"],
                    pg_url, schema)
    assert row(conn, migrated, given["id"])["max_attempts"] == 4
    p = run_cli(["enqueue", "fails_twice", "{}", "--app", "ops_jobs"], pg_url=pg_url,
                schema=schema, DRAINER_MAX_ATTEMPTS="7")
    assert row(conn, migrated, json.loads(p.stdout)["id"])["max_attempts"] == 7
    # a task that sets none: the default
    plain = ok_json(["enqueue", "fails", "{}", "--app", "ops_jobs"], pg_url, schema)
    assert row(conn, migrated, plain["id"])["max_attempts"] == 5


def test_a_cancelled_job_stays_cancelled_through_retry_all_failed(
        migrated: Settings, conn: Conn, pg_url: str, schema: str) -> None:
    """cancel, then retry --all-failed (or --queue): the cancelled job does not come back;
    it shows as cancelled in status and jobs; retry by its id takes it back."""
    [queued] = add(conn, migrated, "mail", 1)
    [failed] = add(conn, migrated, "mail", 1, status="failed", last_error="SMTP 451")
    assert ok_json(["cancel", str(queued)], pg_url, schema)["cancelled"] == 1
    retried = ok_json(["retry", "--all-failed"], pg_url, schema)
    assert retried["retried"] == 1 and row(conn, migrated, failed)["status"] == "queued"
    assert ok_json(["retry", "--queue", "mail"], pg_url, schema)["retried"] == 0
    assert row(conn, migrated, queued)["status"] == "cancelled"
    st = ok_json(["status", "--json"], pg_url, schema)
    assert (st["queues"]["mail"]["cancelled"], st["queues"]["mail"]["failed"]) == (1, 0)
    assert st["totals"]["cancelled"] == 1
    listed = ok_json(["jobs", "--status", "cancelled"], pg_url, schema)
    assert [(j["id"], j["status"]) for j in listed] == [(queued, "cancelled")]
    code, out = run_in_pty(["status"], cli_env(pg_url, schema))
    assert code == 0 and re.search(r"queue +queued +due +running +done +failed +cancelled",
                                   out), out
    assert ok_json(["cancel", str(queued)], pg_url, schema)["already_finished"] == 1
    back = ok_json(["retry", str(queued)], pg_url, schema)
    assert back["retried_ids"] == [queued] and row(conn, migrated, queued)["status"] == "queued"
