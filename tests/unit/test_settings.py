"""Settings: sources, precedence, validation, and one-line errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from drainer._redact import password_of, redact, remember_secret
from drainer.errors import ConfigError
from drainer.settings import Settings, load_settings, parse_duration


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("DRAINER_") or key == "DATABASE_URL":
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)  # no pyproject.toml unless a test writes one


def test_defaults() -> None:
    s = Settings()
    assert (s.schema_name, s.table, s.batch_size, s.lease, s.grace) == (
        "drainer", "jobs", 10, 300.0, 30.0)
    assert s.archive_after == 7 * 86400
    assert (s.retry_base, s.retry_cap) == (10.0, 3600.0)


def test_env_and_database_url_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://a@h/db1")
    assert load_settings().dsn == "postgresql://a@h/db1"
    monkeypatch.setenv("DRAINER_DATABASE_URL", "postgresql://b@h/db2")
    assert load_settings().dsn == "postgresql://b@h/db2"
    monkeypatch.setenv("DRAINER_SCHEMA", "q")
    monkeypatch.setenv("DRAINER_BATCH_SIZE", "50")
    s = load_settings()
    assert (s.schema_name, s.batch_size) == ("q", 50)


def test_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAINER_BATCH_SIZE", "50")
    assert load_settings(batch_size="7").batch_size == 7


def test_pyproject_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.drainer]\nschema = "from_toml"\nbatch-size = 25\nlease = "10m"\n'
        'queues = ["a", "b"]\n')
    s = load_settings()
    assert (s.schema_name, s.batch_size, s.lease, s.queues) == ("from_toml", 25, 600.0,
                                                               ["a", "b"])
    monkeypatch.setenv("DRAINER_BATCH_SIZE", "3")
    assert load_settings().batch_size == 3  # env beats pyproject


def test_pyproject_unknown_key(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.drainer]\nbatchsize = 25\n")
    with pytest.raises(ConfigError, match="unknown setting 'batchsize'"):
        load_settings()


@pytest.mark.parametrize(("field", "value"), [
    ("batch_size", "0"), ("batch_size", "-1"), ("lease", "0"), ("concurrency", "0"),
    ("batch_size", "ten"), ("lease", "soon"), ("archive_mode", "shred"),
])
def test_invalid_values_are_one_line(field: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(**{field: value})
    message = str(err.value)
    assert "\n" not in message
    assert "--" + field.replace("_", "-") in message
    assert "DRAINER_" + field.upper() in message


def test_missing_dsn() -> None:
    with pytest.raises(ConfigError, match="DRAINER_DATABASE_URL"):
        _ = load_settings().dsn


def test_durations() -> None:
    assert parse_duration("7d") == 7 * 86400
    assert parse_duration("15m") == 900
    assert parse_duration("1.5h") == 5400
    assert parse_duration("250ms") == 0.25
    assert parse_duration(12) == 12
    with pytest.raises(ValueError):
        parse_duration("a week")


def test_platform_presets() -> None:
    assert load_settings(platform="neon").effective_idle_timeout == 300
    assert load_settings(platform="relyt").effective_idle_timeout == 600
    assert load_settings(platform="neon", idle_timeout="20").effective_idle_timeout == 20
    assert load_settings().effective_idle_timeout is None


def test_password_never_in_validation_errors() -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(database_url="postgresql://u:Sup3rSecret@h/db", batch_size="x")
    assert "Sup3rSecret" not in str(err.value)


def test_redact() -> None:
    assert password_of("postgresql://u:pw1@h/db") == "pw1"
    assert password_of("host=h password='p w' user=u") == "p w"
    assert redact("postgresql://u:pw1@h/db failed") == "postgresql://u:***@h/db failed"
    assert "p9" not in redact("dbname=x password=p9 host=h")
    remember_secret("Tok3nValue")
    assert redact("bad Tok3nValue here") == "bad *** here"


def test_a_short_secret_is_masked_only_where_it_stands_alone() -> None:
    from drainer import _redact

    saved = _redact._secrets
    try:
        _redact.remember_secret("x")
        _redact.remember_secret("e")
        assert _redact.redact("--listen: expected HOST:PORT") == "--listen: expected HOST:PORT"
        assert _redact.redact("Bearer x") == "Bearer ***"
        _redact.remember_secret("a-long-secret-token")
        assert _redact.redact("tokena-long-secret-tokenz") == "token***z"
    finally:
        _redact._secrets = saved


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg", "psycopg2", "PSYCOPG"])
def test_sqlalchemy_urls_are_read_as_plain_urls(driver: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", f"postgresql+{driver}://u:Sq1Pw@h:5433/db1?sslmode=require")
    assert load_settings().dsn == "postgresql://u:Sq1Pw@h:5433/db1?sslmode=require"
    assert "Sq1Pw" not in redact("password Sq1Pw")
    monkeypatch.setenv("DRAINER_DATABASE_URL", f"postgresql+{driver}://h/db2")
    assert load_settings().dsn == "postgresql://h/db2"
    assert load_settings(database_url=f"postgresql+{driver}://h/db3").dsn == "postgresql://h/db3"


def test_other_connection_strings_are_unchanged() -> None:
    for dsn in ("postgresql://h/db", "postgres://h/db", "host=h dbname=postgresql+x://",
                "postgresql+psycopg:/not-a-url"):
        assert load_settings(database_url=dsn).dsn == dsn


def test_the_log_level_variable_takes_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    from drainer.settings import load_settings

    monkeypatch.setenv("DRAINER_LOG_LEVEL", "debug")
    assert load_settings().log_level == "DEBUG"
    monkeypatch.setenv("DRAINER_LOG_LEVEL", "Warning")
    assert load_settings().log_level == "WARNING"


@pytest.mark.parametrize("url", ["postgress://u:Pw9x@h/db", "mysql://h/db",
                                 "postgres+psycopg://h/db"])
def test_a_url_that_is_no_postgresql_url_names_its_scheme(
        url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from drainer.cli import main

    scheme = url.split("://")[0]
    with pytest.raises(ConfigError, match=f"scheme '{re.escape(scheme)}' is not postgresql://"):
        load_settings(database_url=url).dsn  # noqa: B018
    assert main(["status", "--database-url", url]) == 2
    err = capsys.readouterr().err
    assert f"scheme {scheme!r}" in err and "Pw9x" not in err and err.count("\n") == 1, err
