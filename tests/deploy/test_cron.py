"""deploy/cron: the crontab line (run for real against the test database) and the systemd
service + timer (systemd-analyze verify when it is installed)."""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings
from tests.deploy._paths import (
    DEPLOY,
    MAINTENANCE_MARGIN_S,
    ROOT,
    cron_min_gap,
    drainer_binary,
    drainer_settings,
    longest_idle_timeout,
    seconds,
)

CRON = DEPLOY / "cron"



# -- crontab --------------------------------------------------------------------------------------


def cron_entry() -> tuple[str, str, str]:
    """(schedule, user, command) of the one job line of deploy/cron/crontab."""
    jobs = []
    for line in (CRON / "crontab").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or re.match(r"^[A-Z_]+=", line):
            continue
        fields = line.split(None, 6)
        jobs.append((" ".join(fields[:5]), fields[5], fields[6]))
    assert len(jobs) == 1
    return jobs[0]


def drainer_args_of(command: str) -> list[str]:
    """The arguments after ``exec drainer`` inside the crontab's ``sh -c '...'``."""
    tokens = shlex.split(command)
    inner = tokens[tokens.index("-c") + 1]
    words = shlex.split(inner.split("exec drainer", 1)[1])
    return words


def test_crontab_schedule_lets_the_compute_suspend() -> None:
    schedule, user, _ = cron_entry()
    assert user not in {"root", "0"}
    assert cron_min_gap(schedule) > longest_idle_timeout()


def test_crontab_deadlines_nest() -> None:
    schedule, _, command = cron_entry()
    tokens = shlex.split(command)
    assert tokens[:2] == ["flock", "-n"], "a run must be skipped while the last one drains"
    t = tokens.index("timeout")
    assert tokens[t + 1] == "-k"
    kill_after, limit = seconds(tokens[t + 2]), seconds(tokens[t + 3])
    args, settings = drainer_settings(drainer_args_of(command))
    assert args.command == "run-once"
    assert settings.max_runtime is not None
    assert limit >= settings.max_runtime + settings.grace + MAINTENANCE_MARGIN_S
    assert limit < cron_min_gap(schedule)
    assert kill_after > settings.grace


def _cron_command_for_test(tmp_path: Path, env_file: Path) -> tuple[str, Path, Path]:
    _, _, command = cron_entry()
    lock, log = tmp_path / "drainer.lock", tmp_path / "drainer.log"
    for old, new in (("/etc/drainer/drainer.env", str(env_file)),
                     ("/tmp/drainer.lock", str(lock)),
                     ("/var/log/drainer/drainer.log", str(log))):
        assert old in command
        command = command.replace(old, new)
    return command, lock, log


def _run_cron_command(command: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(Path(drainer_binary() or "").parent),
                            os.environ.get("PATH", "")])
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/tmp"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "apps"), str(ROOT)])}
    return subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True,
                          text=True, timeout=120)


def test_crontab_line_drains_for_real(migrated: Settings, conn: psycopg.Connection[Any],
                                      pg_url: str, tmp_path: Path) -> None:
    """The crontab command as cron would run it (paths moved into tmp_path, own schema),
    with an environment file written like drainer.env.example."""
    if drainer_binary() is None or shutil.which("flock") is None:
        pytest.skip("drainer or flock (util-linux) not on PATH")
    enqueue_many(conn, [JobSpec("noop", {}) for _ in range(5)], schema=migrated.schema_name)
    env_file = tmp_path / "drainer.env"
    env_file.write_text(f"DRAINER_DATABASE_URL='{pg_url}'\nDRAINER_APP=sample_jobs\n"
                        f"DRAINER_SCHEMA={migrated.schema_name}\nDRAINER_QUEUES=noop\n"
                        "DRAINER_CONNECT_RETRIES=0\n")
    command, lock, log = _cron_command_for_test(tmp_path, env_file)

    # while another run holds the lock, this one is skipped at once
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        skipped = _run_cron_command(command)
    assert skipped.returncode != 0
    assert not log.exists() or "succeeded" not in log.read_text()

    result = _run_cron_command(command)
    assert result.returncode == 0, log.read_text()
    # the run report (its log lines, JSON too, carry a "level")
    reports = [r for r in (json.loads(line) for line in log.read_text().splitlines()
                           if line.startswith("{")) if "claimed" in r and "level" not in r]
    assert len(reports) == 1
    assert reports[0]["succeeded"] == 5 and reports[0]["remaining_due"] == 0


