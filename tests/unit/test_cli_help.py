"""``drainer COMMAND --help``: durations in the units users think in, the choices, and the
default of every settings flag."""

from __future__ import annotations

import pytest

from drainer.cli import build_parser
from drainer.cli._base import human_duration
from drainer.settings import Settings


def _help(command: str) -> str:
    sub = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    return " ".join(sub.format_help().split())


@pytest.mark.parametrize(("seconds", "shown"), [
    (604800.0, "7d"), (2592000.0, "30d"), (300.0, "5m"), (3600.0, "1h"), (10.0, "10s"),
    (0.0, "0"), (0.25, "250ms"), (1.5, "1.5s"), (21600.0, "6h"),
])
def test_human_duration(seconds: float, shown: str) -> None:
    assert human_duration(seconds) == shown


def test_help_shows_durations_in_the_units_users_think_in() -> None:
    text = _help("run-once")
    assert "604800" not in text and "[default: 7d]" in text  # --archive-after
    assert "[default: 30d]" in text and "[default: 5m]" in text  # --failed-retention, --lease
    assert "--archive-after DURATION" in text
    # optional durations too (the README's cron line passes --max-runtime 10m)
    assert "--max-runtime DURATION" in text and "--job-timeout DURATION" in text
    assert "--idle-timeout DURATION" in _help("schedule")
    assert "[default: True]" not in text and "[default: on]" in text


@pytest.mark.parametrize(("command", "flag"), [
    ("run-once", "--archive-mode {delete,move,off}"),
    ("run-once", "--log-format {auto,json,text}"),
    ("run-once", "--log-level {DEBUG,INFO,WARNING,ERROR}"),
    ("audit", "--platform {neon,aurora,relyt,supabase,always-on}"),
    ("schedule", "--wake-policy {always,known-work}"),
])
def test_help_lists_the_choices(command: str, flag: str) -> None:
    assert flag in _help(command)


def test_every_settings_flag_with_a_default_shows_it() -> None:
    for command in ("run-once", "schedule", "audit"):
        text = _help(command)
        for name, field in Settings.model_fields.items():
            if field.default is not None and name != "database_url":
                from drainer.settings import env_of

                if f"(env {env_of(name)})" in text:
                    chunk = text.split(f"(env {env_of(name)})")[0][-300:]
                    assert "[default: " in chunk, (command, name)
