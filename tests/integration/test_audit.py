"""``drainer audit`` against real sessions made by the test: a poller, an idle session, a
session idle in transaction and a client that reconnects again and again."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from drainer.audit import SessionFilter, audit
from drainer.cli.status import render_audit
from drainer.waking import IdleTimeout
from tests.conftest import cli_env, finish, make_settings, run_cli

IDLE = IdleTimeout(3.0, "--idle-timeout")


class Sessions:
    """Background sessions with application names '<prefix>-<role>'."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.conns: list[psycopg.Connection[Any]] = []

    def name(self, role: str) -> str:
        return f"{self.prefix}-{role}"

    def connect(self, role: str, **kw: Any) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.url, application_name=self.name(role), **kw)
        self.conns.append(conn)
        return conn

    def poller(self, every: float = 1.0) -> None:
        conn = self.connect("poller", autocommit=True)

        def loop() -> None:
            while not self.stop.is_set():
                conn.execute("SELECT count(*) FROM pg_class WHERE relkind = 'r'")
                self.stop.wait(every)

        self._thread(loop)

    def idle(self) -> None:
        self.connect("idle", autocommit=True).execute("SELECT 1")

    def idle_in_transaction(self) -> None:
        conn = self.connect("idletx")  # not autocommit: BEGIN is implicit
        conn.execute("SELECT now()")

    def reconnecting(self, every: float = 1.0, stay: float = 0.6) -> None:
        def loop() -> None:
            while not self.stop.is_set():
                with psycopg.connect(self.url, application_name=self.name("reconnect"),
                                     autocommit=True) as c:
                    c.execute("SELECT 1")
                    self.stop.wait(stay)
                self.stop.wait(every - stay)

        self._thread(loop)

    def _thread(self, target: Any) -> None:
        t = threading.Thread(target=target, daemon=True)
        t.start()
        self.threads.append(t)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)
        for c in self.conns:
            c.close()


@pytest.fixture
def sessions(pg_url: str, schema: str) -> Iterator[Sessions]:
    s = Sessions(pg_url, f"audit-{schema}")
    yield s
    s.close()


def run_audit_cli(pg_url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "drainer", "audit", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(pg_url, None))


def test_audit_names_what_keeps_the_compute_awake(pg_url: str, schema: str,
                                                  sessions: Sessions) -> None:
    sessions.idle()
    sessions.idle_in_transaction()
    sessions.poller(every=1.0)
    sessions.reconnecting(every=1.0)
    time.sleep(0.3)
    # the audit's own session matches the filter too: it must leave itself out
    settings = make_settings(pg_url, schema, application_name=sessions.name("self"))
    result = audit(settings, duration=5, idle=IDLE,
                   filters=SessionFilter(application_names=[f"{sessions.prefix}-%"]))

    assert not result.could_suspend
    assert result.samples >= 10
    by_app: dict[str, list[Any]] = {}
    for s in result.sessions:
        by_app.setdefault(s.application_name or "", []).append(s)
    assert sessions.name("self-audit") not in by_app

    (poller,) = by_app[sessions.name("poller")]
    assert poller.keeps_awake
    m = re.fullmatch(r"polls about every (\d+\.\d) s", poller.reason)
    assert m, poller.reason
    assert 0.9 <= float(m.group(1)) <= 1.4
    assert poller.query is not None and poller.query.startswith("SELECT count(*)")

    (idle,) = by_app[sessions.name("idle")]
    assert not idle.keeps_awake and idle.reason.startswith("idle for")
    assert idle.user and idle.backend_type == "client backend"

    (idletx,) = by_app[sessions.name("idletx")]
    assert idletx.keeps_awake and idletx.state == "idle in transaction"
    m = re.fullmatch(r"idle in transaction (\d+) s", idletx.reason)
    assert m and int(m.group(1)) >= 4, idletx.reason

    (client,) = [c for c in result.reconnecting_clients
                 if c.application_name == sessions.name("reconnect")]
    assert client.keeps_awake and client.new_connections >= 3
    assert client.reconnect_interval_s is not None and 0.9 <= client.reconnect_interval_s < 1.6
    assert len(by_app[sessions.name("reconnect")]) == client.connections

    assert result.longest_quiet_gap_s < IDLE.seconds
    assert len(result.keeping_awake) == 3
    table = render_audit(result)
    assert "polls about every" in table and "idle in transaction" in table
    assert "reconnects about every" in table


