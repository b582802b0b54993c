"""Ruff and mypy --strict stay clean (part of the suite so CI enforces them)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_ruff_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "drainer", "tests", "bench",
                           "dev.py"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
