"""``drainer schedule`` as a real process: wakes, no connection in between, signals, cron,
the awake estimate, and ``drainer audit`` coming out clean next to it."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.migrate import migrate
from drainer.producer import enqueue
from tests.conftest import cli_env, finish, run_cli

UNREACHABLE = "postgresql://nobody:secret@127.0.0.1:1/nothing"


def app_name(schema: str) -> str:
    return f"drainer-{schema}"


def start_schedule(pg_url: str, schema: str, *args: str) -> subprocess.Popen[str]:
    env = cli_env(pg_url, schema, DRAINER_APP="sample_jobs",
                  DRAINER_APPLICATION_NAME=app_name(schema), DRAINER_LOG_FORMAT="json")
    return subprocess.Popen([sys.executable, "-m", "drainer", "schedule", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def stop(proc: subprocess.Popen[str], timeout: float = 30,
         sig: signal.Signals = signal.SIGTERM) -> tuple[int, str, str]:
    """Signal the schedule and wait for it (kill it and fail if it hangs)."""
    if proc.poll() is None:
        proc.send_signal(sig)
    return finish(proc, timeout)


def reports(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def log_lines(err: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def our_sessions(conn: psycopg.Connection[Any], schema: str) -> list[tuple[int, datetime]]:
    rows = conn.execute("SELECT pid, backend_start FROM pg_stat_activity "
                        "WHERE application_name LIKE %s", (app_name(schema) + "%",)).fetchall()
    return [(r[0], r[1]) for r in rows]


def make_jobs_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    migrate(conn, schema, "jobs")
    conn.execute(sql.SQL("CREATE TABLE {} (job_id bigint, attempt int, pid int, note text, "
                         "at timestamptz DEFAULT clock_timestamp())")
                 .format(sql.Identifier(schema, "executions")))


@pytest.fixture
def jobs_schema(conn: psycopg.Connection[Any], schema: str) -> str:
    make_jobs_schema(conn, schema)
    return schema


@pytest.fixture
def second_schema(pg_url: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_url, autocommit=True) as c:
        make_jobs_schema(c, name)
    yield name
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def add(conn: psycopg.Connection[Any], schema: str, queue: str, payload: Any, *,
        delay: float = 0.0, max_attempts: int = 5) -> int:
    job_id = enqueue(conn, queue, payload, schema=schema, max_attempts=max_attempts,
                     run_at=datetime.now(timezone.utc) + timedelta(seconds=delay))
    assert job_id is not None
    return job_id


def notes(conn: psycopg.Connection[Any], schema: str) -> list[tuple[int, str]]:
    return [(r[0], r[1]) for r in conn.execute(
        sql.SQL("SELECT job_id, note FROM {} ORDER BY at").format(
            sql.Identifier(schema, "executions"))).fetchall()]


def wait_for(predicate: Any, timeout: float, step: float = 0.1) -> bool:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if predicate():
            return True
        time.sleep(step)
    return False


# -- without a database -------------------------------------------------------------------------


def test_dry_run_prints_five_sunday_wakes_without_connecting() -> None:
    started = time.monotonic()
    proc = run_cli(["schedule", "--cron", "0 3 * * 0", "--timezone", "UTC", "--dry-run",
                    "--platform", "neon"], pg_url=UNREACHABLE, schema=None)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started < 15  # no connect attempts (they would time out)
    wakes = [datetime.fromisoformat(line.strip()) for line in proc.stdout.splitlines()
             if line.startswith("  ")]
    assert len(wakes) == 5
    for w in wakes:
        assert w.tzinfo is not None and w.utcoffset() == timedelta(0)
        assert w.strftime("%A %H:%M") == "Sunday 03:00"
    assert "awake estimate: per wake ≈ drain time + 5.0 min idle timeout (--platform neon)" \
        in proc.stdout
    assert "secret" not in proc.stdout + proc.stderr


def test_interval_within_the_idle_timeout_is_refused() -> None:
    proc = run_cli(["schedule", "--interval", "60", "--platform", "neon"], pg_url=UNREACHABLE,
                   schema=None)
    assert proc.returncode == 2
    assert proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert "--interval 60 s is not longer than the 5.0 min idle timeout" in line
    assert "--allow-always-on" in line
    ok = run_cli(["schedule", "--interval", "60", "--platform", "neon", "--allow-always-on",
                  "--dry-run"], pg_url=UNREACHABLE, schema=None)
    assert ok.returncode == 0, ok.stderr
    assert "100% of the day" in ok.stdout


def test_interval_dry_run_and_estimate() -> None:
    proc = run_cli(["schedule", "--interval", "15m", "--idle-timeout", "300", "--dry-run"],
                   pg_url=UNREACHABLE, schema=None)
    assert proc.returncode == 0, proc.stderr
    wakes = [datetime.fromisoformat(line.strip()) for line in proc.stdout.splitlines()
             if line.startswith("  ")]
    assert [(b - a).total_seconds() for a, b in itertools.pairwise(wakes)] == [900.0] * 4
    assert "96 wakes a day → at least 8.0 h a day awake (33.3% of the day)" in proc.stdout
    assert "max runtime of a run: 7.5 min" in proc.stdout


# -- with a database ----------------------------------------------------------------------------


def test_no_connection_between_runs(pg_url: str, jobs_schema: str,
                                    conn: psycopg.Connection[Any]) -> None:
    schema = jobs_schema
    for delay in (0, 2, 4):
        add(conn, schema, "sleepy", {"sleep": 0.5}, delay=delay)
    proc = start_schedule(pg_url, schema, "--interval", "2", "--idle-timeout", "1")
    seen: list[tuple[float, list[tuple[int, datetime]]]] = []

    def third_run_over() -> bool:
        """Three runs seen (one backend each), all three jobs done, no session left."""
        return (len({b for _, sample in seen for b in sample}) >= 3 and not seen[-1][1]
                and sum(1 for _, note in notes(conn, schema) if note == "end") >= 3)

    try:
        # sample until the third job's run has come and gone (not for a fixed time: a
        # slow start-up under load would shift every run past a fixed window)
        until = time.monotonic() + 60
        while time.monotonic() < until and proc.poll() is None:
            seen.append((time.monotonic(), our_sessions(conn, schema)))
            if third_run_over():
                break
            time.sleep(0.05)
    finally:
        code, out, err = stop(proc)
    assert code == 0, err
    backends = {b for _, sample in seen for b in sample}
    assert len(backends) >= 3, (backends, err)  # one connection per run, each a new backend
    assert max(len(s) for _, s in seen) == 1  # never two at once (no heartbeat needed here)
    # between two runs: a stretch of time with no session of ours at all
    gaps: list[float] = []
    gone_since: float | None = None
    started = False
    for at, sessions in seen:
        if sessions:
            if started and gone_since is not None:
                gaps.append(at - gone_since)
            started, gone_since = True, None
        elif started and gone_since is None:
            gone_since = at
    assert len(gaps) >= 2 and min(gaps) >= 0.5, gaps
    done = reports(out)
    assert len(done) >= 3 and sum(r["succeeded"] for r in done) == 3
    assert all(r["connected_s"] < 2 for r in done)
    est = [r for r in log_lines(err) if "awake_estimate" in r]
    assert est and est[0]["awake_estimate"]["idle_timeout_s"] == 1.0
    assert our_sessions(conn, schema) == []


def test_sigterm_lets_the_running_job_finish_and_releases_the_rest(
        pg_url: str, jobs_schema: str, conn: psycopg.Connection[Any]) -> None:
    schema = jobs_schema
    first = add(conn, schema, "sleepy", {"sleep": 2})
    second = add(conn, schema, "sleepy", {"sleep": 2})
    proc = start_schedule(pg_url, schema, "--interval", "30", "--idle-timeout", "5",
                          "--grace", "10")
    try:
        assert wait_for(lambda: notes(conn, schema), 20), "the run never started"
        code, out, err = stop(proc)  # one SIGTERM (a second one would mean: exit now)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, err
    assert notes(conn, schema) == [(first, "start"), (first, "end")]
    (report,) = reports(out)
    assert report["stopped_by"] == "signal"
    assert report["succeeded"] == 1 and report["released"] == 1
    status = conn.execute(sql.SQL("SELECT status, attempts FROM {} WHERE id = %s").format(
        sql.Identifier(schema, "jobs")), (second,)).fetchone()
    assert status == ("queued", 0)
    assert any("received SIGTERM" in r["msg"] for r in log_lines(err))
    assert our_sessions(conn, schema) == []


def test_pull_earlier_wakes_for_a_retry(pg_url: str, jobs_schema: str, second_schema: str,
                                        conn: psycopg.Connection[Any]) -> None:
    # a job that fails once waits retry_base * 2^1 = 2 s; the interval is 30 s
    pulled_job = add(conn, jobs_schema, "boom", {}, max_attempts=2)
    plain_job = add(conn, second_schema, "boom", {}, max_attempts=2)
    args = ("--interval", "30", "--idle-timeout", "1", "--retry-base", "1")
    pulled = start_schedule(pg_url, jobs_schema, *args, "--pull-earlier")
    plain = start_schedule(pg_url, second_schema, *args)

    def attempts(schema: str, job: int) -> tuple[str, int]:
        row = conn.execute(sql.SQL("SELECT status, attempts FROM {} WHERE id = %s").format(
            sql.Identifier(schema, "jobs")), (job,)).fetchone()
        assert row is not None
        return row[0], row[1]

    try:
        assert wait_for(lambda: attempts(jobs_schema, pulled_job) == ("failed", 2), 15)
        assert wait_for(lambda: attempts(second_schema, plain_job)[1] == 1, 10)
        time.sleep(1.0)
        assert attempts(second_schema, plain_job) == ("queued", 1)  # waits for its 30 s
    finally:
        code, out, err = stop(pulled)
        code2, _, err2 = stop(plain)
    assert code == 0 and code2 == 0, err + err2
    runs = reports(out)
    assert len(runs) == 2 and runs[0]["retried"] == 1 and runs[1]["failed"] == 1
    assert any("pulled earlier" in r["msg"] for r in log_lines(err))


def test_audit_next_to_schedule_comes_out_clean(pg_url: str, jobs_schema: str,
                                                conn: psycopg.Connection[Any]) -> None:
    schema = jobs_schema
    add(conn, schema, "sleepy", {"sleep": 1})
    sched = start_schedule(pg_url, schema, "--interval", "5", "--idle-timeout", "2")
    audit = subprocess.Popen(
        [sys.executable, "-m", "drainer", "audit", "--duration", "7", "--idle-timeout", "2",
         "--only-application", app_name(schema) + "%", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(pg_url, None))
    try:
        _, out, err = finish(audit, 60)
    finally:
        code, _sched_out, sched_err = stop(sched)
    assert code == 0, sched_err
    assert audit.returncode == 0, err + out
    result = json.loads(out)
    assert result["could_suspend"] is True
    assert result["longest_quiet_gap_s"] >= 2
    ours = [s for s in result["sessions"] if s["application_name"] == app_name(schema)]
    assert ours, "the audit never saw the schedule's drain"
    assert not any(s["keeps_awake"] for s in ours)
    assert not any(c["keeps_awake"] for c in result["reconnecting_clients"])


def test_default_max_runtime_is_half_the_interval(pg_url: str, jobs_schema: str,
                                                  conn: psycopg.Connection[Any]) -> None:
    for _ in range(8):
        add(conn, jobs_schema, "sleepy", {"sleep": 0.5})
    proc = start_schedule(pg_url, jobs_schema, "--interval", "3", "--idle-timeout", "1",
                          "--batch-size", "1")
    try:
        assert wait_for(lambda: len(notes(conn, jobs_schema)) >= 2, 20)
        time.sleep(2.5)
    finally:
        code, out, err = stop(proc)
    assert code == 0, err
    first = reports(out)[0]
    assert first["stopped_by"] == "max_runtime" and first["deadline_hit"] is True
    assert 1.5 <= first["duration_s"] < 3.0
    assert first["remaining_due"] > 0


def test_a_failing_run_does_not_stop_the_schedule() -> None:
    env = cli_env(UNREACHABLE, None, DRAINER_APP="sample_jobs", DRAINER_LOG_FORMAT="json",
                  DRAINER_CONNECT_TIMEOUT="1")
    proc = subprocess.Popen([sys.executable, "-m", "drainer", "schedule", "--interval", "1",
                             "--idle-timeout", "0.5"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    # SIGINT once two runs have failed (not after a fixed time: under load the start-up
    # alone can take seconds, and a SIGINT before the handlers are set is a traceback)
    assert proc.stderr is not None
    lines: list[str] = []
    until = time.monotonic() + 60
    while time.monotonic() < until:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if sum(1 for r in log_lines("".join(lines)) if r["msg"].startswith("run failed")) >= 2:
            break
    code, out, rest = stop(proc, sig=signal.SIGINT)
    err = "".join(lines) + rest
    assert code == 0, err
    assert any("received SIGINT" in r["msg"] for r in log_lines(err))
    failures = [r for r in log_lines(err) if r["msg"].startswith("run failed")]
    assert len(failures) >= 2  # it kept waking
    assert "secret" not in out + err


def test_no_handlers_is_refused_at_start_without_connecting() -> None:
    proc = run_cli(["schedule", "--interval", "600", "--platform", "neon"],
                   pg_url=UNREACHABLE, schema=None, timeout=30)
    assert proc.returncode == 2
    assert "no handlers registered" in proc.stderr


def test_a_second_signal_exits_at_once(pg_url: str, jobs_schema: str,
                                       conn: psycopg.Connection[Any]) -> None:
    add(conn, jobs_schema, "sleepy", {"sleep": 20})
    proc = start_schedule(pg_url, jobs_schema, "--interval", "60", "--idle-timeout", "5")
    try:
        assert wait_for(lambda: notes(conn, jobs_schema), 20), "the run never started"
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        started = time.monotonic()
        code, _out, err = stop(proc, sig=signal.SIGINT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 1 and time.monotonic() - started < 5
    assert "second SIGINT: exiting now; running jobs are left to their lease" in err
