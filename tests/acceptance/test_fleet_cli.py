"""``drainer fleet ...`` as a subprocess: lines, reports, exit codes, and no password out;
``drainer serve --fleet`` and ``drainer schedule --fleet``: POST /drain?tenant=NAME marks
and drains that tenant, the schedule wakes for known work only."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from drainer.fleet import due
from drainer.fleet.tenants import shard_of
from tests.acceptance._proc import DrainerProcess
from tests.conftest import ROOT, cli_env, finish, run_cli
from tests.integration._fleet import (
    Fleet,
    create_database,
    enqueue,
    jobs,
    sessions,
    tenant_fleet,
)

#: The password every tenant URL of the tenants file carries (trust auth ignores it): it
#: must appear in no output of any command.
PASSWORD = "pw-never-printed-7f3a"


@pytest.fixture(scope="module")
def fleet(pg_url: str) -> Iterator[Fleet]:
    with tenant_fleet(pg_url, 6) as f:
        yield f


@pytest.fixture
def files(fleet: Fleet, tmp_path: Path) -> dict[str, Any]:
    """A control database of the test's own (in the fleet's, dropped with them) and a
    tenants file: each URL with ${TENANT_PASSWORD}, one with ${file:...}, and a tenant
    whose database does not exist."""
    from uuid import uuid4

    name = f"{fleet.prefix}_ctl_{uuid4().hex[:6]}"
    fleet.databases.append(name)
    control = create_database(fleet.server_url, name)
    secret = tmp_path / "secret"
    secret.write_text(PASSWORD + "\n")
    lines = ["# the fleet of the test"]
    for i, t in enumerate(fleet.tenants):
        ref = "${file:" + str(secret) + "}" if i == 0 else "${TENANT_PASSWORD}"
        lines.append(f"{t.name}  {_with_password(t.url, ref)}   # tenant {i}")
    tenants = tmp_path / "tenants.txt"
    tenants.write_text("\n".join(lines) + "\n")
    broken = tmp_path / "with-broken.txt"
    down = fleet.tenants[0].url.rsplit("/", 1)[0] + "/fl_no_such_database"
    broken.write_text(tenants.read_text() + f"down {_with_password(down, '${TENANT_PASSWORD}')}\n")
    return {"control": control, "tenants": tenants, "broken": broken}


def _with_password(url: str, password: str) -> str:
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{password}@", 1)


def _fleet(args: list[str], files: dict[str, Any], tenants: str = "tenants",
           **env: str) -> subprocess.CompletedProcess[str]:
    proc = run_cli(["fleet", *args], pg_url=None, schema=None,
                   DRAINER_FLEET_URL=files["control"], DRAINER_APP="fleet_jobs",
                   DRAINER_FLEET_TENANTS=str(files[tenants]), TENANT_PASSWORD=PASSWORD,
                   DRAINER_LOG_FORMAT="json", **env)
    assert PASSWORD not in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_migrate_due_run_once_status_and_next_wake(fleet: Fleet, files: dict[str, Any]
                                                   ) -> None:
    proc = _fleet(["migrate"], files, "broken")
    assert proc.returncode == 7, proc.stderr
    *lines, summary = _json_lines(proc.stdout)
    assert sorted(line["tenant"] for line in lines) == sorted(
        [t.name for t in fleet.tenants] + ["down"])
    assert summary["summary"] and summary["failed_tenants"] == ["down"]
    assert summary["current"] == len(fleet.tenants)  # copies of a migrated template
    proc = _fleet(["migrate"], files)
    assert proc.returncode == 0 and _json_lines(proc.stdout)[-1]["skipped"] == 6

    first = _fleet(["run-once"], files)  # every tenant never seen: drained once
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["totals"]["tenants_drained"] == 6

    t = fleet.tenants[4]
    enqueue(t.url, "work", [{}, {}])
    proc = _fleet(["due", t.name], files)
    assert proc.returncode == 0 and json.loads(proc.stdout)["due"] == [t.name]
    wake = _fleet(["next-wake", "--json"], files)
    assert json.loads(wake.stdout)["due_now"] == 1
    report = _fleet(["run-once", "--fleet-concurrency", "2"], files)
    assert report.returncode == 0, report.stderr
    out = json.loads(report.stdout)
    assert [line["tenant"] for line in out["tenants"]] == [t.name]
    assert out["tenants"][0]["succeeded"] == 2
    assert {j["result"]["db"] for j in jobs(t.url)} == {fleet.database_of(t)}
    # the log lines of a tenant's run name it
    logged = [json.loads(x) for x in report.stderr.splitlines() if x.startswith("{")]
    assert any(r.get("tenant") == t.name for r in logged)

    assert _fleet(["next-wake"], files).stdout == ""  # nothing known: no wake
    status = json.loads(_fleet(["status", "--json"], files).stdout)
    assert status["counts"]["tenants"] == 6 and status["counts"]["due_now"] == 0
    text = _fleet(["status"], files)
    assert text.returncode == 0 and t.name in text.stdout


def test_a_broken_tenant_makes_run_once_exit_7_after_serving_the_others(
        fleet: Fleet, files: dict[str, Any]) -> None:
    assert _fleet(["migrate"], files).returncode == 0
    proc = _fleet(["run-once"], files, "broken")
    assert proc.returncode == 7, proc.stderr
    report = json.loads(proc.stdout)
    lines = {line["tenant"]: line for line in report["tenants"]}
    assert lines["down"]["outcome"] == "unavailable" and lines["down"]["exit_code"] == 3
    assert report["totals"]["tenants_drained"] == 6 and report["totals"]["tenants_failed"] == 1


@pytest.mark.parametrize(("content", "expected"), [
    ("# a comment\nb@d postgresql://x/y\n", "line 2: invalid tenant name 'b@d'"),
    ("ok postgresql://u:${NOT_SET_ANYWHERE}@h/db\n", "${NOT_SET_ANYWHERE} is not set"),
    ("ok postgresql://h/a\nok postgresql://h/b\n", "tenant 'ok' is listed twice"),
    ("lonely\n", "tenant 'lonely' has no URL"),
])
def test_a_bad_tenants_file_is_one_line_and_exit_2(files: dict[str, Any], tmp_path: Path,
                                                   content: str, expected: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(content)
    proc = _fleet(["run-once"], {**files, "bad": path}, "bad")
    assert proc.returncode == 2
    (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
    assert line.startswith(f"drainer fleet run-once: tenants file {path} ") and expected in line


def test_shards_split_the_tenants_and_take_the_index_from_kubernetes(
        fleet: Fleet, files: dict[str, Any]) -> None:
    assert _fleet(["migrate"], files).returncode == 0
    drained: dict[int, set[str]] = {}
    for index in (0, 1):
        proc = _fleet(["run-once"], files, DRAINER_FLEET_SHARD_COUNT="2",
                      JOB_COMPLETION_INDEX=str(index))
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert report["shard"] == f"{index}/2"
        drained[index] = {line["tenant"] for line in report["tenants"]}
    for index, names in drained.items():
        assert names == {t.name for t in fleet.tenants if shard_of(t.name, 2) == index}
    proc = _fleet(["run-once"], files, JOB_COMPLETION_INDEX="1")
    assert proc.returncode == 2 and "DRAINER_FLEET_SHARD_COUNT" in proc.stderr
    proc = _fleet(["run-once", "--shard", "2/2"], files)
    assert proc.returncode == 2 and "--shard" in proc.stderr


@pytest.mark.slow
def test_two_fleet_processes_at_once_never_drain_one_tenant_twice(
        fleet: Fleet, files: dict[str, Any]) -> None:
    assert _fleet(["migrate"], files).returncode == 0
    assert _fleet(["run-once"], files).returncode == 0
    for t in fleet.tenants:
        enqueue(t.url, "slow", [{"s": 0.3}] * 2)
    with psycopg.connect(files["control"], autocommit=True) as conn:
        from drainer.fleet import due

        due(conn, [t.name for t in fleet.tenants])
    env = cli_env(None, None, DRAINER_FLEET_URL=files["control"], DRAINER_APP="fleet_jobs",
                  DRAINER_FLEET_TENANTS=str(files["tenants"]), TENANT_PASSWORD=PASSWORD,
                  DRAINER_FLEET_CONCURRENCY="2")
    procs = [subprocess.Popen([sys.executable, "-m", "drainer", "fleet", "run-once"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=ROOT) for _ in range(2)]
    outs = [finish(p, 120) for p in procs]
    assert [code for code, _, _ in outs] == [0, 0], [err[-2000:] for _, _, err in outs]
    served = [{line["tenant"] for line in json.loads(out)["tenants"]} for _, out, _ in outs]
    assert not served[0] & served[1]
    assert served[0] | served[1] == {t.name for t in fleet.tenants}
    for t in fleet.tenants:
        assert [(j["status"], j["attempts"]) for j in jobs(t.url)
                if j["queue"] == "slow"] == [("done", 1)] * 2


# -- serve --fleet and schedule --fleet ----------------------------------------------------------


TOKEN = "fleet-trigger-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _post(port: int, path: str, headers: dict[str, str] | None = None
          ) -> tuple[int, dict[str, Any]]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("POST", path, headers=AUTH if headers is None else headers)
        r = c.getresponse()
        data = r.read()
        return r.status, json.loads(data) if data else {}
    finally:
        c.close()


def _process(args: list[str], files: dict[str, Any], **env: str) -> DrainerProcess:
    return DrainerProcess(args, pg_url=None, schema=None, DRAINER_FLEET_URL=files["control"],
                          DRAINER_APP="fleet_jobs", DRAINER_FLEET_TENANTS=str(files["tenants"]),
                          TENANT_PASSWORD=PASSWORD, DRAINER_TRIGGER_TOKEN=TOKEN, **env)


def _control_row(files: dict[str, Any], name: str) -> dict[str, Any]:
    from psycopg.rows import dict_row

    with psycopg.connect(files["control"], autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute("SELECT * FROM drainer.fleet_tenants WHERE name = %s",
                           [name]).fetchone()
    assert row is not None
    return row


def _warm(fleet: Fleet, files: dict[str, Any]) -> None:
    """Migrated, and every tenant drained once (none is never seen)."""
    assert _fleet(["migrate"], files).returncode == 0
    assert _fleet(["run-once"], files).returncode == 0


def test_serve_fleet_marks_the_tenant_and_drains_it_alone(fleet: Fleet,
                                                          files: dict[str, Any]) -> None:
    _warm(fleet, files)
    t = fleet.tenants[2]
    enqueue(t.url, "work", [{}, {}, {}])
    before = sessions(fleet.server_url, [fleet.database_of(x) for x in fleet.tenants])
    proc = _process(["serve", "--fleet", "--port", "0"], files)
    try:
        port = int(proc.wait_log("listening on")["port"])
        assert _post(port, f"/drain?tenant={t.name}", {})[0] == 401
        code, body = _post(port, "/drain")
        assert code == 400 and "tenant=NAME" in body["error"]
        code, body = _post(port, "/drain?tenant=b@d")
        assert code == 400 and "invalid tenant name" in body["error"]
        code, body = _post(port, "/drain?tenant=nobody")
        assert code == 404 and "nobody" in body["error"]

        code, body = _post(port, f"/drain?tenant={t.name}&wait=1")
        assert code == 200, body
        report = body["report"]
        assert report["run_id"] == body["run_id"]
        assert [line["tenant"] for line in report["tenants"]] == [t.name]
        assert report["tenants"][0]["succeeded"] == 3
    finally:
        assert proc.terminate() == 0, proc.stderr()
        proc.kill()
    assert PASSWORD not in proc.stderr() + proc.stdout
    assert {j["status"] for j in jobs(t.url)} == {"done"}  # tenants are shared by the module
    after = sessions(fleet.server_url, [fleet.database_of(x) for x in fleet.tenants])
    assert {db for db in after if after[db] != before[db]} == {fleet.database_of(t)}
    assert _control_row(files, t.name)["outcome"] == "drained"


def test_serve_without_fleet_refuses_a_tenant(pg_url: str, migrated: Any, schema: str
                                              ) -> None:
    proc = DrainerProcess(["serve", "--port", "0"], pg_url=pg_url, schema=schema,
                          DRAINER_APP="fleet_jobs", DRAINER_TRIGGER_TOKEN=TOKEN)
    try:
        port = int(proc.wait_log("listening on")["port"])
        code, body = _post(port, "/drain?tenant=acme")
        assert code == 400 and "--fleet" in body["error"]
    finally:
        proc.terminate()
        proc.kill()


def test_schedule_fleet_wakes_for_marks_triggers_and_known_due_times_only(
        fleet: Fleet, files: dict[str, Any]) -> None:
    _warm(fleet, files)
    marked, triggered, later = fleet.tenants[0], fleet.tenants[1], fleet.tenants[3]
    proc = _process(["schedule", "--fleet", "--interval", "1", "--listen", "127.0.0.1:0"],
                    files)
    try:
        port = int(proc.wait_log("listening on")["port"])
        time.sleep(1.5)  # a few looks with nothing due: no fleet run
        assert proc.count_logs("fleet wake:") == 0, proc.stderr()

        enqueue(marked.url, "work", [{}])
        with psycopg.connect(files["control"], autocommit=True) as conn:
            due(conn, marked.name)
        _wait_done(marked.url, 1)
        # the run that drained it has written its line (the mark cleared, the lease given
        # back): a trigger sent before then finds it still marked and drains it again
        _wait_settled(files, marked.name)

        enqueue(triggered.url, "work", [{}, {}])
        code, body = _post(port, f"/drain?tenant={triggered.name}&wait=1")
        assert code == 200, body
        assert [line["tenant"] for line in body["report"]["tenants"]] == [triggered.name]

        # a delayed job: one due mark drains the tenant (nothing due yet) and its run
        # report's next_due_at brings the next run, with no other mark
        with psycopg.connect(later.url, autocommit=True) as conn:
            conn.execute("INSERT INTO drainer.jobs (queue, payload, run_at) VALUES "
                         "('work', '{}', now() + interval '3 seconds')")
        with psycopg.connect(files["control"], autocommit=True) as conn:
            due(conn, later.name)
        proc.wait_log(f"tenant {later.name}: drained", timeout=20)
        assert _control_row(files, later.name)["next_due_at"] is not None
        _wait_done(later.url, 1, timeout=20)
        # the run that did the delayed job prints its report once it ends
        deadline = time.monotonic() + 20
        while _drained(proc).count(later.name) < 2:
            assert time.monotonic() < deadline, proc.stdout
            time.sleep(0.1)
    finally:
        assert proc.terminate() == 0, proc.stderr()
        proc.kill()
    assert PASSWORD not in proc.stderr() + proc.stdout
    drained = _drained(proc)
    # every fleet run drained only tenants with work: never the two left alone
    assert set(drained) <= {marked.name, triggered.name, later.name}, drained
    assert drained.count(later.name) >= 2


def _drained(proc: Any) -> list[str]:
    """The tenants of every fleet run report printed so far."""
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return [line["tenant"] for r in reports for line in r["tenants"]]


def _wait_settled(files: dict[str, Any], name: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while (row := _control_row(files, name))["due_at"] is not None or row["leased_by"]:
        assert time.monotonic() < deadline, row
        time.sleep(0.1)


def _wait_done(url: str, count: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while [j["status"] for j in jobs(url)].count("done") < count:
        assert time.monotonic() < deadline, jobs(url)
        time.sleep(0.1)


def test_fleet_schedule_and_serve_bad_input_is_one_line_and_exit_2(files: dict[str, Any]
                                                                   ) -> None:
    from tests.conftest import run_cli

    env = {"DRAINER_FLEET_URL": files["control"], "DRAINER_FLEET_TENANTS": str(files["tenants"]),
           "TENANT_PASSWORD": PASSWORD, "DRAINER_APP": "fleet_jobs"}
    cron = run_cli(["schedule", "--fleet", "--cron", "* * * * *"], pg_url=None, schema=None,
                   **env)
    assert cron.returncode == 2 and "--cron does not go with --fleet" in cron.stderr
    no_url = run_cli(["serve", "--fleet", "--no-auth", "--port", "0"], pg_url=None,
                     schema=None, DRAINER_APP="fleet_jobs")
    assert no_url.returncode == 2 and "DRAINER_FLEET_URL" in no_url.stderr
    assert len(no_url.stderr.strip().splitlines()) <= 2, no_url.stderr
    dry = run_cli(["schedule", "--fleet", "--dry-run"], pg_url=None, schema=None, **env)
    assert dry.returncode == 0 and "known-work across the fleet" in dry.stdout
    unmigrated = run_cli(["schedule", "--fleet"], pg_url=None, schema=None, **env)
    assert unmigrated.returncode == 4 and "drainer fleet migrate" in unmigrated.stderr