def test_cli_exit_codes_poller_then_clean(pg_url: str, sessions: Sessions) -> None:
    sessions.idle()
    sessions.poller(every=1.0)
    time.sleep(3.2)  # the idle session has now been quiet for longer than 3 s
    common = ["--duration", "4", "--idle-timeout", "3"]
    awake = run_audit_cli(pg_url, *common, "--json",
                          "--only-application", sessions.name("poller"))
    clean = run_audit_cli(pg_url, *common, "--only-application", sessions.name("idle"),
                          "--only-database", "postgres")
    _, out, err = finish(awake, 60)
    assert awake.returncode == 1, err
    report = json.loads(out)
    assert report["could_suspend"] is False
    assert next(s["reason"] for s in report["sessions"]).startswith("polls about every")
    assert report["filters"]["application_names"] == [sessions.name("poller")]

    _, out, err = finish(clean, 60)
    assert clean.returncode == 0, err + out
    assert "could suspend: quiet for" in out
    assert sessions.name("idle") in out and "idle for" in out


def test_cli_bad_duration_is_one_line(pg_url: str) -> None:
    proc = run_audit_cli(pg_url, "--duration", "soon")
    _, _out, err = finish(proc, 30)
    assert proc.returncode == 2
    assert err.strip().count("\n") == 0 and "--duration" in err


def test_an_unprivileged_user_is_told_what_it_cannot_see(pg_url: str, schema: str,
                                                        sessions: Sessions) -> None:
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    role = f"{schema}_audit"
    target = sessions.connect("idle", autocommit=True)
    target.execute("SELECT 1")
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        settings = make_settings(make_conninfo(pg_url, user=role), schema)
        result = audit(settings, duration=1, idle=IDLE,
                       filters=SessionFilter(pids=[target.info.backend_pid]))
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    (s,) = result.sessions
    assert s.pid == target.info.backend_pid and s.reason.startswith("hidden")
    assert "pg_read_all_stats" in result.verdict


@pytest.fixture
def own_database(pg_url: str, schema: str) -> Iterator[str]:
    from psycopg import sql

    name = f"{schema}_db"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield name
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))


def test_connections_too_short_for_any_sample_are_caught(pg_url: str, schema: str,
                                                         own_database: str) -> None:
    from psycopg.conninfo import make_conninfo

    url = make_conninfo(pg_url, dbname=own_database)
    with psycopg.connect(pg_url) as c:
        if c.info.server_version < 150000:
            pytest.skip("session counters need PostgreSQL 15")
    stop = threading.Event()

    def cron_like() -> None:  # connect, one query, disconnect: a few ms every second
        while not stop.is_set():
            with psycopg.connect(url, autocommit=True) as c:
                c.execute("SELECT 1")
            stop.wait(1.0)

    t = threading.Thread(target=cron_like, daemon=True)
    t.start()
    try:
        # the audit connects to another database: nothing of its own in the counts
        result = audit(make_settings(pg_url, schema), duration=5, idle=IDLE,
                       filters=SessionFilter(databases=[own_database]))
    finally:
        stop.set()
        t.join(timeout=5)
    assert result.counters == "on"
    (u,) = result.unseen_connections
    assert u.database == own_database and u.connections >= 3
    assert u.keeps_awake and u.interval_s is not None and 0.8 <= u.interval_s <= 1.6
    assert not result.could_suspend

    # and nothing at all once it has stopped: the audit's own connection is not counted
    quiet = audit(make_settings(url, schema), duration=2, idle=IDLE,
                  filters=SessionFilter(databases=[own_database]))
    assert quiet.unseen_connections == [] and quiet.sessions == []
    assert quiet.could_suspend


def test_cli_only_pid_and_user(pg_url: str, sessions: Sessions) -> None:
    target = sessions.connect("idle", autocommit=True)
    target.execute("SELECT 1")
    pid = target.info.backend_pid
    proc = run_audit_cli(pg_url, "--duration", "1", "--idle-timeout", "3", "--json",
                         "--only-pid", f"{pid},{pid}", "--only-user", "postgres")
    _, out, err = finish(proc, 30)
    report = json.loads(out)
    assert [s["pid"] for s in report["sessions"]] == [pid], err
    assert report["filters"]["pids"] == [pid, pid]
    assert report["counters"].startswith("off")
    bad = run_audit_cli(pg_url, "--only-pid", "abc")
    _, _, err = finish(bad, 30)
    assert bad.returncode == 2 and "--only-pid" in err


def test_audit_prints_json_when_piped_and_writes_the_html_page(pg_url: str,
                                                               tmp_path: Any) -> None:
    page = tmp_path / "audit.html"
    p = run_cli(["audit", "--duration", "1", "--idle-timeout", "300", "--only-user",
                 "nobody_in_particular", "--html", str(page)], pg_url=pg_url, schema=None)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)  # piped: JSON, as status and jobs
    assert out["could_suspend"] is True and "sessions" in out
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "<svg" in text and "<script" not in text
    p = run_cli(["audit", "--duration", "1", "--html", str(tmp_path / "no" / "x.html"),
                 "--only-user", "nobody_in_particular"], pg_url=pg_url, schema=None)
    assert p.returncode == 2 and "--html: cannot write" in p.stderr
