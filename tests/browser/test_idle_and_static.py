"""The dashboard lets the database sleep: one session per page load, none and no
transaction while a page stays open and nobody loads another; and ``drainer ui --static``
writes the same pages as files, readable with JavaScript off."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql

from bench.cli import _db_counters
from tests.browser._cdp import Browser
from tests.browser._demo import SERIES, Demo
from tests.browser.conftest import SCHEMA, TOKEN, shot
from tests.conftest import cli_env, finish

pytestmark = pytest.mark.slow

#: How long a page stays open with nobody loading another.
QUIET_S = 3.0


def _counters(pg_url: str, database: str) -> tuple[int, int]:
    """(sessions ever opened, transactions ended) of ``database``, read from another one
    (the benchmarks' reading of pg_stat_database)."""
    xacts, sessions = _db_counters(pg_url, database)
    return sessions, xacts


def _sessions_now(conn: psycopg.Connection[Any], database: str) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT pid, backend_type, state, application_name FROM "
                        "pg_stat_activity WHERE datname = %s", [database]).fetchall()


@pytest.fixture
def quiet_db(demo: Demo, demo_url: str) -> Iterator[str]:
    """The demo's database with autovacuum off on its tables for the test: only the
    dashboard opens sessions and runs transactions there."""
    tables = [sql.Identifier(SCHEMA, t) for t in ("jobs", "jobs_queues", "jobs_archive")]
    with psycopg.connect(demo_url, autocommit=True) as conn:
        for t in tables:
            conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(t))
    yield urlsplit(demo_url).path.lstrip("/")
    with psycopg.connect(demo_url, autocommit=True) as conn:
        for t in tables:
            conn.execute(sql.SQL("ALTER TABLE {} RESET (autovacuum_enabled)").format(t))


def _settled(pg_url: str, database: str, want_sessions: int) -> tuple[int, int]:
    """The counters once ``want_sessions`` sessions are counted (a backend's counts reach
    the statistics as it exits, just after the page was sent)."""
    deadline = time.monotonic() + 10
    while True:
        got = _counters(pg_url, database)
        if got[0] >= want_sessions or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_no_session_and_no_transaction_while_nobody_looks(
        ui: str, demo: Demo, quiet_db: str, pg_url: str, browser: Browser) -> None:
    pages = ["/", "/jobs", f"/jobs/{demo.failed_id}", "/runs", f"/runs/{demo.run_id}",
             "/recurring"]
    with psycopg.connect(pg_url, autocommit=True) as watcher:  # on another database
        sessions, _ = _settled(pg_url, quiet_db, 0)
        for path in pages:
            browser.open(ui + path)
            assert "Read the database at" in browser.text(), path
            # the page was sent after its connection closed: no session of ours is left
            assert _sessions_now(watcher, quiet_db) == [], path
            got, xacts = _settled(pg_url, quiet_db, sessions + 1)
            assert got == sessions + 1, (path, got - sessions)  # one session per page load
            sessions = got
            # the page stays open; nobody loads another: nothing happens in the database
            deadline = time.monotonic() + QUIET_S
            while time.monotonic() < deadline:
                assert _sessions_now(watcher, quiet_db) == [], path
                time.sleep(0.1)
            assert _counters(pg_url, quiet_db) == (sessions, xacts), path


def test_a_refresh_faster_than_the_idle_timeout_is_slowed_to_it(
        ui: str, browser: Browser) -> None:
    browser.open(ui + "/?refresh=10")
    text = browser.text()
    assert "would keep the compute awake" in text and "Auto-refresh every 5 min" in text
    assert browser.evaluate("document.querySelector('meta[http-equiv=refresh]').content") \
        == "301"
    browser.open(ui + "/")
    assert browser.evaluate("document.querySelectorAll('meta[http-equiv=refresh]').length") \
        == 0


#: Elements with no end tag.
VOID = {"input", "br", "img", "meta", "hr", "link", "col", "wbr"}


class _Text(HTMLParser):
    """The text of a page's <main>, less the line saying when it was read and the
    relative times ("12 s ago"), which differ between two reads."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.skip = 0
        self.parts: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        cls = (dict(attrs).get("class") or "").split()
        if tag == "main":
            self.depth += 1
        elif tag in VOID:
            return
        elif self.depth and (self.skip or tag == "form" or
                             {"read", "note", "muted", "act"} & set(cls)):
            self.skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "main":
            self.depth -= 1
        elif self.skip:
            self.skip -= 1

    def handle_data(self, data: str) -> None:
        if self.depth and not self.skip:
            self.parts.append(data)

    def text(self) -> str:
        return " ".join(" ".join(self.parts).split())


def _main_text(html: str) -> str:
    """The page's text, ages (``31 s``: the oldest due job's) as ``<age>``: they grow."""
    p = _Text()
    p.feed(html)
    return re.sub(r"\b\d+(\.\d+)? (s|min|h|d)\b", "<age>", p.text())


def test_static_writes_the_same_pages_readable_without_javascript(
        ui: str, demo: Demo, demo_url: str, tmp_path: Path, browser: Browser) -> None:
    import http.client

    out = tmp_path / "site"
    proc = subprocess.Popen([sys.executable, "-m", "drainer", "ui", "--static", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(demo_url, SCHEMA))
    code, stdout, stderr = finish(proc, 120)
    assert code == 0, stderr
    names = {p.name for p in out.iterdir()}
    assert json.loads(stdout) == {"directory": str(out), "pages": len(names)}
    assert {"index.html", "jobs.html", "jobs-failed.html", "runs.html", "recurring.html",
            "awake.html", f"job-{demo.failed_id}.html", f"job-{demo.fanout_id}.html",
            f"run-{demo.run_id}.html"} <= names, sorted(names)
    pairs = {"index.html": "/", "jobs.html": "/jobs", "jobs-failed.html": "/jobs?status=failed",
             f"job-{demo.failed_id}.html": f"/jobs/{demo.failed_id}",
             f"job-{demo.fanout_id}.html": f"/jobs/{demo.fanout_id}",
             "runs.html": "/runs", f"run-{demo.run_id}.html": f"/runs/{demo.run_id}",
             "recurring.html": "/recurring"}
    host = urlsplit(ui)
    for name, path in pairs.items():
        conn = http.client.HTTPConnection(host.hostname or "", host.port, timeout=30)
        conn.request("GET", path, headers={"Authorization": f"Bearer {TOKEN}"})
        served = conn.getresponse().read().decode()
        conn.close()
        written = (out / name).read_text()
        assert "<script" not in written and "<form" not in written, name
        assert _main_text(written) == _main_text(served), name
    # in a browser with JavaScript off: the pages and the links between them work
    browser.send("Emulation.setScriptExecutionDisabled", {"value": True})
    browser.open((out / "index.html").as_uri())
    assert "A static page: it reads nothing when opened." in browser.text()
    shot(browser, "static-queues")
    browser.click('a[href="recurring.html"]')
    assert SERIES in browser.text()
    browser.click('a[href^="job-"]')
    assert browser.url().startswith((out / "job-").as_uri())
