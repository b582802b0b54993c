"""The CLI's shared helpers (drainer/cli/_output.py, drainer/_text.py, drainer/_signals.py)
and its one dispatch path."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from datetime import datetime, timezone
from typing import Any

import pytest

from drainer._signals import stop_on_signals
from drainer._text import iso
from drainer.cli import _SCOPES, build_parser, main
from drainer.cli._output import (
    emit,
    positive_int,
    print_json,
    seconds_arg,
    text_table,
    wants_json,
)
from drainer.errors import ConfigError
from drainer.settings import Settings, flag_of


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90.0), ("1.5", 1.5), ("30s", 30.0), ("15m", 900.0), ("2h", 7200.0),
    ("7d", 604800.0), ("250ms", 0.25), (" 10 min ", 600.0), ("0", 0.0),
])
def test_seconds_arg(text: str, seconds: float) -> None:
    value = seconds_arg("--flag", text)
    assert value == seconds and isinstance(value, float)


def test_seconds_arg_passes_none_and_names_the_flag() -> None:
    assert seconds_arg("--jitter", None) is None
    with pytest.raises(ConfigError) as err:
        seconds_arg("--interval", "soon")
    assert str(err.value) == ("--interval: not a duration: 'soon' (use seconds or 30s, 15m, "
                              "12h, 7d)")
    with pytest.raises(ConfigError, match=r"^--delay: not a duration: '-5'"):
        seconds_arg("--delay", "-5")  # the sign is no duration; ranges are the caller's


def test_positive_int() -> None:
    assert positive_int("7") == 7
    for bad, why in (("0", "at least 1"), ("-3", "at least 1"), ("x", "not a whole number")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            positive_int(bad)


def test_print_json_writes_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    print_json({"a": 1, "at": when, "nested": {"b": [1, None]}})
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert json.loads(out) == {"a": 1, "at": str(when), "nested": {"b": [1, None]}}


def test_json_unless_a_terminal(capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert wants_json(True)
    assert wants_json(False)  # captured stdout is no terminal
    emit({"n": 1}, lambda obj: f"n is {obj['n']}", as_json=False)
    assert json.loads(capsys.readouterr().out) == {"n": 1}
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert not wants_json(False)
    emit({"n": 1}, lambda obj: f"n is {obj['n']}", as_json=False)
    assert capsys.readouterr().out == "n is 1\n"
    emit({"n": 1}, lambda obj: f"n is {obj['n']}", as_json=True)
    assert json.loads(capsys.readouterr().out) == {"n": 1}


def test_iso() -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=timezone.utc)
    assert iso(when) == "2026-01-02T03:04:05.600000+00:00"
    assert iso(None) is None
    assert iso(5) == 5 and iso("x") == "x"


def test_text_table() -> None:
    rows = [("queue", "n", "note"), ("emails", "12", ""), ("x", "3", "long words here")]
    assert text_table(rows) == ["queue   n   note",
                                "emails  12",
                                "x       3   long words here"]
    assert text_table(rows, right={1}) == ["queue    n  note",
                                           "emails  12",
                                           "x        3  long words here"]
    assert text_table(rows, caps=[3, 5, 6]) == ["qu…  n   note",
                                                "em…  12",
                                                "x    3   long …"]
    assert text_table([]) == []


def test_stop_on_signals_first_then_again() -> None:
    stop = threading.Event()
    seen: list[str] = []
    before = signal.getsignal(signal.SIGTERM)
    with stop_on_signals(stop, lambda n: seen.append("first " + n),
                         lambda n: seen.append("again " + n)):
        signal.raise_signal(signal.SIGTERM)
        assert stop.wait(10)
        signal.raise_signal(signal.SIGINT)
    assert seen == ["first SIGTERM", "again SIGINT"]
    assert signal.getsignal(signal.SIGTERM) == before


def test_stop_on_signals_without_again_reports_each_signal() -> None:
    stop = threading.Event()
    seen: list[str] = []
    with stop_on_signals(stop, seen.append):
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
    assert seen == ["SIGTERM", "SIGTERM"] and stop.is_set()


def test_a_handler_that_fails_does_not_stop_the_next_signal_being_handled(
        caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    def handler(name: str) -> None:
        seen.append(name)
        if len(seen) == 1:
            raise RuntimeError("boom")

    stop = threading.Event()
    with caplog.at_level(logging.ERROR, logger="drainer._signals"), \
            stop_on_signals(stop, handler):
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
    assert seen == ["SIGTERM", "SIGINT"] and stop.is_set()
    assert "handling SIGTERM failed" in caplog.text


def test_off_the_main_thread_no_handler_is_installed() -> None:
    result: list[Any] = []

    def body() -> None:
        with stop_on_signals(threading.Event(), print):
            result.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert result == [before]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_has_one_function_and_its_settings_flags() -> None:
    commands = _subparsers(build_parser())
    assert list(commands) == list(_SCOPES)
    for name, parser in commands.items():
        func = parser.get_default("func")
        assert callable(func) and func.__module__.startswith("drainer.cli."), name
        flags = {s for a in parser._actions for s in a.option_strings}
        for field, info in Settings.model_fields.items():
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            scopes = extra.get("scopes") or []
            assert isinstance(scopes, list)
            wanted = any(s in _SCOPES[name] for s in scopes)
            flag = flag_of(field)
            # jobs/retry --queue and limit --max-running are the command's own options
            assert (flag in flags) == wanted or (field == "queues" and name in (
                "jobs", "retry")) or (field == "max_running" and name == "limit"), \
                (name, field)


def test_a_broken_import_is_no_usage_error(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "drainer.grants", None)  # `import` raises ImportError
    assert main(["migrate", "--print-grants"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("drainer migrate: ModuleNotFoundError: ") and "grants" in err


def test_migrate_print_grants_needs_no_database(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRAINER_DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert main(["migrate", "--print-grants", "--schema", "s1"]) == 0
    assert "s1" in capsys.readouterr().out


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _flags(parser: argparse.ArgumentParser) -> list[tuple[str, ...]]:
    return [(a.dest, *a.option_strings) for a in parser._actions]


def test_the_parser_of_one_command_is_that_command_of_the_whole_parser() -> None:
    """main builds only the command it runs: the same flags, the same help, under the same
    name as in the parser of all the commands."""
    everything = _commands(build_parser())
    assert list(everything) == list(_SCOPES)
    for name in _SCOPES:
        alone = _commands(build_parser(name))
        assert list(alone) == [name]
        assert _flags(alone[name]) == _flags(everything[name])
        assert alone[name].format_help() == everything[name].format_help()


def test_stdout_for_reports_only_sends_the_rest_to_stderr(
        capfd: pytest.CaptureFixture[str]) -> None:
    import os

    from drainer.cli._output import print_json, stdout_for_reports_only

    with stdout_for_reports_only():
        print("from a handler")
        os.write(1, b"from fd 1\n")
        print_json({"report": 1})
    print("after")
    out, err = capfd.readouterr()
    assert out == '{"report": 1}\nafter\n'
    assert err == "from a handler\nfrom fd 1\n"
    assert sys.stdout is not sys.stderr
