"""``drainer ui --fleet-url`` in headless Chromium: the fleet view lists the tenants with
their next due time, last outcome and error, from the control database only."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

from drainer.fleet import due
from drainer.fleet.control import Control, connect_control
from drainer.fleet.run import run_fleet
from drainer.fleet.tenants import Tenant
from drainer.job import Job
from drainer.registry import Registry
from drainer.settings import load_settings
from tests.acceptance._proc import DrainerProcess
from tests.browser._cdp import Browser
from tests.browser.conftest import shot, start_ui, stop_ui
from tests.integration._fleet import Fleet, create_database, enqueue, sessions, tenant_fleet

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(pg_url: str) -> Iterator[Fleet]:
    with tenant_fleet(pg_url, 4) as f:
        yield f


def test_the_fleet_view_shows_each_tenants_due_time_outcome_and_error(
        fleet: Fleet, pg_url: str, browser: Browser) -> None:
    registry = Registry()

    @registry.task("work")
    def work(job: Job) -> None:
        pass

    fleet.databases.append(f"{fleet.prefix}_ctl")
    control_url = create_database(pg_url, fleet.databases[-1])
    settings = load_settings(fleet_url=control_url, connect_retries=0, connect_timeout=3,
                             vacuum_threshold=0)
    with connect_control(settings) as conn:
        Control(conn, settings.schema_name).create()
    ui_db, *tenants = fleet.tenants  # the dashboard's own database is one more tenant's
    with psycopg.connect(tenants[1].url, autocommit=True) as conn:  # known work, later
        conn.execute("INSERT INTO drainer.jobs (queue, payload, run_at) VALUES "
                     "('work', '{}', now() + interval '2 hours')")
    enqueue(tenants[0].url, "work", [{}])
    down = Tenant("down", tenants[0].url.rsplit("/", 1)[0] + "/fl_no_such_database")
    report = run_fleet(settings, tenants=[*tenants, down], registry=registry)
    assert {line.tenant: line.outcome for line in report.lines}["down"] == "unavailable"
    with psycopg.connect(control_url, autocommit=True) as conn:
        due(conn, tenants[2].name)

    proc, base = start_ui(ui_db.url, "--fleet-url", control_url)
    try:
        before = sessions(pg_url, [fleet.database_of(t) for t in tenants])
        browser.open(base + "/")
        browser.click('a[href="/fleet"]')
        assert browser.url().endswith("/fleet")
        rows: dict[str, list[str]] = {r[0]: r for r in _rows(browser)}
        assert set(rows) == {t.name for t in tenants} | {"down"}
        assert rows["down"][3] == "unavailable" and "fl_no_such_database" in rows["down"][5]
        assert rows["down"][4] == "1"  # failures in a row; its next try after a backoff
        assert rows[tenants[0].name][1] == "no known work"
        assert rows[tenants[0].name][3] == "drained" and rows[tenants[0].name][5] == ""
        # the delayed job's time, from its run report (no mark)
        shown = datetime.strptime(rows[tenants[1].name][1][:20], "%Y-%m-%d %H:%M:%SZ")
        later = datetime.now(timezone.utc) + timedelta(hours=2)
        assert abs(shown.replace(tzinfo=timezone.utc) - later) < timedelta(minutes=2)
        assert rows[tenants[2].name][1] == "now"  # the due mark
        text = browser.text()
        assert "Read the database at" in text and "no tenant database is connected" in text
        shot(browser, "fleet")
        # the page read the control database only: no session on any tenant
        assert sessions(pg_url, [fleet.database_of(t) for t in tenants]) == before
    finally:
        stop_ui(proc)


def test_static_writes_the_fleet_view_from_the_control_database_only(
        fleet: Fleet, pg_url: str, tmp_path: Path) -> None:
    fleet.databases.append(f"{fleet.prefix}_ctl_static")
    control_url = create_database(pg_url, fleet.databases[-1])
    settings = load_settings(fleet_url=control_url, connect_retries=0, connect_timeout=3)
    with connect_control(settings) as conn:
        Control(conn, settings.schema_name).create()
    ui_db, *tenants = fleet.tenants
    with psycopg.connect(control_url, autocommit=True) as conn:
        due(conn, tenants[0].name)
    before = sessions(pg_url, [fleet.database_of(t) for t in tenants])
    proc = DrainerProcess(["ui", "--static", str(tmp_path), "--fleet-url", control_url],
                          pg_url=ui_db.url, schema="drainer")
    try:
        assert proc.wait(60) == 0, proc.stderr()
    finally:
        proc.kill()
    page = (tmp_path / "fleet.html").read_text(encoding="utf-8")
    assert tenants[0].name in page and "now" in page and "<form" not in page
    assert 'href="fleet.html"' in (tmp_path / "index.html").read_text(encoding="utf-8")
    assert sessions(pg_url, [fleet.database_of(t) for t in tenants]) == before


def _rows(browser: Browser) -> list[list[str]]:
    found: Any = browser.evaluate(
        "Array.from(document.querySelectorAll('table tr')).slice(1).map(r => "
        "Array.from(r.cells).map(c => c.innerText.trim()))")
    return [[str(c) for c in r] for r in found]
