"""``[tool.drainer]`` of ./pyproject.toml (or of $DRAINER_PYPROJECT): the settings source
below the flags and the environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from drainer.errors import ConfigError

#: Names ``[tool.drainer]`` accepts besides the field names.
PYPROJECT_ALIASES = {"schema": "schema_name", "queue": "queues"}


class PyprojectSource(PydanticBaseSettingsSource):
    """``[tool.drainer]`` of ./pyproject.toml (or of $DRAINER_PYPROJECT)."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        self._data = read_pyproject(set(settings_cls.model_fields))

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


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
