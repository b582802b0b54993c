"""A ``drainer`` subprocess whose stderr (JSON log lines) is read as it comes."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from tests.conftest import ROOT, cli_env


class DrainerProcess:
    """``python -m drainer ARGS`` in the background, with its log lines parsed."""

    def __init__(self, args: list[str], *, pg_url: str | None, schema: str | None,
                 **env: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "drainer", *args], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, cwd=ROOT,
            env=cli_env(pg_url, schema, DRAINER_LOG_FORMAT="json", **env))
        self.lines: list[str] = []
        self.logs: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._out: list[str] = []
        self._out_reader = threading.Thread(target=self._read_out, daemon=True)
        self._out_reader.start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._out.append(line)

    @property
    def stdout(self) -> str:
        return "".join(self._out)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                with contextlib.suppress(ValueError):
                    self.logs.append(json.loads(line))
                self._cond.notify_all()

    def wait_log(self, contains: str, timeout: float = 10) -> dict[str, Any]:
        """The first log record whose message contains ``contains`` (waits for it)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for rec in self.logs:
                    if contains in str(rec.get("msg", "")):
                        return rec
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"no log line with {contains!r} (exit "
                                         f"{self.proc.poll()}):\n" + "\n".join(self.lines))
                self._cond.wait(min(left, 0.1))

    def count_logs(self, contains: str) -> int:
        with self._cond:
            return sum(1 for rec in self.logs if contains in str(rec.get("msg", "")))

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM, then wait for the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        self._out_reader.join(5)
        return code

    def kill(self) -> None:
        """Kill if still running, and close the pipes (always call it at the end)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._reader.join(5)
        self._out_reader.join(5)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def stderr(self) -> str:
        with self._cond:
            return "\n".join(self.lines)
