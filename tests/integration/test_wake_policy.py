"""``schedule --wake-policy known-work`` and ``--listen`` on a real PostgreSQL.

Each reason to wake (trigger, due work left, a due retry grouped after the idle timeout,
the safety net), ticks that skip open no connection, and one run at a time when triggers
and ticks meet. Intervals and idle timeouts of a second or two.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql

import drainer.db
from drainer import Job
from drainer.drain import RunReport
from drainer.registry import Registry
from drainer.scheduler import WakeSchedule, run_schedule
from drainer.settings import Settings
from drainer.waking import IdleTimeout

TOKEN = "wake-policy-test-token"


class Sched:
    """run_schedule in a thread; its reports with the time each ended."""

    def __init__(self, settings: Settings, registry: Registry, *, tick: float, idle: float,
                 **kw: Any) -> None:
        self.stop = threading.Event()
        self.reports: list[tuple[float, RunReport]] = []
        self.port: int | None = None
        self._listening = threading.Event()
        self._cond = threading.Condition()
        kw.setdefault("policy", "known-work")

        def on_listening(host: str, port: int) -> None:
            self.port = port
            self._listening.set()

        def target() -> None:
            run_schedule(settings, WakeSchedule(interval=tick), stop=self.stop,
                         registry=registry, idle=IdleTimeout(idle, "--idle-timeout"),
                         on_report=self._on_report, on_listening=on_listening, **kw)

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()
        if kw.get("listen"):
            assert self._listening.wait(10)

    def _on_report(self, report: RunReport) -> None:
        with self._cond:
            self.reports.append((time.time(), report))
            self._cond.notify_all()

    def wait_reports(self, n: int, timeout: float = 10) -> list[tuple[float, RunReport]]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.reports) < n:
                left = deadline - time.monotonic()
                assert left > 0, f"only {len(self.reports)} of {n} runs"
                self._cond.wait(left)
            return list(self.reports)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive()

    def post(self, path: str = "/drain", token: str | None = TOKEN) -> tuple[int, dict[str, Any]]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     data=b"" if path == "/drain" else None,
                                     method="POST" if path == "/drain" else "GET")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


@contextmanager
def scheduling(settings: Settings, registry: Registry, **kw: Any) -> Iterator[Sched]:
    s = Sched(settings, registry, **kw)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def quiet(migrated: Settings) -> Settings:
    """Settings whose sessions carry an application_name of their own."""
    return migrated.model_copy(update={"application_name": f"drainer-{migrated.schema_name}"})


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every drainer.db.connect call (the real one runs), by purpose."""
    calls: list[str] = []
    real = drainer.db.connect

    def counting(settings: Settings, *a: Any, **kw: Any) -> Any:
        calls.append(str(kw.get("purpose", "work")))
        return real(settings, *a, **kw)

    monkeypatch.setattr(drainer.db, "connect", counting)
    return calls


def insert_plain(conn: psycopg.Connection[Any], schema: str, queue: str) -> int:
    """A job inserted with plain SQL: no trigger."""
    row = conn.execute(sql.SQL("INSERT INTO {} (queue, payload) VALUES (%s, '{{}}') "
                               "RETURNING id").format(sql.Identifier(schema, "jobs")),
                       [queue]).fetchone()
    assert row is not None
    return int(row[0])


def status(conn: psycopg.Connection[Any], schema: str, job_id: int) -> str:
    row = conn.execute(sql.SQL("SELECT status FROM {} WHERE id = %s")
                       .format(sql.Identifier(schema, "jobs")), [job_id]).fetchone()
    assert row is not None
    return str(row[0])


def wait_done(conn: psycopg.Connection[Any], schema: str, job_id: int,
              timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while status(conn, schema, job_id) != "done":
        assert time.monotonic() < deadline, f"job {job_id} not done in {timeout} s"
        time.sleep(0.05)
    return time.time()


def our_sessions(conn: psycopg.Connection[Any], settings: Settings) -> int:
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
                       [settings.application_name + "%"]).fetchone()
    assert row is not None
    return int(row[0])


