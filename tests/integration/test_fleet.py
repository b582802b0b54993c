"""Fleets on the real server: 32 tenant databases, one control database a test.

What a fleet run touches is checked where the server counts it: pg_stat_database.sessions
of every tenant database (a tenant with no known work must get no session at all).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from drainer.fleet import due, due_async
from drainer.fleet.control import Control, connect_control
from drainer.fleet.migrate import migrate_fleet
from drainer.fleet.run import run_fleet
from drainer.fleet.status import fleet_next_wake, fleet_status
from drainer.fleet.tenants import Tenant
from drainer.job import Job
from drainer.migrate import latest_version
from drainer.registry import Registry
from drainer.settings import Settings, load_settings
from tests.integration._fleet import (
    Fleet,
    clear,
    create_database,
    enqueue,
    jobs,
    migrate_to,
    sessions,
    tenant_fleet,
)

TENANTS = 32


def _registry() -> Registry:
    reg = Registry()

    @reg.task("work", transaction=True)
    def work(job: Job) -> dict[str, Any]:
        assert job.conn is not None
        row = job.conn.execute("SELECT current_database()").fetchone()
        assert row is not None
        return {"db": row[0], "payload": job.payload}

    @reg.task("flaky")
    def flaky(job: Job) -> None:
        if job.attempt == 1:
            raise RuntimeError("the first attempt fails")

    @reg.task("slow")
    def slow(job: Job) -> None:
        time.sleep(float(job.payload.get("s", 0.2)))

    @reg.task("echo")
    async def echo(job: Job) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        return {"payload": job.payload}

    return reg


REGISTRY = _registry()


@pytest.fixture(scope="module")
def fleet(pg_url: str) -> Iterator[Fleet]:
    with tenant_fleet(pg_url, TENANTS) as f:
        yield f


@pytest.fixture(scope="module")
def control_database(fleet: Fleet) -> str:
    """The control database of the module's tests (dropped with the fleet's databases: a
    DROP DATABASE waits for a checkpoint, seconds after the tenants were created)."""
    fleet.databases.append(f"{fleet.prefix}_ctl")
    return create_database(fleet.server_url, fleet.databases[-1])


@pytest.fixture
def control_url(fleet: Fleet, control_database: str) -> str:
    """The control database with no control table, and every tenant's jobs table empty."""
    with psycopg.connect(control_database, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS drainer CASCADE")
    clear(fleet)
    return control_database


def _settings(control_url: str, **kw: Any) -> Settings:
    base: dict[str, Any] = {"fleet_url": control_url, "connect_retries": 0,
                            "connect_timeout": 3, "retry_base": 1.0, "fleet_concurrency": 4,
                            "vacuum_threshold": 0}
    base.update(kw)
    return load_settings(**base)


@pytest.fixture
def settings(control_url: str) -> Settings:
    s = _settings(control_url)
    with connect_control(s) as conn:
        Control(conn, s.schema_name).create()
    return s


def _run(settings: Settings, tenants: list[Tenant], **kw: Any) -> Any:
    return run_fleet(settings, tenants=tenants, registry=REGISTRY, **kw)


def _rows(settings: Settings) -> dict[str, dict[str, Any]]:
    with connect_control(settings) as conn:
        return {r["name"]: r for r in Control(conn, settings.schema_name).status()}


def _lines(report: Any) -> dict[str, Any]:
    return {line.tenant: line for line in report.lines}


# -- who is connected to ---------------------------------------------------------------------------


def test_a_run_drains_the_due_tenants_and_opens_no_session_on_the_others(
        fleet: Fleet, settings: Settings) -> None:
    first = _run(settings, fleet.tenants)
    # never seen: every tenant gets one drain (its jobs may predate the fleet)
    assert sorted(_lines(first)) == sorted(t.name for t in fleet.tenants)
    assert not first.failed and all(line.never_seen for line in first.lines)
    assert all(r["finished_at"] is not None for r in _rows(settings).values())

    busy = fleet.tenants[3], fleet.tenants[17]
    quiet_with_a_job = fleet.tenants[9]  # inserted with no `due`: no fleet wake sees it
    for t in (*busy, quiet_with_a_job):
        enqueue(t.url, "work", [{"n": i} for i in range(5)])
    with psycopg.connect(settings.fleet_url.get_secret_value()  # type: ignore[union-attr]
                         ) as conn:
        due(conn, [t.name for t in busy])
    tenant_databases = [fleet.database_of(t) for t in fleet.tenants]
    before = sessions(fleet.server_url, tenant_databases)
    second = _run(settings, fleet.tenants)
    after = sessions(fleet.server_url, tenant_databases)

    assert sorted(_lines(second)) == sorted(t.name for t in busy)
    opened = {db: after[db] - before[db] for db in before if after[db] != before[db]}
    # a drain with jobs: its connection and its heartbeat's; nobody else: none
    assert set(opened) == {fleet.database_of(t) for t in busy}, opened
    assert set(opened.values()) <= {1, 2}, opened
    for t in busy:
        line = _lines(second)[t.name]
        assert (line.outcome, line.counts["succeeded"], line.recorded) == ("drained", 5, True)
    assert {j["status"] for j in jobs(quiet_with_a_job.url)} == {"queued"}
    assert second.totals()["tenants_due"] == 2 and second.totals()["succeeded"] == 10


def test_each_tenant_is_drained_with_its_own_url_only(fleet: Fleet, control_url: str
                                                      ) -> None:
    # tenants at once, each with handler threads and an event loop of its own
    settings = _settings(control_url, concurrency=4)
    with connect_control(settings) as conn:
        Control(conn, settings.schema_name).create()
    chosen = fleet.tenants[:8]
    for t in chosen:
        enqueue(t.url, "work", [{"tenant": t.name}] * 3)
        enqueue(t.url, "echo", [{"tenant": t.name}] * 20)
    report = _run(settings, chosen)
    for t in chosen:
        line = _lines(report)[t.name]
        rows = jobs(t.url)
        assert {r["status"] for r in rows} == {"done"} and line.counts["succeeded"] == 23
        # the handler ran on this tenant's database, on this tenant's run ids
        assert {r["result"]["db"] for r in rows if r["queue"] == "work"} == {
            fleet.database_of(t)}
        assert {r["result"]["payload"]["tenant"] for r in rows} == {t.name}
        assert {r["run_id"] for r in rows} <= set(line.run_ids)
        # nothing of another tenant in its line
        text = str(line.as_dict())
        for other in chosen:
            if other is not t:
                assert other.name not in text and fleet.database_of(other) not in text
    all_run_ids = [rid for line in report.lines for rid in line.run_ids]
    assert len(all_run_ids) == len(set(all_run_ids))


def test_each_tenant_pushes_its_own_metrics_group(fleet: Fleet, control_url: str) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.integration.test_metrics import parse_exposition, value

    pushes: dict[str, str] = {}

    class Gateway(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            pushes[self.path] = body.decode()
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = _settings(control_url, pushgateway_url=(
            f"http://127.0.0.1:{server.server_address[1]}"), pushgateway_instance="fleet-a")
        with connect_control(settings) as conn:
            Control(conn, settings.schema_name).create()
        chosen = fleet.tenants[:4]
        for i, t in enumerate(chosen):
            enqueue(t.url, "work", [{}] * (i + 1))
        report = _run(settings, chosen)
    finally:
        server.shutdown()
        server.server_close()
    assert report.totals()["succeeded"] == 10
    # one group a tenant, its own counts: runs at once never share or swap a group
    assert sorted(pushes) == sorted(f"/metrics/job/drainer/instance/fleet-a/tenant/{t.name}"
                                    for t in chosen)
    for i, t in enumerate(chosen):
        samples = parse_exposition(pushes[f"/metrics/job/drainer/instance/fleet-a/tenant/{t.name}"])
        assert value(samples, "drainer_run_jobs", outcome="succeeded") == i + 1


# -- what a run writes back ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_later_run_serves_a_retry_without_due(fleet: Fleet, settings: Settings) -> None:
    t = fleet.tenants[5]
    _run(settings, fleet.tenants)  # every tenant seen once
    enqueue(t.url, "flaky", [{}])
    with connect_control(settings) as conn:
        due(conn, t.name)
    first = _run(settings, fleet.tenants)
    line = _lines(first)[t.name]
    assert (line.counts["retried"], line.remaining_due) == (1, 0)
    assert line.next_due_at is not None and line.recorded_next_due_at is not None
    written = datetime.fromisoformat(line.recorded_next_due_at)
    assert written == datetime.fromisoformat(line.next_due_at)  # the report's, as it is
    assert written > datetime.now(timezone.utc)
    # before it is due, a run touches nobody
    assert [x.tenant for x in _run(settings, fleet.tenants).lines] == []
    time.sleep(max(0.0, (written - datetime.now(timezone.utc)).total_seconds()) + 0.1)
    later = _run(settings, fleet.tenants)
    assert [x.tenant for x in later.lines] == [t.name]
    assert _lines(later)[t.name].counts["succeeded"] == 1
    assert {j["status"] for j in jobs(t.url)} == {"done"}
    assert _rows(settings)[t.name]["next_due_at"] is None


def test_a_broken_tenant_is_reported_and_does_not_stop_the_others(
        fleet: Fleet, settings: Settings) -> None:
    down = Tenant("down", fleet.tenants[0].url.rsplit("/", 1)[0] + "/fl_no_such_database")
    unmigrated = fleet.add(f"bare_{uuid.uuid4().hex[:4]}", template=None)
    good = fleet.tenants[10:14]
    for t in good:
        enqueue(t.url, "work", [{"n": 1}])
    report = _run(settings, [down, unmigrated, *good])
    lines = _lines(report)
    assert (lines["down"].outcome, lines["down"].exit_code) == ("unavailable", 3)
    assert (lines[unmigrated.name].outcome, lines[unmigrated.name].exit_code) == ("schema", 4)
    assert "drainer migrate" in (lines[unmigrated.name].error or "")
    for t in good:
        assert (lines[t.name].outcome, lines[t.name].counts["succeeded"]) == ("drained", 1)
        assert "down" not in str(lines[t.name].as_dict())
    assert sorted(x.tenant for x in report.failed) == sorted(["down", unmigrated.name])
    rows = _rows(settings)
    for name in ("down", unmigrated.name):
        assert rows[name]["failures"] == 1 and rows[name]["error"]
        assert rows[name]["next_due_at"] > rows[name]["finished_at"]  # backed off
    # the next run does not try them again before their backoff
    assert _run(settings, [down, unmigrated, *good]).lines == []


def test_a_due_mark_during_a_turn_survives_its_write_back(fleet: Fleet, settings: Settings
                                                          ) -> None:
    t = fleet.tenants[20]
    marked = threading.Event()

    reg = _registry()

    @reg.task("mark")
    def mark(job: Job) -> None:  # a producer says "due" while the tenant is drained
        with connect_control(settings) as conn:
            due(conn, t.name)
        marked.set()

    enqueue(t.url, "mark", [{}])
    report = run_fleet(settings, tenants=[t], registry=reg)
    assert marked.is_set() and _lines(report)[t.name].next_due_at is None
    assert _rows(settings)[t.name]["next_due_at"] is not None  # still due: the mark kept
    again = run_fleet(settings, tenants=[t], registry=reg)
    assert [x.tenant for x in again.lines] == [t.name]
    assert _rows(settings)[t.name]["next_due_at"] is None  # seen by that run: cleared


# -- fairness and concurrent runs ------------------------------------------------------------------


@pytest.mark.slow
def test_a_deep_tenant_goes_to_the_back_of_the_line(fleet: Fleet, control_url: str) -> None:
    settings = _settings(control_url, fleet_concurrency=1, fleet_tenant_budget=0.6)
    with connect_control(settings) as conn:
        Control(conn, settings.schema_name).create()
    deep, *shallow = fleet.tenants[24:28]
    enqueue(deep.url, "slow", [{"s": 0.1}] * 20)
    for t in shallow:
        enqueue(t.url, "slow", [{"s": 0.1}])
    report = _run(settings, [deep, *shallow])
    lines = _lines(report)
    assert lines[deep.name].turns >= 2 and lines[deep.name].counts["succeeded"] == 20
    assert all(lines[t.name].turns == 1 for t in shallow)
    # every shallow tenant was served before the deep one's second turn
    deep_done = sorted(j["finished_at"] for j in jobs(deep.url))
    first_turn = [j["finished_at"] for j in jobs(deep.url)
                  if j["run_id"] == lines[deep.name].run_ids[0]]
    later = [f for f in deep_done if f > max(first_turn)]
    assert later
    for t in shallow:
        (job,) = jobs(t.url)
        assert job["finished_at"] < min(later)


def test_two_concurrent_runs_never_drain_one_tenant_at_once(fleet: Fleet, settings: Settings
                                                            ) -> None:
    chosen = fleet.tenants[:16]
    for t in chosen:
        enqueue(t.url, "slow", [{"s": 0.05}] * 4)
    reports: list[Any] = []
    start = threading.Barrier(2)

    def one() -> None:
        start.wait()
        reports.append(_run(settings, chosen))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    a, b = (set(_lines(r)) for r in reports)
    assert not a & b, a & b
    assert a | b == {t.name for t in chosen}
    for t in chosen:
        rows = jobs(t.url)
        assert [r["status"] for r in rows] == ["done"] * 4
        assert all(r["attempts"] == 1 for r in rows)


def test_a_tenant_whose_lease_passed_in_line_is_not_drained_by_its_first_run(
        fleet: Fleet, settings: Settings) -> None:
    t = fleet.tenants[30]
    with connect_control(settings) as conn:
        control = Control(conn, settings.schema_name)
        assert control.claim([t.name], "run-a", 60, None).claimed == [(t.name, True)]
        assert control.claim([t.name], "run-b", 60, None).busy == [t.name]
        conn.execute("UPDATE drainer.fleet_tenants SET leased_until = now() - interval '1 s'")
        assert control.claim([t.name], "run-b", 60, None).claimed == [(t.name, True)]
        assert control.renew(t.name, "run-a", 60) is False  # run-a must skip it
        written, _ = control.record(t.name, "run-a", outcome="drained", error=None,
                                    failed=False, work_left=False, next_due_at=None,
                                    schema_version=None, report={})
        assert written is False
        assert control.renew(t.name, "run-b", 60) is True


def test_a_run_skips_a_tenant_another_run_took_while_it_waited_in_line(
        fleet: Fleet, control_url: str) -> None:
    settings = _settings(control_url, fleet_concurrency=1)
    with connect_control(settings) as conn:
        Control(conn, settings.schema_name).create()
    first, second = fleet.tenants[6], fleet.tenants[7]  # never seen: served by name
    reg = _registry()

    @reg.task("steal")
    def steal(job: Job) -> None:  # while the first drains, the second's lease passes and
        with connect_control(settings) as conn:  # another run leases it
            conn.execute("UPDATE drainer.fleet_tenants SET leased_until = now() - "
                         "interval '1 s' WHERE name = %s", [second.name])
            Control(conn, settings.schema_name).claim([second.name], "other-run", 60, None)

    enqueue(first.url, "steal", [{}])
    enqueue(second.url, "work", [{}])
    report = run_fleet(settings, tenants=[first, second], registry=reg)
    assert [x.tenant for x in report.lines] == [first.name] and report.busy == [second.name]
    assert not report.failed
    assert {j["status"] for j in jobs(second.url)} == {"queued"}  # left to the other run
    assert _rows(settings)[second.name]["leased_by"] == "other-run"


def test_a_run_that_runs_out_of_time_releases_the_tenants_it_did_not_reach(
        fleet: Fleet, control_url: str) -> None:
    settings = _settings(control_url, fleet_concurrency=1, max_runtime=0.5)
    with connect_control(settings) as conn:
        Control(conn, settings.schema_name).create()
    chosen = fleet.tenants[:5]
    for t in chosen:
        enqueue(t.url, "slow", [{"s": 0.4}])
    report = _run(settings, chosen)
    assert report.left and report.as_dict()["deadline_hit"]
    assert set(report.left).isdisjoint(_lines(report))
    rows = _rows(settings)
    assert all(rows[name]["leased_by"] is None for name in report.left)
    # the next run takes them (they were never drained, so they are still due)
    rest = _run(_settings(control_url), chosen)
    assert set(report.left) <= set(_lines(rest))


# -- due, status, next-wake -----------------------------------------------------------------------


def test_due_sync_and_async_bring_a_tenant_forward(fleet: Fleet, settings: Settings) -> None:
    _run(settings, fleet.tenants[:3])
    url = settings.fleet_url.get_secret_value()  # type: ignore[union-attr]
    soon = datetime.now(timezone.utc) + timedelta(hours=1)
    with psycopg.connect(url, autocommit=True) as conn:
        due(conn, "t00", at=soon)
        due(conn, "t00", at=soon + timedelta(hours=1))  # later: the earlier one stays
        with pytest.raises(ValueError, match="timezone-aware"):
            due(conn, "t01", at=datetime(2030, 1, 1))
        with pytest.raises(ValueError, match="invalid tenant name"):
            due(conn, "no spaces")

    async def mark() -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await due_async(conn, ["t01", "not-listed-yet"])

    asyncio.run(mark())
    rows = _rows(settings)
    assert abs((rows["t00"]["next_due_at"] - soon).total_seconds()) < 0.01
    assert rows["t01"]["next_due_at"] <= datetime.now(timezone.utc)
    assert rows["not-listed-yet"]["finished_at"] is None
    with connect_control(settings) as conn:
        control = Control(conn, settings.schema_name)
        wake = fleet_next_wake(control, ["t00", "t02"], None)
        assert wake.at is not None and abs((wake.at - soon).total_seconds()) < 0.01
        assert wake.tenant == "t00"
        assert fleet_next_wake(control, ["t02"], None).at is None  # idle: no wake
        net = fleet_next_wake(control, ["t02"], 3600)
        assert net.at is not None and net.at > datetime.now(timezone.utc)
        assert fleet_next_wake(control, ["t01"], None).reason.endswith("due now")
        assert "never drained" in fleet_next_wake(control, ["t02", "t31"], None).reason
        status = fleet_status(control, ["t00", "t01", "t31"])
    assert status["never_seen"] == ["t31"]
    assert status["counts"] == {"tenants": 3, "due_now": 1, "never_drained": 1,
                                "failing": 0, "leased": 0}


# -- migrations -----------------------------------------------------------------------------------


def test_fleet_migrate_brings_tenants_at_different_versions_to_the_latest(
        fleet: Fleet, settings: Settings) -> None:
    empty = fleet.add(f"v0_{uuid.uuid4().hex[:4]}", template=None)
    old = fleet.add(f"v3_{uuid.uuid4().hex[:4]}", template=None)
    migrate_to(old.url, 3)
    current = fleet.tenants[2]
    down = Tenant("down", fleet.tenants[0].url.rsplit("/", 1)[0] + "/fl_no_such_database")
    latest = latest_version()
    lines: list[Any] = []
    with connect_control(settings) as conn:
        control = Control(conn, settings.schema_name)
        result = migrate_fleet(settings, [empty, old, current, down], control,
                               on_line=lines.append)
        by = {m.tenant: m for m in result.lines}
        assert (by[empty.name].outcome, by[empty.name].from_version) == ("migrated", None)
        assert (by[old.name].outcome, by[old.name].from_version) == ("migrated", 3)
        assert by[old.name].applied[0].startswith("0004")
        assert (by[current.name].outcome, by[current.name].applied) == ("current", [])
        assert (by["down"].outcome, by["down"].exit_code) == ("unavailable", 3)
        assert len(lines) == 4 and result.as_dict()["failed_tenants"] == ["down"]
        assert control.versions([empty.name, old.name, current.name]) == dict.fromkeys(
            [empty.name, old.name, current.name], latest)
        # resumable: those at the latest version are skipped without a connection
        tenant_databases = [fleet.database_of(t) for t in (empty, old, current)]
        before = sessions(fleet.server_url, tenant_databases)
        again = migrate_fleet(settings, [empty, old, current, down], control)
        assert {m.tenant: m.outcome for m in again.lines} == {
            empty.name: "skipped", old.name: "skipped", current.name: "skipped",
            "down": "unavailable"}
        assert sessions(fleet.server_url, tenant_databases) == before
        rechecked = migrate_fleet(settings, [empty, old], control, recheck=True)
        assert {m.outcome for m in rechecked.lines} == {"current"}
    report = _run(settings, [empty, old])
    assert not report.failed


def test_the_control_table_is_created_once_and_a_missing_one_is_a_schema_error(
        fleet: Fleet, control_url: str) -> None:
    from drainer.errors import SchemaError

    settings = _settings(control_url)
    with pytest.raises(SchemaError, match="drainer fleet migrate"):
        _run(settings, fleet.tenants[:1])
    with connect_control(settings) as conn:
        control = Control(conn, settings.schema_name)
        control.create()
        control.create()
        control.check()
