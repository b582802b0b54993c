#!/usr/bin/env python3
"""Set up a virtualenv in .venv and run drainer's demo or tests. Needs only Python 3.10+.

    python3 dev.py demo      # the whole flow on a throwaway embedded PostgreSQL
    python3 dev.py test      # the test suite, every tier of tests/ (CONTRIBUTING.md), in
                             # parallel (pytest-xdist, -n auto); -n0 runs it in one process
    python3 dev.py bench ... # the benchmarks in bench/
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("DRAINER_VENV", ROOT / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
EXTRAS = "test"


def ensure_venv() -> None:
    """Create .venv and install drainer with its test extras, again when pyproject changes."""
    stamp = VENV / ".drainer-installed"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest() + EXTRAS
    if stamp.exists() and stamp.read_text() == want and (BIN / "drainer").exists():
        return
    if not (BIN / "python").exists():
        print(f"dev.py: creating {VENV}", file=sys.stderr)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print("dev.py: installing drainer with its test extras", file=sys.stderr)
    subprocess.run([str(BIN / "python"), "-m", "pip", "install", "-q", "--upgrade", "pip"],
                   check=True)
    subprocess.run([str(BIN / "python"), "-m", "pip", "install", "-q", "-e",
                    f"{ROOT}[{EXTRAS}]"], check=True)
    stamp.write_text(want)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"demo", "test", "bench", "drainer"}:
        print(__doc__, file=sys.stderr)
        return 2
    ensure_venv()
    command, rest = argv[0], argv[1:]
    os.chdir(ROOT)
    if command == "demo":
        args = [str(BIN / "drainer"), "demo", *rest]
    elif command == "drainer":
        args = [str(BIN / "drainer"), *rest]
    elif command == "bench":
        args = [str(BIN / "python"), "-m", "bench", *rest]
    else:
        args = [str(BIN / "python"), "-m", "pytest", *test_workers(rest), *rest]
    return subprocess.call(args)


def test_workers(rest: list[str]) -> list[str]:
    """pytest-xdist's workers unless the arguments choose (-n N, -n0, -p no:xdist): one per
    core, at most 4. The tests wait on PostgreSQL and subprocesses far more than they
    compute, and each has its own schema, database or throwaway cluster on a free port."""
    for i, arg in enumerate(rest):
        if arg.startswith(("-n", "--numprocesses")) or (
                arg == "-p" and i + 1 < len(rest) and rest[i + 1] == "no:xdist") \
                or arg == "-pno:xdist":
            return []
    return ["-n", "auto", "--maxprocesses", "4"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
