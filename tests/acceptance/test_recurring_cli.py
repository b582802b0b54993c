"""Recurring jobs through the real ``drainer`` command: separate run-once processes, a bad
definition, next-wake and the dry run."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from drainer.settings import Settings
from tests.acceptance.test_ops_cli import run_in_pty
from tests.conftest import cli_env, run_cli

UTC = timezone.utc


def _report(stdout: str) -> dict[str, object]:
    [line] = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    result: dict[str, object] = json.loads(line)
    return result


@pytest.mark.slow
def test_a_per_minute_definition_runs_once_per_minute_across_run_once_processes(
        pg_url: str, migrated: Settings, tmp_path: Path) -> None:
    """The first run creates the next minute's occurrence; at that minute three run-once
    processes at once run it exactly once, and a later one does not run it again."""
    log = tmp_path / "runs.log"
    env = {"RECURRING_LOG": str(log)}
    args = ["run-once", "--app", "recurring_jobs", "--queue", "tick"]
    schema = migrated.schema_name

    def run_once() -> dict[str, object]:
        proc = run_cli(args, pg_url=pg_url, schema=schema, timeout=60, **env)
        assert proc.returncode == 0, proc.stderr
        return _report(proc.stdout)

    first = run_once()
    assert first["claimed"] == 0
    assert isinstance(first["next_due_at"], str)
    minute = datetime.fromisoformat(first["next_due_at"])
    assert minute.second == 0 and minute > datetime.now(UTC)
    time.sleep(max(0.0, (minute - datetime.now(UTC)).total_seconds()) + 0.5)
    with ThreadPoolExecutor(3) as pool:
        reports = list(pool.map(lambda _: run_once(), range(3)))
    assert sorted(int(r["succeeded"]) for r in reports) == [0, 0, 1]  # type: ignore[call-overload]
    later = run_once()
    assert later["claimed"] == 0
    assert later["next_due_at"] == (minute + timedelta(minutes=1)).isoformat()
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tick {minute.isoformat()} ")


def test_a_bad_definition_exits_2_with_one_line(pg_url: str, schema: str, tmp_path: Path
                                                ) -> None:
    (tmp_path / "bad_schedule.py").write_text(
        "from drainer import task\n\n@task('x', cron='0 8 * * *', timezone='Europe/Berlim')\n"
        "def x(job):\n    pass\n")
    proc = run_cli(["run-once", "--app", "bad_schedule"], pg_url=pg_url, schema=schema,
                   cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "unknown time zone 'Europe/Berlim'" in proc.stderr


def test_next_wake_and_status_after_a_drain(pg_url: str, migrated: Settings) -> None:
    schema = migrated.schema_name
    assert run_cli(["run-once", "--app", "recurring_jobs"], pg_url=pg_url,
                   schema=schema).returncode == 0
    proc = run_cli(["next-wake", "--app", "recurring_jobs", "--json"], pg_url=pg_url,
                   schema=schema)
    assert proc.returncode == 0, proc.stderr
    wake = json.loads(proc.stdout)
    assert wake["recurring_key"] == "tick"
    at = datetime.fromisoformat(wake["next_wake_at"])
    assert at > datetime.now(UTC) - timedelta(seconds=5)
    if wake["reason"] != "1 job due now":  # a minute turned since the drain
        assert wake["reason"] == "recurring 'tick'" and at.second == 0
    plain = run_cli(["next-wake", "--app", "recurring_jobs", "--offline"], pg_url=None,
                    schema=None)
    assert plain.returncode == 0 and plain.stdout.strip().endswith(":00Z"), plain.stderr
    status = run_cli(["status", "--app", "recurring_jobs", "--json"], pg_url=pg_url,
                     schema=schema)
    series = {s["key"]: s for s in json.loads(status.stdout)["recurring"]}
    assert set(series) == {"tick", "weekday-digest"}
    assert series["weekday-digest"]["cron"] == "0 8 * * mon-fri"
    assert series["weekday-digest"]["next_in_table"] is True


def test_status_without_the_app_shows_each_series_schedule(pg_url: str,
                                                         migrated: Settings) -> None:
    """The sync writes each occurrence's cron, time zone and catch-up on its row: status
    (and the dashboard) read them from the table, with no --app."""
    schema = migrated.schema_name
    assert run_cli(["run-once", "--app", "recurring_jobs"], pg_url=pg_url,
                   schema=schema).returncode == 0
    status = run_cli(["status", "--json"], pg_url=pg_url, schema=schema)
    assert status.returncode == 0, status.stderr
    series = {s["key"]: s for s in json.loads(status.stdout)["recurring"]}
    assert {k: (s["cron"], s["timezone"], s["catch_up"]) for k, s in series.items()} == {
        "tick": ("* * * * *", "UTC", "latest"),
        "weekday-digest": ("0 8 * * mon-fri", "Europe/Berlin", "latest")}
    assert series["tick"]["defined"] is None  # no app loaded: not said either way
    code, out = run_in_pty(["status"], cli_env(pg_url, schema))
    assert code == 0 and "0 8 * * mon-fri (Europe/Berlin)" in out, out


def test_dry_run_lists_the_definitions_and_their_wakes() -> None:
    proc = run_cli(["schedule", "--app", "recurring_jobs", "--wake-policy", "known-work",
                    "--interval", "30", "--platform", "neon", "--dry-run"], pg_url=None,
                   schema=None)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "recurring definitions (2):" in out
    assert "'weekday-digest' on queue 'digest': '0 8 * * mon-fri' (Europe/Berlin)" in out
    assert "next 5 wakes for their occurrences" in out
    assert "not longer than the 5.0 min idle timeout" in out  # the per-minute tick
    assert "awake estimate (known-work, with no other work: the recurring occurrences" in out
