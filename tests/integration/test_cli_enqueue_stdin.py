"""``drainer enqueue`` without a JSON argument reads JSON lines from stdin: on a terminal
it says so first, from a pipe it says nothing."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time

from drainer.settings import Settings
from tests.conftest import ROOT, cli_env, finish, run_cli


def test_enqueue_on_a_terminal_says_it_reads_json_lines(migrated: Settings,
                                                        pg_url: str) -> None:
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "drainer", "enqueue", "emails"], stdin=slave,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env=cli_env(pg_url, migrated.schema_name))
    os.close(slave)
    try:
        time.sleep(1.0)
        os.write(master, b'{"a": 1}\n\x04')  # one payload, then Ctrl-D
        _, out, err = finish(p, 60)
    finally:
        os.close(master)
    assert p.returncode == 0, err
    assert "reading one JSON payload a line from stdin" in err
    assert json.loads(out)["enqueued"] == 1


def test_enqueue_with_piped_stdin_says_nothing(migrated: Settings, pg_url: str) -> None:
    # a queue seen before (a first job of a queue gets the "never seen" warning)
    first = run_cli(["enqueue", "emails", '{"a": 0}'], pg_url=pg_url,
                    schema=migrated.schema_name)
    assert first.returncode == 0, first.stderr
    p = run_cli(["enqueue", "emails"], pg_url=pg_url, schema=migrated.schema_name,
                input='{"a": 1}\n')
    assert p.returncode == 0 and p.stderr == "", p.stderr
