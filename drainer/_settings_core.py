"""The pydantic-free half of drainer's settings: parsing rules, sources, and a fast check.

``drainer.settings.Settings`` (pydantic-settings) is the one definition of every option
and the authority on what is valid. Importing pydantic costs about as long as a whole
empty drain, so ``drainer run-once`` and the other short commands first try
:func:`fast_values`: it reads the same sources (flags, environment, ``[tool.drainer]``)
with the field table generated from ``Settings`` (``drainer/_settings_table.py``) and
accepts only values it validates exactly as pydantic would. Anything else (a value it
rejects, a type or form it does not handle) returns None, and the caller asks
``load_settings``, which gives the authoritative error.
"""

from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from drainer._redact import password_of, remember_secret
from drainer.errors import ConfigError

#: Idle timeout (seconds) after which each platform suspends a compute with no activity.
PLATFORM_IDLE_TIMEOUTS: dict[str, float] = {
    "neon": 300.0,  # Neon: 5 minutes by default
    "aurora": 300.0,  # Aurora Serverless v2 at 0 ACU: SecondsUntilAutoPause default
    "relyt": 600.0,  # the Japanese article's platform: about 10 minutes
    "supabase": 300.0,  # branches / self-hosted scale-to-zero: set --idle-timeout to yours
    "always-on": 0.0,  # a compute that never suspends
}

#: Names ``[tool.drainer]`` accepts besides the field names.
PYPROJECT_ALIASES = {"schema": "schema_name", "queue": "queues"}

_DURATION = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>ms|s|m|min|h|d|w)?\s*$", re.I)
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: Any) -> Any:
    """Accept ``90``, ``"90"``, ``"90s"``, ``"15m"``, ``"12h"``, ``"7d"``; return seconds."""
    if value is None or isinstance(value, int | float):
        return value
    if isinstance(value, str):
        m = _DURATION.match(value)
        if not m:
            raise ValueError(f"not a duration: {value!r} (use seconds or 30s, 15m, 12h, 7d)")
        return float(m.group("n")) * _UNIT_S[(m.group("unit") or "s").lower()]
    return value