def test_env_example_holds_no_real_secret() -> None:
    text = (CRON / "drainer.env.example").read_text()
    assert "CHANGE_ME" in text
    urls = re.findall(r"postgres(?:ql)?://[^'\s]+", text)
    assert urls and all(":CHANGE_ME@" in u for u in urls)


# -- systemd --------------------------------------------------------------------------------------


def unit(name: str) -> dict[str, list[tuple[str, str]]]:
    """A systemd unit file as {section: [(key, value), ...]} (keys may repeat)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for raw in (CRON / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = line.strip("[]")
            sections[current] = []
            continue
        assert current is not None, f"{name}: key outside a section: {line}"
        key, _, value = line.partition("=")
        sections[current].append((key.strip(), value.strip()))
    return sections


def one(section: list[tuple[str, str]], key: str) -> str:
    values = [v for k, v in section if k == key]
    assert len(values) == 1, f"{key}: {values}"
    return values[0]


def test_service_is_a_oneshot_run_once_with_the_dsn_from_a_file() -> None:
    service = unit("drainer.service")["Service"]
    assert one(service, "Type") == "oneshot"
    assert one(service, "EnvironmentFile") == "/etc/drainer/drainer.env"
    assert not [v for k, v in service if k == "Environment" and "DATABASE_URL" in v]
    argv = shlex.split(one(service, "ExecStart"))
    assert argv[0].endswith("/drainer")
    args, settings = drainer_settings(argv[1:])
    assert args.command == "run-once"
    assert settings.max_runtime is not None
    # TimeoutStartSec bounds a oneshot run (SIGTERM), TimeoutStopSec is the grace before
    # SIGKILL
    assert seconds(one(service, "TimeoutStartSec")) >= (settings.max_runtime + settings.grace
                                                        + MAINTENANCE_MARGIN_S)
    assert seconds(one(service, "TimeoutStopSec")) > settings.grace
    assert one(service, "DynamicUser") == "yes" or one(service, "User") not in {"root", "0"}
    assert one(service, "NoNewPrivileges") == "yes"


def test_timer_starts_the_service_with_a_random_delay() -> None:
    timer = unit("drainer.timer")["Timer"]
    assert one(timer, "Unit") == "drainer.service"
    assert seconds(one(timer, "RandomizedDelaySec")) > 0
    assert one(unit("drainer.timer")["Install"], "WantedBy") == "timers.target"


def test_timer_interval_lets_the_compute_suspend() -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed: OnCalendar not evaluated")
    calendar = one(unit("drainer.timer")["Timer"], "OnCalendar")
    out = subprocess.run([analyze, "calendar", "--iterations=8", calendar],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    times = [datetime.strptime(m, "%Y-%m-%d %H:%M:%S") for m in
             re.findall(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", out.stdout)]
    assert len(times) == 8
    gap = min((b - a).total_seconds() for a, b in itertools.pairwise(times))
    timeout_start = seconds(one(unit("drainer.service")["Service"], "TimeoutStartSec"))
    assert gap > longest_idle_timeout()
    assert gap > timeout_start


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (no systemd on this machine)")
    drainer = drainer_binary()
    assert drainer is not None
    # verify checks that ExecStart's binary exists: point it at this environment's drainer
    # (the unit names /opt/drainer/bin/drainer, where deploy/ installs it)
    text = (CRON / "drainer.service").read_text()
    assert "/opt/drainer/bin/drainer" in text
    (tmp_path / "drainer.service").write_text(text.replace("/opt/drainer/bin/drainer",
                                                           drainer))
    shutil.copy(CRON / "drainer.timer", tmp_path / "drainer.timer")
    out = subprocess.run([analyze, "verify", str(tmp_path / "drainer.service"),
                          str(tmp_path / "drainer.timer")],
                         capture_output=True, text=True, timeout=60)
    # verify exits 0 on unknown keys and bad values (it only warns): any output about our
    # units is a failure too
    ours = [ln for ln in (out.stdout + out.stderr).splitlines() if "drainer." in ln]
    assert out.returncode == 0 and not ours, out.stdout + out.stderr
