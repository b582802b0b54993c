"""``drainer fleet ...`` as a subprocess: lines, reports, exit codes, and no password out."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from drainer.fleet.tenants import shard_of
from tests.conftest import ROOT, cli_env, finish, run_cli
from tests.integration._fleet import (
    Fleet,
    create_database,
    enqueue,
    jobs,
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
