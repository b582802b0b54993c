"""The parser: argparse with one-line errors, settings flags built from ``Settings``."""

from __future__ import annotations

import argparse
import re
import sys
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, NoReturn, Union, get_args, get_origin

from drainer._redact import redact
from drainer.errors import EXIT_USAGE

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

    from drainer.settings import Settings

#: What a command is: the parsed flags and the settings built from them -> the exit code.
Command = Callable[[argparse.Namespace, "Settings"], int]

#: Which settings scopes (the ``scopes`` of each field in drainer/settings.py) each
#: command takes as flags. Its keys are every command, in the order of ``drainer --help``.
SCOPES: dict[str, tuple[str, ...]] = {
    "migrate": ("db",),
    "enqueue": ("db", "enqueue", "trigger"),
    "status": ("db", "app"),
    "run-once": ("db", "run"),
    "demo": ("db", "run"),
    "schedule": ("db", "run", "wake", "trigger", "schedule", "fleet"),
    "next-wake": ("db", "run"),
    "serve": ("db", "run", "trigger", "fleet"),
    "worker": ("db", "run", "wake"),
    "audit": ("db", "wake"),
    "jobs": ("db", "app"),
    "show": ("db", "app"),
    "retry": ("db",),
    "cancel": ("db",),
    "purge": ("db",),
    "pause": ("db",),
    "resume": ("db",),
    "limit": ("db",),
    "ui": ("db", "app", "wake", "fleet"),
    "fleet": ("fleet",),  # each fleet command's own: drainer.cli.fleet.FLEET_SCOPES
}

#: The commands a person types and waits for: they retry a connection once
#: (:data:`INTERACTIVE_CONNECT_RETRIES`) unless --connect-retries (or its variable, or
#: pyproject) says otherwise; a database that is down is then said in about a second, not
#: after the drains' backoff for a compute that resumes (0.5 s + 1 s + 2 s + 4 s + 8 s).
INTERACTIVE = frozenset({"status", "jobs", "show", "retry", "cancel", "purge", "pause",
                         "resume", "limit", "audit"})
INTERACTIVE_CONNECT_RETRIES = 1

#: The help section of each settings scope.
TITLES = {"db": "database and logging", "run": "drain", "enqueue": "enqueue",
          "trigger": "trigger", "wake": "waking and the compute's idle timeout",
          "schedule": "wake policy", "app": "app", "fleet": "fleet of tenant databases"}


#: A negative value (``-5m``, ``-1.5h``, ``-30``), never a flag: no flag starts with a digit.
_NEGATIVE_VALUE = re.compile(r"^-\.?\d")


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {redact(message)} (see {self.prog} --help)\n")
        raise SystemExit(EXIT_USAGE)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        if args is not None:  # each command's parser gets its own arguments here
            args = self._negative_values_attached(list(args))
        return super().parse_known_args(args, namespace)

    def _negative_values_attached(self, args: list[str]) -> list[str]:
        """``--max-runtime -5m`` as ``--max-runtime=-5m``: argparse takes ``-5m`` for a
        flag ("expected one argument") and only the ``=`` form reached the value's own
        check; both forms now get the one message that says what is wrong with it."""
        out: list[str] = []
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                out.extend(args[i:])
                break
            action = self._option_string_actions.get(arg)
            if (action is not None and action.nargs is None and i + 1 < len(args)
                    and _NEGATIVE_VALUE.match(args[i + 1])):
                out.append(f"{arg}={args[i + 1]}")
                i += 2
                continue
            out.append(arg)
            i += 1
        return out

    def parse_command_line(self, argv: Sequence[str],
                           commands: dict[str, argparse.ArgumentParser]) -> argparse.Namespace:
        """``parse_args``, but arguments that the command does not take are the command's
        error (``drainer run-once: error: unrecognized arguments: --bogus``, see
        ``drainer run-once --help``): argparse hands a subcommand's leftovers up to the
        top parser, whose error named only ``drainer``. ``commands``: each command's
        parser (the ``choices`` of the subparsers)."""
        args, extra = self.parse_known_args(argv)
        if extra:
            command = commands.get(getattr(args, "command", None) or "", self)
            command.error(f"unrecognized arguments: {' '.join(extra)}")
        return args