def split_list(value: Any) -> Any:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``; anything else unchanged."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def read_pyproject(field_names: set[str] | frozenset[str]) -> dict[str, Any]:
    """``[tool.drainer]`` of ./pyproject.toml (or of $DRAINER_PYPROJECT), by field name.

    Raises ConfigError for a file that cannot be read or parsed, and for an unknown key.
    """
    path = Path(os.environ.get("DRAINER_PYPROJECT", "pyproject.toml"))
    if not path.is_file():
        return {}
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        with path.open("rb") as f:
            table = tomllib.load(f).get("tool", {}).get("drainer", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read [tool.drainer] from {path}: {exc}") from None
    known = {name: name for name in field_names}
    known.update(PYPROJECT_ALIASES)
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = known.get(key.replace("-", "_"))
        if name is None:
            raise ConfigError(f"unknown setting {key!r} in [tool.drainer] of {path}")
        out[name] = value
    return out


class SecretValue(Protocol):
    def get_secret_value(self) -> str: ...


def dsn_of(database_url: SecretValue | None) -> str:
    """The connection string; raises ConfigError when none is set."""
    if database_url is None or not database_url.get_secret_value().strip():
        raise ConfigError(
            "no database URL: set DRAINER_DATABASE_URL (or DATABASE_URL) or pass "
            "--database-url"
        )
    return database_url.get_secret_value()


def idle_timeout_of(idle_timeout: float | None, platform: str | None) -> float | None:
    """--idle-timeout, else the --platform preset, else None (unknown)."""
    if idle_timeout is not None:
        return idle_timeout
    if platform is not None:
        return PLATFORM_IDLE_TIMEOUTS[platform]
    return None


def remember_secrets(database_url: SecretValue | None, trigger_token: SecretValue | None
                     ) -> None:
    """Register the DSN's password and the trigger token, so no output ever shows them."""
    if database_url is not None:
        remember_secret(password_of(database_url.get_secret_value()))
    if trigger_token is not None:
        remember_secret(trigger_token.get_secret_value())


class Secret:
    """A string that does not show itself (as pydantic's SecretStr)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __str__(self) -> str:
        return "**********" if self._value else ""

    def __repr__(self) -> str:
        return f"Secret({str(self)!r})"


class Spec(NamedTuple):
    """One settings field as plain data (rows of drainer/_settings_table.py)."""

    name: str
    #: str, secret, int, seconds (a float that also takes 30s, 15m, ...), bool, choice, list
    kind: str
    #: None is a valid value (and the default may be None).
    optional: bool
    default: Any
    #: Environment variables that set it, lower-cased, in the order pydantic-settings reads.
    env: tuple[str, ...]
    flag: str
    #: The CLI scopes (sets of commands) that take the flag.
    scopes: tuple[str, ...]
    metavar: str
    help: str
    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    choices: tuple[str, ...] = ()


class _Reject(Exception):
    """A value the fast check does not accept: pydantic decides (and explains)."""


_INT = re.compile(r"[0-9]{1,15}")
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def _text(value: Any) -> str:
    if type(value) is not str:
        raise _Reject
    try:
        value.encode("utf-8")  # lone surrogates (undecodable bytes in the environment)
    except UnicodeEncodeError:
        raise _Reject from None
    return value


def _number(value: Any, kind: str) -> int | float:
    if type(value) is str:
        if kind == "int":
            if not _INT.fullmatch(value):
                raise _Reject
            return int(value)
        try:
            seconds = parse_duration(value)
        except ValueError:
            raise _Reject from None
        if not isinstance(seconds, float) or not math.isfinite(seconds):
            raise _Reject
        return seconds
    if type(value) is int and abs(value) < 2**53:
        return value if kind == "int" else float(value)
    if type(value) is float and kind == "seconds" and math.isfinite(value):
        return value
    raise _Reject


def _check(spec: Spec, value: Any, source: str) -> Any:
    """``value`` as pydantic would validate it for ``spec``; raises _Reject otherwise."""
    if spec.kind in ("str", "secret", "choice"):
        text = _text(value)
        if spec.min_length is not None and len(text) < spec.min_length:
            raise _Reject
        if spec.max_length is not None and len(text) > spec.max_length:
            raise _Reject
        if spec.kind == "choice" and text not in spec.choices:
            raise _Reject
        return Secret(text) if spec.kind == "secret" else text
    if spec.kind in ("int", "seconds"):
        number = _number(value, spec.kind)
        if ((spec.gt is not None and not number > spec.gt)
                or (spec.ge is not None and not number >= spec.ge)
                or (spec.le is not None and not number <= spec.le)):
            raise _Reject
        return number
    if spec.kind == "bool":
        if type(value) is bool:
            return value
        text = _text(value)
        if text.isascii() and text.lower() in _TRUE:
            return True
        if text.isascii() and text.lower() in _FALSE:
            return False
        raise _Reject
    if spec.kind == "list":
        if source == "env":
            import json

            try:
                json.loads(value)
            except ValueError:
                pass  # not JSON: a comma-separated list, as below
            else:
                raise _Reject  # pydantic-settings decodes JSON here
        items = split_list(value)
        if type(items) is not list:
            raise _Reject
        return [_text(item) for item in items]
    raise _Reject


def fast_values(specs: tuple[Spec, ...], overrides: dict[str, Any]) -> dict[str, Any] | None:
    """Every setting from ``overrides`` (flags), the environment, pyproject and defaults.

    Returns None unless every value is one this check accepts exactly as pydantic would
    (and with the same result): then the caller must use ``load_settings``. Registers the
    DSN password and the trigger token as secrets, as ``load_settings`` does.
    """
    try:
        file_values = read_pyproject(frozenset(spec.name for spec in specs))
    except ConfigError:
        return None
    env = {key.lower(): value for key, value in os.environ.items()}
    values: dict[str, Any] = {}
    try:
        for spec in specs:
            source = "init"
            raw = overrides.get(spec.name)
            if raw is None:
                source = "env"
                raw = next((env[name] for name in spec.env if name in env), None)
            if raw is None:
                source = "file"
                raw = file_values.get(spec.name)
            values[spec.name] = spec.default if raw is None else _check(spec, raw, source)
    except _Reject:
        return None
    remember_secrets(values.get("database_url"), values.get("trigger_token"))
    return values
