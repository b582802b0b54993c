"""The pydantic-free settings check (drainer/_settings_core.py) against pydantic's Settings.

The fast check may turn anything down (``load_settings`` then decides and words the
error), but what it accepts pydantic must accept too, with the very same values. Every
case below runs both and compares them field by field.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import AliasChoices, SecretStr

from drainer import _redact
from drainer._redact import redact
from drainer._settings_core import Secret, fast_values
from drainer._settings_gen import TABLE, render
from drainer._settings_table import FIELDS, SettingsValues
from drainer.errors import ConfigError
from drainer.settings import Settings, load_settings
from tests.conftest import ROOT

SPECS = {spec.name: spec for spec in FIELDS}

#: Strings as they come from flags, environment variables or pyproject strings.
STRINGS = [
    "", " ", "0", "1", "2", "-1", "5", "007", " 7", "7 ", "7.0", "1_0", "+5", "1e3", ".5",
    "0.5", "10000", "10001", "1024", "1025", "99999999999999999999", "9" * 400, "15m", "15M",
    "7d", "2w", "500ms", "1.5h", " 15 m ", "10min", "0s", "soon", "١٢", "true", "TRUE",
    "True ", "yes", "Y", "on", "ON", "off", "no", "f", "T", "DEBUG", "debug", "INFO",
    "WARNING", "auto", "json", "text", "delete", "move", "off", "neon", "NEON", "always-on",
    "always", "known-work", "a,b", " a , ,b ", ",", '["a", "b"]', '"a"', "[1]", "null", "5,",
    "x" * 48, "x" * 49, "x" * 50, "x" * 51, "x" * 63, "x" * 64, "é", "jobs", "myapp.jobs",
    "postgresql://u:pw@h/db", "host=h password='p w'", "http://localhost:9091",
]
#: Values written as TOML (native types, not only strings).
TOML_VALUES = [
    "5", "0", "-1", "7.0", "1.5", "0.0", "true", "false", '"15m"', '"7"', '["a", "b"]',
    "[1]", '"a, b"', "[]", "inf", "nan", "10001", "1970-01-01", "{x = 1}", '""', "1e3",
    "9007199254740993", '"INFO"',
]


@contextmanager
def environment(env: dict[str, str], toml: str | None = None) -> Iterator[None]:
    """Exactly these settings variables (nothing inherited), and this [tool.drainer] body."""
    saved = dict(os.environ)
    names = {n for spec in FIELDS for n in spec.env} | {"drainer_pyproject"}
    for key in list(os.environ):
        if key.lower() in names or key.lower().startswith("drainer_"):
            del os.environ[key]
    try:
        file = _scratch_dir() / ("pyproject.toml" if toml is not None else "missing.toml")
        if toml is not None:
            file.write_text(toml)
        os.environ["DRAINER_PYPROJECT"] = str(file)
        os.environ.update(env)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


_SCRATCH: list[Path] = []


def _scratch_dir() -> Path:
    assert _SCRATCH, "the scratch fixture did not run"
    return _SCRATCH[0]


@pytest.fixture(autouse=True)
def scratch(tmp_path: Path) -> Iterator[None]:
    """A directory for pyproject files; the secrets the cases register are forgotten after."""
    secrets = set(_redact._secrets)
    _SCRATCH.insert(0, tmp_path)
    yield
    _SCRATCH.pop(0)
    _redact._secrets.clear()
    _redact._secrets.update(secrets)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Secret) or isinstance(b, SecretStr):
        return (isinstance(a, Secret) and isinstance(b, SecretStr)
                and a.get_secret_value() == b.get_secret_value())
    return type(a) is type(b) and a == b


def compare(overrides: dict[str, Any], env: dict[str, str] | None = None,
            toml: str | None = None) -> str:
    """Run both checks; fail when the fast one accepts anything differently.

    Returns "fast" (both accept, same values), "fallback" (only pydantic accepts) or
    "rejected" (both reject).
    """
    with environment(env or {}, toml):
        fast = fast_values(FIELDS, dict(overrides))
        try:
            slow: Settings | None = load_settings(**overrides)
        except ConfigError:
            slow = None
    where = f"flags={overrides!r} env={env!r} toml={toml!r}"
    if fast is None:
        return "rejected" if slow is None else "fallback"
    assert slow is not None, f"the fast check accepted what pydantic rejects: {where}"
    for spec in FIELDS:
        a, b = fast[spec.name], getattr(slow, spec.name)
        assert _same(a, b), f"{spec.name}: fast {a!r} != pydantic {b!r} ({where})"
    values = SettingsValues(fast)
    assert values.effective_idle_timeout == slow.effective_idle_timeout
    try:
        dsn: str | None = slow.dsn
    except ConfigError:
        dsn = None
    if dsn is None:
        with pytest.raises(ConfigError):
            _ = values.dsn
    else:
        assert values.dsn == dsn
    return "fast"


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string


def _independent_env_names(name: str) -> set[str]:
    """Names to try, not taken from the generated table: prefix + name, aliases, variants."""
    names = {"DRAINER_" + name.upper(), "drainer_" + name, "Drainer_" + name.title(),
             name.upper(), name}
    alias = Settings.model_fields[name].validation_alias
    if isinstance(alias, AliasChoices):
        names |= {str(c) for c in alias.choices} | {str(c).lower() for c in alias.choices}
    return names


def test_generated_table_is_current() -> None:
    assert TABLE.read_text() == render(), (
        "drainer/_settings_table.py is stale: run `python -m drainer._settings_gen`")


def test_table_covers_every_field_and_the_values_class_matches() -> None:
    assert [spec.name for spec in FIELDS] == list(Settings.model_fields)
    assert set(SettingsValues.__slots__) == set(Settings.model_fields)
    for spec in FIELDS:
        assert spec.default == Settings.model_fields[spec.name].default


@pytest.mark.parametrize("name", list(SPECS))
def test_each_field_from_each_source(name: str) -> None:
    spec = SPECS[name]
    seen: dict[str, set[str]] = {"flag": set(), "env": set(), "pyproject": set()}
    for value in STRINGS:
        seen["flag"].add(compare({name: value}))
        seen["pyproject"].add(compare({}, toml=f"[tool.drainer]\n{name} = "
                                               f"{_toml_string(value)}\n"))
        for env_name in spec.env:
            seen["env"].add(compare({}, {env_name.upper(): value}))
    for env_name in _independent_env_names(name):
        for value in STRINGS[::7]:
            seen["env"].add(compare({}, {env_name: value}))
    for toml_value in TOML_VALUES:
        seen["pyproject"].add(compare({}, toml=f"[tool.drainer]\n{name} = {toml_value}\n"))
    if spec.kind == "bool":
        for flag in (True, False):
            seen["flag"].add(compare({name: flag}))
    if spec.kind == "list":
        for items in (["a"], ["a", "b"], [], ["a,b"], [""]):
            seen["flag"].add(compare({name: items}))
    # the fast path is taken from every source, else this test proves nothing
    assert all("fast" in outcomes for outcomes in seen.values()), seen


@pytest.mark.parametrize(("overrides", "env", "toml"), [
    ({}, {}, None),
    ({"batch_size": "50", "queues": ["a", "b"]}, {"DATABASE_URL": "postgresql://h/db"}, None),
    ({}, {"DRAINER_DATABASE_URL": "postgresql://u:secret@h/db", "DRAINER_LEASE": "15m",
          "DRAINER_QUEUES": "a, b", "DRAINER_PREPARED_STATEMENTS": "false",
          "DRAINER_MAX_RUNTIME": "7d", "DRAINER_LOG_LEVEL": "WARNING"}, None),
    ({}, {}, '[tool.drainer]\nschema = "s"\nbatch-size = 25\nlease = "10m"\n'
             'queue = ["a"]\nsession_options = false\narchive-after = 3600\n'),
    ({"schema_name": "flag"}, {"DRAINER_SCHEMA": "env"}, '[tool.drainer]\nschema = "file"\n'),
    ({"prepared_statements": False}, {"DRAINER_PLATFORM": "neon"}, None),
])
def test_usual_settings_take_the_fast_path(overrides: dict[str, Any], env: dict[str, str],
                                           toml: str | None) -> None:
    assert compare(overrides, env, toml) == "fast"


@pytest.mark.parametrize("env", [
    {"DRAINER_SCHEMA": "a", "SCHEMA": "b", "DRAINER_SCHEMA_NAME": "c", "schema_name": "d"},
    {"SCHEMA": "b", "DRAINER_SCHEMA_NAME": "c"},
    {"DRAINER_SCHEMA_NAME": "c", "schema_name": "d"},
    {"DRAINER_DATABASE_URL": "postgresql://a/x", "DATABASE_URL": "postgresql://b/y"},
    {"DATABASE_URL": "postgresql://b/y", "database_url": "postgresql://c/z"},
    {"drainer_batch_size": "3", "DRAINER_BATCH_SIZE": "4"},
])
def test_several_variables_for_one_setting(env: dict[str, str]) -> None:
    compare({}, env)
    compare({"schema_name": "flag", "database_url": "postgresql://flag/db"}, env,
            '[tool.drainer]\nschema = "file"\ndatabase_url = "postgresql://file/db"\n')


@pytest.mark.parametrize("toml", [
    "[tool.drainer]\nbatchsize = 25\n",  # unknown key
    "[tool.drainer\nbatch_size = 25\n",  # not TOML
    "[tool.drainer]\nBatch_Size = 25\n",  # keys are case-sensitive
    '[tool.drainer]\nschema = "a"\nschema_name = "b"\n',
    '[tool.drainer]\nschema_name = "b"\nschema = "a"\n',
    '[tool]\ndrainer = { batch-size = 3, queue = "x,y" }\n',
    "[project]\nname = 'x'\n",
    "[tool.drainer]\n",
    "[tool.drainer]\nqueues = [\"a\", 1]\n",
    "[tool.drainer]\n[tool.drainer.lease]\nx = 1\n",
])
def test_pyproject_forms(toml: str) -> None:
    compare({}, toml=toml)


def test_an_unknown_pyproject_key_falls_back_to_the_one_line_error() -> None:
    assert compare({}, toml="[tool.drainer]\nbatchsize = 25\n") == "rejected"


def test_a_rejected_value_falls_back() -> None:
    assert compare({"batch_size": "0"}) == "rejected"
    assert compare({}, {"DRAINER_LOG_LEVEL": "debug"}) == "rejected"


_FIELD_VALUES = st.sampled_from([n for n in SPECS]).flatmap(
    lambda n: st.tuples(st.just(n), st.sampled_from(STRINGS),
                        st.sampled_from(["flag", "env", "pyproject", "toml"]),
                        st.sampled_from(SPECS[n].env), st.sampled_from(TOML_VALUES)))


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(_FIELD_VALUES, max_size=8))
def test_random_mixes_of_sources(choices: list[tuple[str, str, str, str, str]]) -> None:
    overrides: dict[str, Any] = {}
    env: dict[str, str] = {}
    toml: list[str] = []
    keys: set[str] = set()
    for name, value, source, env_name, toml_value in choices:
        if source == "flag":
            overrides[name] = value
        elif source == "env":
            env[env_name.upper()] = value
        elif name not in keys:
            keys.add(name)
            toml.append(f"{name} = {_toml_string(value) if source == 'pyproject' else toml_value}")
    compare(overrides, env, "[tool.drainer]\n" + "\n".join(toml) + "\n" if toml else None)


def test_the_fast_path_keeps_secrets_out_of_output() -> None:
    with environment({"DRAINER_DATABASE_URL": "postgresql://u:Fast-Pw-9@h/db",
                      "DRAINER_TRIGGER_TOKEN": "tok-fast-77"}):
        values = fast_values(FIELDS, {})
    assert values is not None
    assert "Fast-Pw-9" not in redact("connection to h failed for password Fast-Pw-9")
    assert "tok-fast-77" not in redact("token tok-fast-77")
    assert "Fast-Pw-9" not in repr(SettingsValues(values))


def _in_subprocess(code: str) -> str:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DRAINER_") and k != "DATABASE_URL"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_cli_builds_run_once_settings_without_pydantic() -> None:
    out = _in_subprocess(
        "import sys\n"
        "from drainer.cli import build_parser, settings_from_args\n"
        "args = build_parser().parse_args(['run-once', '--batch-size', '5', '--queue', 'a,b'])\n"
        "s = settings_from_args(args)\n"
        "print(type(s).__name__, s.batch_size, s.queues,\n"
        "      sorted({m.split('.')[0] for m in sys.modules if 'pydantic' in m}))\n")
    assert out == "SettingsValues 5 ['a', 'b'] []"


def test_the_cli_falls_back_to_pydantic_for_errors_and_other_commands() -> None:
    from drainer.cli import build_parser, settings_from_args

    args = build_parser().parse_args(["run-once", "--batch-size", "0"])
    with pytest.raises(ConfigError, match="--batch-size / DRAINER_BATCH_SIZE"):
        settings_from_args(args)
    with environment({}):
        args = build_parser().parse_args(["schedule", "--interval", "1h"])
        assert isinstance(settings_from_args(args), Settings)
        args = build_parser().parse_args(["run-once"])
        assert isinstance(settings_from_args(args), SettingsValues)