def add_command(sub: Any, name: str, help_text: str, func: Command, *,
                description: str | None = None) -> argparse.ArgumentParser:
    """The subparser of command ``name``: its settings flags, and ``func`` to run it."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text,
                                                     description=description or help_text)
    add_settings_flags(parser, SCOPES[name])
    parser.set_defaults(func=func)
    return parser


def human_duration(seconds: float) -> str:
    """A duration as users write it: ``604800`` -> ``7d``, ``300`` -> ``5m``."""
    if seconds == 0:
        return "0"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    if seconds < 1 and (seconds * 1000) == int(seconds * 1000):
        return f"{int(seconds * 1000)}ms"
    return f"{seconds:g}s"


def _is_duration(field: FieldInfo) -> bool:
    """A ``Seconds`` field (it parses 30s, 15m, 7d): shown as a duration in the help."""
    from drainer.settings import parse_duration

    if any(getattr(m, "func", None) is parse_duration for m in field.metadata):
        return True
    # ``Seconds | None`` (--max-runtime, --job-timeout): the validator is inside the union
    annotation: Any = field.annotation
    args = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else ()
    return any(getattr(m, "func", None) is parse_duration
               for a in args for m in getattr(a, "__metadata__", ()))


def choices_of(field: FieldInfo) -> tuple[str, ...]:
    """The values of a ``Literal[...]`` field (also inside ``| None``), else ()."""
    annotation: Any = field.annotation
    args = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) \
        else (annotation,)
    for a in args:
        if get_origin(a) is Literal:
            return tuple(str(v) for v in get_args(a))
    return ()


def any_case(flag: str, choices: Sequence[str]) -> Callable[[str], str]:
    """argparse ``type=``: a choice in any case (``--log-level debug``) as it is spelled."""
    by_lower = {c.lower(): c for c in choices}

    def convert(text: str) -> str:
        try:
            return by_lower[text.strip().lower()]
        except KeyError:
            raise argparse.ArgumentTypeError(
                f"invalid choice: {text!r} (choose from {', '.join(choices)})") from None

    convert.__name__ = flag
    return convert


def shown_default(name: str, field: FieldInfo) -> str:
    """`` [default: 7d]``: the default in the unit users think in ('' when there is none)."""
    default = field.default
    if default is None or name == "database_url":
        return ""
    if isinstance(default, bool):
        return f" [default: {'on' if default else 'off'}]"
    if isinstance(default, int | float) and _is_duration(field):
        return f" [default: {human_duration(float(default))}]"
    return f" [default: {default}]"


def _flag_kind(field: FieldInfo) -> str:
    """bool (--x / --no-x), list (repeatable) or value, from the field's type."""
    annotation: Any = field.annotation
    if get_origin(annotation) in (Union, types.UnionType):
        args = get_args(annotation)
    else:
        args = (annotation,)
    if bool in args:
        return "bool"
    if any(get_origin(a) is list for a in args):
        return "list"
    return "value"


def add_settings_flags(parser: argparse.ArgumentParser, scopes: Sequence[str]) -> None:
    """A flag for every settings field of these scopes, its help from the field."""
    from drainer.settings import Settings, env_of, flag_of

    groups: dict[str, Any] = {}
    for name, field in Settings.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        field_scopes = extra.get("scopes") or []
        assert isinstance(field_scopes, list)
        scope = next((str(s) for s in field_scopes if s in scopes), None)
        if scope is None:
            continue
        group = groups.get(scope)
        if group is None:
            group = groups[scope] = parser.add_argument_group(TITLES.get(scope, scope))
        choices = choices_of(field)  # shown as the metavar: {delete,move,off}
        help_text = (f"{field.description}{shown_default(name, field)} "
                     f"(env {env_of(name)})").replace("%", "%%")
        kind = _flag_kind(field)
        if kind == "bool":
            group.add_argument(flag_of(name), dest=name, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=help_text)
        elif kind == "list":
            group.add_argument(flag_of(name), dest=name, action="append",
                               default=argparse.SUPPRESS, metavar=str(extra.get("metavar",
                                                                                "QUEUE")),
                               help=help_text)
        elif choices:
            group.add_argument(flag_of(name), dest=name, default=argparse.SUPPRESS,
                               type=any_case(flag_of(name), choices),
                               metavar="{" + ",".join(choices) + "}", help=help_text)
        else:
            # durations as DURATION (seconds, or 30s, 15m, 12h, 7d)
            metavar = "DURATION" if _is_duration(field) else name.upper().replace("_NAME", "")
            group.add_argument(flag_of(name), dest=name, default=argparse.SUPPRESS,
                               metavar=metavar, help=help_text)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from the flags given on the command line (others from env/pyproject)."""
    from drainer.settings import Settings, load_settings

    overrides = {k: v for k, v in vars(args).items() if k in Settings.model_fields}
    if "queues" in overrides:
        overrides["queues"] = [q.strip() for v in overrides["queues"] for q in v.split(",")
                               if q.strip()]
    settings = load_settings(**overrides)
    if (getattr(args, "command", None) in INTERACTIVE
            and "connect_retries" not in settings.model_fields_set):
        settings = settings.model_copy(update={"connect_retries": INTERACTIVE_CONNECT_RETRIES})
    return settings
