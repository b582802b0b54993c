"""How ``drainer`` reads its command line: the version, flags after the command, choices
in any case, and one-line usage errors (a wrong choice, an impossible port, a token too
short), the two address forms of serve and schedule."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from drainer.cli import build_parser, main


@pytest.fixture(autouse=True)
def _forget_secrets() -> Iterator[None]:
    """main() remembers the tokens these tests set: forget them afterwards."""
    from drainer import _redact

    saved = _redact._secrets
    yield
    _redact._secrets = saved


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


@pytest.mark.parametrize("command, flag", [
    (["run-once"], "--max-runtime"),
    (["run-once"], "--lease"),
    (["purge", "--status", "done"], "--older-than"),
    (["enqueue", "q", "{}"], "--delay"),
    (["schedule"], "--interval"),
])
def test_a_negative_duration_gets_one_message_with_or_without_equals(
        command: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    said = []
    for value in ([flag, "-5m"], [f"{flag}=-5m"]):
        try:
            code = main([*command, "--database-url", "postgresql://h/db", *value])
        except SystemExit as exit_:
            code = int(exit_.code or 0)
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        said.append(err)
    assert said[0] == said[1]
    assert "not a duration: '-5m' (a duration is never negative" in said[0], said[0]


def test_a_negative_number_still_reaches_a_flag_that_takes_one() -> None:
    args = build_parser().parse_args(["enqueue", "q", "{}", "--priority", "-5"])
    assert args.priority == -5
    args = build_parser().parse_args(["enqueue", "q", "--", "-5m"])
    assert args.payload == "-5m"


def test_the_commands_a_person_waits_for_retry_a_connection_once_drains_keep_theirs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from drainer.cli import settings_from_args
    from drainer.settings import DEFAULT_CONNECT_RETRIES

    monkeypatch.delenv("DRAINER_CONNECT_RETRIES", raising=False)

    def retries(*argv: str) -> int:
        return settings_from_args(build_parser().parse_args(list(argv))).connect_retries

    for command in (["status"], ["jobs"], ["show", "7"], ["retry", "7"], ["cancel", "7"],
                    ["pause", "q"], ["resume", "q"], ["limit", "q"], ["audit"],
                    ["purge", "--status", "done", "--older-than", "1d"]):
        assert retries(*command) == 1, command
    for command in (["run-once"], ["schedule"], ["serve"], ["worker"], ["migrate"],
                    ["enqueue", "q", "{}"], ["next-wake"]):
        assert retries(*command) == DEFAULT_CONNECT_RETRIES, command
    assert retries("status", "--connect-retries", "4") == 4
    monkeypatch.setenv("DRAINER_CONNECT_RETRIES", "3")
    assert retries("status") == 3