def wakes(caplog: pytest.LogCaptureFixture, prefix: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name == "drainer.scheduler" and r.getMessage().startswith(prefix)]


def test_trigger_wakes_at_once_and_skipped_ticks_open_no_connection(
        quiet: Settings, conn: psycopg.Connection[Any], registry: Registry,
        connects: list[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="drainer")
    done_at: dict[int, float] = {}

    @registry.task("mail")
    def handler(job: Job) -> None:
        done_at[job.id] = time.time()

    with scheduling(quiet, registry, tick=0.25, idle=1.0, max_sleep=600,
                    listen=("127.0.0.1", 0), token=TOKEN) as s:
        s.wait_reports(1)
        assert wakes(caplog, "wake: start")
        # the start run's backend leaves pg_stat_activity a moment after its client hung up
        # (longer under load): wait for that before asserting that nothing is connected
        end = time.monotonic() + 10
        while our_sessions(conn, quiet) and time.monotonic() < end:
            time.sleep(0.02)
        job = insert_plain(conn, quiet.schema_name, "mail")
        before = len(connects)
        # ~8 ticks with nothing known: no connection opened, none seen on the server
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            assert our_sessions(conn, quiet) == 0
            time.sleep(0.05)
        assert len(connects) == before
        assert status(conn, quiet.schema_name, job) == "queued"
        skipped = wakes(caplog, "tick skipped, no connection: no known work")
        assert len(skipped) >= 5 and all(r.levelno == logging.DEBUG for r in skipped)
        # health checks and refused triggers never touch the database
        assert s.post("/healthz", token=None)[0] == 200
        assert s.post(token=None)[0] == 401
        assert s.post(token="wrong")[0] == 401
        assert len(connects) == before and len(s.reports) == 1
        # the trigger: a drain at once
        fired = time.time()
        code, body = s.post()
        assert code == 202 and body["status"] in {"running", "queued"}
        wait_done(conn, quiet.schema_name, job, 5)
        assert done_at[job] - fired < 2.0
        trig = wakes(caplog, "wake: trigger")
        assert trig and trig[0].levelno == logging.INFO
        s.wait_reports(2)
        # served: the ticks go back to skipping
        n = len(s.reports)
        time.sleep(1.0)
        assert len(s.reports) == n
    assert s.reports[1][1].succeeded == 1


def test_due_work_left_wakes_at_the_next_tick(
        quiet: Settings, conn: psycopg.Connection[Any], registry: Registry,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="drainer")

    @registry.task("slow")
    def handler(job: Job) -> None:
        time.sleep(0.15)

    ids = [insert_plain(conn, quiet.schema_name, "slow") for _ in range(8)]
    limited = quiet.model_copy(update={"max_runtime": 0.4, "batch_size": 1})
    with scheduling(limited, registry, tick=0.25, idle=1.0, max_sleep=600) as s:
        for job in ids:
            wait_done(conn, quiet.schema_name, job, 15)
        reports = s.wait_reports(2)
    assert reports[0][1].remaining_due > 0
    left = wakes(caplog, "wake: due work left: the last run stopped with")
    assert len(left) >= 1
    assert sum(r.succeeded for _, r in s.reports) == 8


def flaky_task(registry: Registry) -> list[tuple[int, float]]:
    """A task "flaky" that fails its first attempt; (attempt, time) of each run."""
    attempts: list[tuple[int, float]] = []

    @registry.task("flaky")
    def handler(job: Job) -> None:
        attempts.append((job.attempt, time.time()))
        if job.attempt == 1:
            raise RuntimeError("first attempt fails")

    return attempts


def test_a_due_retry_wakes_when_due_while_the_compute_is_still_up(
        quiet: Settings, conn: psycopg.Connection[Any], registry: Registry,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="drainer")
    attempts = flaky_task(registry)
    job = insert_plain(conn, quiet.schema_name, "flaky")
    fast_retry = quiet.model_copy(update={"retry_base": 0.1})  # due 0.2 s after failing
    idle = 2.0
    with scheduling(fast_retry, registry, tick=0.2, idle=idle, max_sleep=600) as s:
        first = s.wait_reports(1)[0]
        assert first[1].retried == 1 and first[1].next_due_at is not None
        wait_done(conn, quiet.schema_name, job, 10)
    assert [a for a, _ in attempts] == [1, 2]
    gap = attempts[1][1] - first[0]
    # due 0.2 s after it failed: run at the next tick (0.2 s apart), well inside the idle
    # timeout after the run ended (not held to it: that would suspend, then resume, the
    # compute for the retry)
    assert gap < idle - 0.5, gap
    (woke,) = wakes(caplog, "wake: retry due")
    assert woke.getMessage().endswith("(the compute still up: no resume)"), woke.getMessage()


def test_a_due_retry_runs_when_due_not_at_the_next_interval_tick(
        quiet: Settings, conn: psycopg.Connection[Any], registry: Registry) -> None:
    """Ticks 30 s apart: the retry (due 0.2 s after its first attempt failed) runs at its
    due time, by a wake at the report's next_due_at, not 30 s later."""
    attempts = flaky_task(registry)
    job = insert_plain(conn, quiet.schema_name, "flaky")
    fast_retry = quiet.model_copy(update={"retry_base": 0.1})
    with scheduling(fast_retry, registry, tick=30, idle=20, max_sleep=600) as s:
        first = s.wait_reports(1)[0][1]
        assert first.retried == 1 and first.next_due_at is not None
        wait_done(conn, quiet.schema_name, job, 10)
    assert [a for a, _ in attempts] == [1, 2]
    late = attempts[1][1] - datetime.fromisoformat(first.next_due_at).timestamp()
    assert 0 <= late < 1.0, late


def test_safety_net_serves_jobs_inserted_without_a_trigger(
        quiet: Settings, conn: psycopg.Connection[Any], registry: Registry,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="drainer")

    @registry.task("mail")
    def handler(job: Job) -> None:
        pass

    max_sleep = 2.5
    with scheduling(quiet, registry, tick=0.2, idle=1.0, max_sleep=max_sleep) as s:
        first_end = s.wait_reports(1)[0][0]
        job = insert_plain(conn, quiet.schema_name, "mail")
        done = wait_done(conn, quiet.schema_name, job, 10)
    assert max_sleep - 0.2 <= done - first_end <= max_sleep + 1.5
    net = wakes(caplog, "wake: safety net:")
    assert len(net) == 1 and "(--max-sleep 2.5 s)" in net[0].getMessage()


def test_triggers_and_ticks_never_run_two_drains_at_once(
        quiet: Settings, conn: psycopg.Connection[Any], registry: Registry) -> None:
    lock = threading.Lock()
    live = {"now": 0, "max": 0}

    @registry.task("slow")
    def handler(job: Job) -> None:
        with lock:
            live["now"] += 1
            live["max"] = max(live["max"], live["now"])
        time.sleep(0.05)
        with lock:
            live["now"] -= 1

    ids: list[int] = []
    # policy always, a tick every 0.3 s, and triggers in between: they must queue, not overlap
    with scheduling(quiet, registry, tick=0.3, idle=0.1, policy="always", max_sleep=600,
                    listen=("127.0.0.1", 0), token=TOKEN) as s:
        for _ in range(12):
            ids.extend(insert_plain(conn, quiet.schema_name, "slow") for _ in range(3))
            assert s.post()[0] == 202
            time.sleep(0.1)
        for job in ids:
            wait_done(conn, quiet.schema_name, job, 20)
    assert live["max"] == 1
    assert sum(r.succeeded for _, r in s.reports) == len(ids)
