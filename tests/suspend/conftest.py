"""The suspend tier: drainer through bench.suspend, a compute that really suspends.

T (the idle timeout) is 2.5 s and a resume costs a 1 s cold start, so that each scenario
takes seconds; drainer is the real CLI in a subprocess, with the suspend_jobs app."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.link import target_of, via
from bench.suspend import SuspendSimulator
from tests.conftest import ROOT, cli_env
from tests.reliability._helpers import executions, wait_for

IDLE_S = 2.5
COLD_START_S = 1.0
#: suspend_jobs.late_retry's wait before the retry of a failed first attempt
RETRY_AFTER_S = 1.0


def url_through(pg_url: str, sim: SuspendSimulator) -> str:
    """``pg_url`` (its user and database) through the simulator."""
    return via(pg_url, sim)


@pytest.fixture
def sim(pg_url: str) -> Iterator[SuspendSimulator]:
    """A suspended compute in front of the test server: T = 2.5 s, cold start 1 s."""
    with SuspendSimulator(IDLE_S, COLD_START_S, target_of(pg_url)) as s:
        yield s


def cut_once_a_handler_runs(sim: SuspendSimulator, log_dir: Path) -> int:
    """Wait until a handler has started (its execution log), then suspend the compute at
    once; the connections cut."""
    wait_for(lambda: executions(log_dir), 30, "a handler to start")
    return sim.suspend_now()


def start_drainer(args: list[str], *, url: str, schema: str, log_dir: Path,
                  **env: str) -> subprocess.Popen[str]:
    """``drainer ARGS`` on ``url`` with the suspend_jobs app, the idle timeout declared,
    connect retries enough for a cold start; executions are recorded in ``log_dir``."""
    base = {"DRAINER_APP": "suspend_jobs", "REL_LOG_DIR": str(log_dir),
            "DRAINER_IDLE_TIMEOUT": f"{IDLE_S:g}", "DRAINER_CONNECT_RETRIES": "4",
            "DRAINER_LOG_FORMAT": "json", "SUSPEND_RETRY_AFTER_S": f"{RETRY_AFTER_S:g}", **env}
    return subprocess.Popen([sys.executable, "-m", "drainer", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=cli_env(url, schema, **base))
