"""What ``drainer worker`` says when it starts: without the NOTIFY trigger, that it polls
and how to add the trigger; with it, that it listens."""

from __future__ import annotations

import subprocess
import sys
import time

from drainer.settings import Settings
from tests.conftest import ROOT, cli_env, finish, run_cli


def _worker_start_lines(pg_url: str, schema: str) -> str:
    """drainer worker's stderr until it has started (then SIGTERM)."""
    import signal

    p = subprocess.Popen([sys.executable, "-m", "drainer", "worker", "--log-format", "text"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env=cli_env(pg_url, schema, DRAINER_APP="sample_jobs"))
    lines = []
    try:
        assert p.stderr is not None
        until = time.monotonic() + 60
        while time.monotonic() < until:
            line = p.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "needs a direct connection" in line:  # the last of warn_at_start's lines
                time.sleep(0.5)
                break
    finally:
        p.send_signal(signal.SIGTERM)
        _, _out, err = finish(p, 60)
    return "".join(lines) + err


def test_worker_without_the_notify_trigger_says_so_at_start(migrated: Settings,
                                                            pg_url: str) -> None:
    text = _worker_start_lines(pg_url, migrated.schema_name)
    assert "NO NOTIFY TRIGGER" in text and "drainer migrate --notify-trigger" in text, text
    p = run_cli(["migrate", "--notify-trigger"], pg_url=pg_url, schema=migrated.schema_name)
    assert p.returncode == 0, p.stderr
    text = _worker_start_lines(pg_url, migrated.schema_name)
    assert "NO NOTIFY TRIGGER" not in text and "LISTEN" in text, text
