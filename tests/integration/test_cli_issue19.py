"""Issue 19's CLI rough edges that talk to PostgreSQL (tests/unit/test_cli_issue19.py has
the others): each point of the issue's list has its test."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from typing import Any

import psycopg

from drainer.settings import Settings
from tests.conftest import ROOT, cli_env, finish, run_cli

Conn = psycopg.Connection[Any]


def _enqueue(pg_url: str, schema: str, queue: str, n: int = 1) -> list[int]:
    ids = []
    for i in range(n):
        p = run_cli(["enqueue", queue, json.dumps({"i": i})], pg_url=pg_url, schema=schema)
        assert p.returncode == 0, p.stderr
        ids.append(json.loads(p.stdout)["id"])
    return ids


def test_jobs_queue_takes_commas_and_repeats_like_run_once(migrated: Settings,
                                                           pg_url: str) -> None:
    schema = migrated.schema_name
    emails = _enqueue(pg_url, schema, "emails", 2)
    slow = _enqueue(pg_url, schema, "slow")
    other = _enqueue(pg_url, schema, "other")
    want = sorted(emails + slow, reverse=True)
    for args in (["--queue", "emails,slow"], ["--queue", "emails", "--queue", "slow"],
                 ["--queue", "emails, slow", "--queue", "emails"]):
        p = run_cli(["jobs", *args], pg_url=pg_url, schema=schema)
        assert p.returncode == 0, p.stderr
        rows = json.loads(p.stdout)
        assert [r["id"] for r in rows] == want, args
    p = run_cli(["jobs"], pg_url=pg_url, schema=schema)
    assert {r["id"] for r in json.loads(p.stdout)} == set(want + other)
    p = run_cli(["jobs", "--queue", " , "], pg_url=pg_url, schema=schema)
    assert p.returncode == 2 and "--queue must not be empty" in p.stderr


def test_jobs_output_matches_its_help(migrated: Settings, pg_url: str) -> None:
    _enqueue(pg_url, migrated.schema_name, "emails")
    p = run_cli(["jobs", "--help"], pg_url=pg_url, schema=migrated.schema_name)
    assert "JSON array of job objects" in " ".join(p.stdout.split())
    p = run_cli(["jobs"], pg_url=pg_url, schema=migrated.schema_name)
    rows = json.loads(p.stdout)
    assert isinstance(rows, list) and all(isinstance(r, dict) for r in rows)


def test_show_takes_the_id_positional_or_as_id(migrated: Settings, pg_url: str) -> None:
    (job,) = _enqueue(pg_url, migrated.schema_name, "emails")
    for args in ([str(job)], ["--id", str(job)]):
        p = run_cli(["show", *args], pg_url=pg_url, schema=migrated.schema_name)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["id"] == job
    for args in ([], [str(job), "--id", str(job)]):
        p = run_cli(["show", *args], pg_url=pg_url, schema=migrated.schema_name)
        assert p.returncode == 2 and "show takes one job id" in p.stderr


def test_retry_logs_the_ids_it_retried(migrated: Settings, pg_url: str, conn: Conn) -> None:
    schema = migrated.schema_name
    a, b = _enqueue(pg_url, schema, "emails", 2)
    conn.execute(f'UPDATE "{schema}".jobs SET status = \'failed\', finished_at = now() '
                 "WHERE id = %s", [b])
    p = run_cli(["retry", "--id", str(a), "--id", "999999", "--id", str(b),
                 "--log-format", "json"], pg_url=pg_url, schema=schema)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["retried_ids"] == [b]
    (line,) = [json.loads(x) for x in p.stderr.splitlines()
               if x.startswith("{") and "retry:" in x]
    assert f"ids [{b}]" in line["msg"] and "999999" not in line["msg"], line
    # the unknown id is named once, in the warning line (not a log record)
    assert [x for x in p.stderr.splitlines() if not x.startswith("{")] == [
        f"drainer retry: warning: no job 999999 in {schema}.jobs (counted as not_found; "
        "the other ids were handled)"]


def test_enqueue_on_a_terminal_says_it_reads_json_lines(migrated: Settings,
                                                        pg_url: str) -> None:
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "drainer", "enqueue", "emails"], stdin=slave,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env=cli_env(pg_url, migrated.schema_name))
    os.close(slave)
    try:
        time.sleep(1.0)
        os.write(master, b'{"a": 1}\n\x04')  # one payload, then Ctrl-D
        _, out, err = finish(p, 60)
    finally:
        os.close(master)
    assert p.returncode == 0, err
    assert "reading one JSON payload a line from stdin" in err
    assert json.loads(out)["enqueued"] == 1


def test_enqueue_with_piped_stdin_says_nothing(migrated: Settings, pg_url: str) -> None:
    # a queue seen before (a first job of a queue gets the "never seen" warning)
    first = run_cli(["enqueue", "emails", '{"a": 0}'], pg_url=pg_url,
                    schema=migrated.schema_name)
    assert first.returncode == 0, first.stderr
    p = run_cli(["enqueue", "emails"], pg_url=pg_url, schema=migrated.schema_name,
                input='{"a": 1}\n')
    assert p.returncode == 0 and p.stderr == "", p.stderr


def test_audit_prints_json_when_piped_and_writes_the_html_page(pg_url: str,
                                                               tmp_path: Any) -> None:
    page = tmp_path / "audit.html"
    p = run_cli(["audit", "--duration", "1", "--idle-timeout", "300", "--only-user",
                 "nobody_cli19", "--html", str(page)], pg_url=pg_url, schema=None)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)  # piped: JSON, as status and jobs
    assert out["could_suspend"] is True and "sessions" in out
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "<svg" in text and "<script" not in text
    p = run_cli(["audit", "--duration", "1", "--html", str(tmp_path / "no" / "x.html"),
                 "--only-user", "nobody_cli19"], pg_url=pg_url, schema=None)
    assert p.returncode == 2 and "--html: cannot write" in p.stderr


def _worker_start_lines(pg_url: str, schema: str) -> str:
    """drainer worker's stderr until it has started (then SIGTERM)."""
    import signal

    p = subprocess.Popen([sys.executable, "-m", "drainer", "worker", "--log-format", "text"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env=cli_env(pg_url, schema, DRAINER_APP="sample_jobs"))
    lines = []
    try:
        assert p.stderr is not None
        until = time.monotonic() + 60
        while time.monotonic() < until:
            line = p.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "needs a direct connection" in line:  # the last of warn_at_start's lines
                time.sleep(0.5)
                break
    finally:
        p.send_signal(signal.SIGTERM)
        _, _out, err = finish(p, 60)
    return "".join(lines) + err


def test_worker_without_the_notify_trigger_says_so_at_start(migrated: Settings,
                                                            pg_url: str) -> None:
    text = _worker_start_lines(pg_url, migrated.schema_name)
    assert "NO NOTIFY TRIGGER" in text and "drainer migrate --notify-trigger" in text, text
    p = run_cli(["migrate", "--notify-trigger"], pg_url=pg_url, schema=migrated.schema_name)
    assert p.returncode == 0, p.stderr
    text = _worker_start_lines(pg_url, migrated.schema_name)
    assert "NO NOTIFY TRIGGER" not in text and "LISTEN" in text, text


def _has_run_id_column(conn: Conn, schema: str) -> bool:
    return bool(conn.execute(
        "SELECT 1 FROM information_schema.columns WHERE table_schema = %s "
        "AND table_name = 'jobs' AND column_name = 'run_id'", [schema]).fetchone())


def test_run_once_says_where_its_jobs_are(migrated: Settings, pg_url: str,
                                          conn: Conn) -> None:
    import pytest

    schema = migrated.schema_name
    first = _enqueue(pg_url, schema, "noop", 2)
    p = run_cli(["run-once", "--log-format", "json"], pg_url=pg_url, schema=schema,
                DRAINER_APP="sample_jobs")
    assert p.returncode == 0, p.stderr
    run_id = json.loads(p.stdout)["run_id"]
    last = json.loads(p.stderr.strip().splitlines()[-1])  # the last log line
    assert last["msg"] == f"jobs of this run: drainer jobs --run {run_id}"
    assert last["run_id"] == run_id
    if not _has_run_id_column(conn, schema):
        pytest.skip("the run_id column (migration 0002, wt-core20) is not merged yet")
    second = _enqueue(pg_url, schema, "noop")
    p2 = run_cli(["run-once"], pg_url=pg_url, schema=schema, DRAINER_APP="sample_jobs")
    other = json.loads(p2.stdout)["run_id"]
    for rid, ids in ((run_id, first), (other, second)):
        p = run_cli(["jobs", "--run", rid], pg_url=pg_url, schema=schema)
        assert p.returncode == 0, p.stderr
        assert sorted(r["id"] for r in json.loads(p.stdout)) == sorted(ids)
    p = run_cli(["jobs", "--run", "no-such-run"], pg_url=pg_url, schema=schema)
    assert json.loads(p.stdout) == []


def test_post_drain_on_schedule_listen_answers_the_drains_run_id(
        migrated: Settings, conn: Conn, pg_url: str) -> None:
    import urllib.request

    from tests.acceptance._proc import DrainerProcess
    from tests.integration.test_wake_policy import insert_plain, status

    schema = migrated.schema_name
    token = "cli19-trigger-token-0123"
    proc = DrainerProcess(["schedule", "--interval", "0.3", "--wake-policy", "known-work",
                           "--max-sleep", "1h", "--idle-timeout", "1", "--port", "0"],
                          pg_url=pg_url, schema=schema, DRAINER_APP="sample_jobs",
                          DRAINER_LOG_LEVEL="DEBUG", DRAINER_TRIGGER_TOKEN=token)
    try:
        port = proc.wait_log("listening on http://127.0.0.1:", timeout=20)["port"]
        proc.wait_log("tick skipped", timeout=20)
        job = insert_plain(conn, schema, "noop")
        req = urllib.request.Request(f"http://127.0.0.1:{port}/drain?wait=1", data=b"",
                                     method="POST",
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            answer = json.loads(r.read())
        assert status(conn, schema, job) == "done"
        run_id = answer["run_id"]
        assert answer["report"]["run_id"] == run_id
        # the report is printed by the drain's thread, which may still be writing it when
        # the HTTP answer arrives: wait for it (a wrong run_id never shows up)
        deadline = time.monotonic() + 10
        while True:
            printed = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
            if run_id in [r["run_id"] for r in printed] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert run_id in [r["run_id"] for r in printed], (run_id, printed)
        proc.wait_log(f"jobs of this run: drainer jobs --run {run_id}")
        assert proc.terminate() == 0
    finally:
        proc.kill()
