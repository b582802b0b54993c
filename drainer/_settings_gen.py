"""Generate drainer/_settings_table.py from the pydantic ``Settings`` class.

Run ``python -m drainer._settings_gen`` after changing a field of drainer/settings.py;
tests/unit/test_settings_table.py fails while the checked-in table differs from what this
module renders. A field whose type or constraint the fast check does not know stops the
generation with an error: teach drainer/_settings_core.py about it first.
"""

from __future__ import annotations

import textwrap
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, MaxLen, MinLen
from pydantic import AliasChoices, BeforeValidator, SecretStr
from pydantic.fields import FieldInfo

from drainer._settings_core import Spec, parse_duration, split_list
from drainer.settings import Settings, env_of, flag_of

TABLE = Path(__file__).with_name("_settings_table.py")

_HEADER = '''\
"""drainer.settings.Settings as plain data, for start-up without pydantic. GENERATED.

Do not edit: change drainer/settings.py, then run ``python -m drainer._settings_gen``
(tests/unit/test_settings_table.py fails while this file is stale).
"""

from __future__ import annotations

from typing import Any, Literal

from drainer._settings_core import Secret, Spec, dsn_of, idle_timeout_of

'''

_CLASS_HEAD = '''

class SettingsValues:
    """Validated settings as plain attributes, as the CLI's fast path builds them.

    It has every field of drainer.settings.Settings with the same value pydantic would
    give (drainer/_settings_core.py), plus ``dsn`` and ``effective_idle_timeout``.
    """

    __slots__ = FIELD_NAMES

'''

_CLASS_TAIL = '''
    def __init__(self, values: dict[str, Any]) -> None:
        for name in FIELD_NAMES:
            setattr(self, name, values[name])

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in FIELD_NAMES)
        return f"SettingsValues({inner})"

    @property
    def dsn(self) -> str:
        """The connection string; raises ConfigError when none is set."""
        return dsn_of(self.database_url)

    @property
    def effective_idle_timeout(self) -> float | None:
        """--idle-timeout, else the --platform preset, else None (unknown)."""
        return idle_timeout_of(self.idle_timeout, self.platform)
'''


def _unsupported(name: str, what: object) -> Exception:
    return TypeError(f"settings field {name!r}: the fast check does not handle {what!r}; "
                     "teach drainer/_settings_core.py and drainer/_settings_gen.py about it")


def _kind(name: str, field: FieldInfo) -> tuple[str, bool, tuple[str, ...], str]:
    """(kind, optional, Literal choices, Python type) of a field."""
    annotation: Any = field.annotation
    validators = [m for m in field.metadata if isinstance(m, BeforeValidator)]
    optional = False
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) != 1 or len(get_args(annotation)) != 2:
            raise _unsupported(name, annotation)
        optional, annotation = True, args[0]
    if get_origin(annotation) is Annotated:
        annotation, *extra = get_args(annotation)
        if not all(isinstance(m, BeforeValidator) for m in extra):
            raise _unsupported(name, extra)
        validators += extra
    funcs = [v.func for v in validators]
    choices: tuple[str, ...] = ()
    if funcs == [parse_duration] and annotation is float:
        kind, py = "seconds", "float"
    elif funcs == [split_list] and annotation == list[str]:
        kind, py = "list", "list[str]"
    elif funcs:
        raise _unsupported(name, funcs)
    elif annotation is SecretStr:
        kind, py = "secret", "Secret"
    elif annotation in (str, int, bool):
        kind = py = annotation.__name__
    elif get_origin(annotation) is Literal and all(
            isinstance(c, str) for c in get_args(annotation)):
        choices = get_args(annotation)
        kind, py = "choice", f"Literal[{', '.join(map(repr, choices))}]"
    else:
        raise _unsupported(name, annotation)
    return kind, optional, choices, f"{py} | None" if optional else py


def _env_names(name: str, field: FieldInfo) -> tuple[str, ...]:
    """As pydantic-settings reads them: the alias choices, then DRAINER_<name>."""
    prefix = str(Settings.model_config.get("env_prefix", ""))
    names: list[str] = []
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        for choice in alias.choices:
            if not isinstance(choice, str):
                raise _unsupported(name, choice)
            names.append(choice)
    elif alias is not None:
        raise _unsupported(name, alias)
    names.append(prefix + name)
    return tuple(dict.fromkeys(n.lower() for n in names))


def _spec(name: str, field: FieldInfo) -> Spec:
    kind, optional, choices, _ = _kind(name, field)
    bounds: dict[str, Any] = {}
    for m in field.metadata:
        if isinstance(m, Gt | Ge | Le):
            key = type(m).__name__.lower()
            bounds[key] = getattr(m, key)
        elif isinstance(m, MinLen):
            bounds["min_length"] = m.min_length
        elif isinstance(m, MaxLen):
            bounds["max_length"] = m.max_length
        elif not isinstance(m, BeforeValidator):
            raise _unsupported(name, m)
    if bounds and kind in ("bool", "list", "choice"):
        raise _unsupported(name, bounds)
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    scopes = extra.get("scopes") or []
    assert isinstance(scopes, list)
    default = field.default
    shown = "" if default is None or name == "database_url" else f" [default: {default}]"
    metavar = "QUEUE" if kind == "list" else name.upper().replace("_NAME", "")
    return Spec(
        name=name, kind=kind, optional=optional, default=default,
        env=_env_names(name, field), flag=flag_of(name), scopes=tuple(map(str, scopes)),
        metavar=metavar, help=f"{field.description}{shown} (env {env_of(name)})",
        choices=choices, **bounds,
    )


def _keyword(key: str, value: object, indent: int) -> str:
    """``key=repr(value),`` with a long string split over lines (implicit concatenation)."""
    text = repr(value)
    if not isinstance(value, str) or indent + len(key) + len(text) + 2 <= 100:
        return f"{' ' * indent}{key}={text},\n"
    chunks = textwrap.wrap(value, 80 - indent, drop_whitespace=False, break_on_hyphens=False,
                           expand_tabs=False, replace_whitespace=False)
    assert "".join(chunks) == value
    pad = " " * indent
    lines = "".join(f"{pad}    {c!r}\n" for c in chunks)
    return f"{pad}{key}=(\n{lines}{pad}),\n"


def render() -> str:
    """The source of drainer/_settings_table.py for the current Settings class."""
    specs = [_spec(name, field) for name, field in Settings.model_fields.items()]
    out = [_HEADER, "#: Every settings field, in the order of drainer.settings.Settings.\n",
           "FIELDS: tuple[Spec, ...] = (\n"]
    defaults = Spec._field_defaults
    for spec in specs:
        out.append("    Spec(\n")
        for key, value in spec._asdict().items():
            if key in defaults and value == defaults[key]:
                continue
            out.append(_keyword(key, value, 8))
        out.append("    ),\n")
    out.append(")\n\nFIELD_NAMES: tuple[str, ...] = tuple(spec.name for spec in FIELDS)\n")
    out.append(_CLASS_HEAD)
    for name, field in Settings.model_fields.items():
        out.append(f"    {name}: {_kind(name, field)[3]}\n")
    out.append(_CLASS_TAIL)
    return "".join(out)


def main() -> None:
    TABLE.write_text(render())
    print(f"wrote {TABLE}")


if __name__ == "__main__":
    main()
