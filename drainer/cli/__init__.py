"""The ``drainer`` command: parse, build settings, call the library, map errors to exit codes.

Exit codes: 0 done (also when a limit stopped a drain), 1 anything else, 2 usage or
configuration error, 3 database unreachable, 4 schema missing or out of date, 5 a database
timeout cancelled a statement, 6 the --max-runtime watchdog ended a run that hung, 7 some
tenants of a fleet failed (``drainer fleet run-once`` / ``fleet migrate``), 8 the server is
out of disk, memory or connection slots, 9 the database is read-only, 10 the server ended
the session or accepts none now (shutdown, restart, pg_terminate_backend, recovery).

One module per group of commands (schema, enqueue, jobs, control, run, schedule, wake,
status, ui, fleet), each command with a ``configure_<command>(subparsers)`` that adds its
flags and ``set_defaults(func=...)``. This package is the only place that parses flags,
prints (text tables and lines included: the library returns data), and turns errors into exit
codes; the command functions import the library when they run, so a short command never
loads APScheduler or the HTTP server, and ``drainer run-once`` imports the module of its own
command only (:func:`build_parser`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from drainer._redact import redact
from drainer.cli._base import SCOPES as _SCOPES
from drainer.cli._base import Parser, settings_from_args
from drainer.errors import (
    EXIT_ERROR,
    EXIT_TIMEOUT,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    DrainerError,
)

__all__ = ["build_parser", "entrypoint", "main", "settings_from_args"]

logger = logging.getLogger("drainer.cli")

#: The commands in the order ``drainer --help`` lists them (the keys of _SCOPES): the module
#: in drainer/cli/ and the function that adds the command's parser. By name: a run imports
#: the module of its command only, not the other nine and what they import (a share of
#: every cold start, a cron run or a serverless invocation).
_CONFIGURE = (
    ("schema", "configure_migrate"),
    ("enqueue", "configure_enqueue"),
    ("status", "configure_status"),
    ("run", "configure_run_once"),
    ("run", "configure_demo"),
    ("schedule", "configure_schedule"),
    ("wake", "configure_next_wake"),
    ("wake", "configure_serve"),
    ("run", "configure_worker"),
    ("status", "configure_audit"),
    ("jobs", "configure_jobs"),
    ("jobs", "configure_show"),
    ("control", "configure_retry"),
    ("control", "configure_cancel"),
    ("control", "configure_purge"),
    ("control", "configure_pause"),
    ("control", "configure_resume"),
    ("control", "configure_limit"),
    ("ui", "configure_ui"),
    ("fleet", "configure_fleet"),
)
assert len(_CONFIGURE) == len(_SCOPES)


def build_parser(command: str | None = None, *, prog: str = "drainer") -> Parser:
    """The parser of every command; with ``command`` (one of them), of that command only.
    ``prog``: how the usage lines name the program (``manage.py drainer`` under Django).

    Each command's flags are built from the settings fields, hundreds of ``add_argument``
    calls for all of them: a run names its command first (flags go after it), so ``main``
    builds only the parser it uses, a share of every cold start (a cron run, a serverless
    invocation). :func:`command_parsers` gives each command's parser in it.
    """
    parser = Parser(
        prog=prog,
        description="Drain a PostgreSQL job table and exit, so a serverless database can "
        "suspend. Every flag can also be set as a DRAINER_* variable or in [tool.drainer] "
        "of pyproject.toml.",
        epilog="Exit codes: 0 done (also when a limit stopped the drain), 1 other error, "
        "2 usage or configuration, 3 database unreachable, 4 schema missing or out of date, "
        "5 a database timeout cancelled a statement, 6 the --max-runtime watchdog ended a "
        "hung run, 7 some tenants of a fleet failed.",
    )
    from drainer import __version__

    parser.add_argument("--version", action="version", version=f"drainer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, (module, configure) in zip(_SCOPES, _CONFIGURE, strict=True):
        if command is None or command == name:
            getattr(importlib.import_module(f"drainer.cli.{module}"), configure)(sub)
    return parser


def command_parsers(parser: Parser) -> dict[str, argparse.ArgumentParser]:
    """Each command's parser in the parser of :func:`build_parser`."""
    for action in parser._actions:  # argparse keeps no public handle on its subparsers
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags_before_command(parser: Parser, argv: Sequence[str]) -> None:
    """``drainer --database-url URL status``: say that flags go after the command (exit 2)."""
    if not argv or not argv[0].startswith("-") or argv[0] in ("-h", "--help", "--version"):
        return
    command = next((a for a in argv if a in _SCOPES), None)
    if command is None:
        return
    at = list(argv).index(command)
    flags, rest = list(argv[:at]), list(argv[at + 1:])
    shown = " ".join([parser.prog, command, *rest, *flags])
    parser.error(f"flags go after the command: {redact(shown)}")


def main(argv: Sequence[str] | None = None, *, prog: str = "drainer") -> int:
    """Run one command (``argv``: what follows the program's name); its exit code.
    ``prog``: the program's name in usage lines and errors (``manage.py drainer``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # `drainer run-once ...`: that command's parser only; anything else (--help, a flag
    # first, a misspelt command): all of them, for the help or the error
    parser = build_parser(argv[0] if argv and argv[0] in _SCOPES else None, prog=prog)
    _flags_before_command(parser, argv)
    args = parser.parse_command_line(argv, command_parsers(parser))
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        settings = settings_from_args(args)
        from drainer.logs import setup_logging

        setup_logging(settings.log_level, settings.log_format)
        code: int = args.func(args, settings)
        return code
    except DrainerError as exc:
        sys.stderr.write(f"{prog} {args.command}: {redact(str(exc))}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog} {args.command}: interrupted\n")
        return 130
    except Exception as exc:
        return _unexpected(f"{prog} {args.command}", exc)


def _unexpected(command: str, exc: Exception) -> int:
    """``command``: the program and the command (``drainer run-once``)."""
    import psycopg

    from drainer.db import prepared_statement_clash, server_condition, timeout_kind

    # through a pooler that does not track prepared statements: configuration; the server
    # full, read-only or shutting down: it answered, the connection was fine
    known = prepared_statement_clash(exc) or server_condition(exc)
    if known is not None:
        sys.stderr.write(f"{command}: {redact(str(known))}\n")
        return known.exit_code
    text = redact(" ".join(str(exc).split()) or type(exc).__name__)
    kind = timeout_kind(exc)
    if kind == "cancelled":  # no timeout fired: someone cancelled the statement
        sys.stderr.write(f"{command}: cancelled: {text} (pg_cancel_backend or another cancel "
                         "request; no timeout fired)\n")
        return EXIT_TIMEOUT
    if kind is not None:  # the server answered: a timeout is not a lost connection
        sys.stderr.write(f"{command}: {kind}: {text} (see --statement-timeout, "
                         "--lock-timeout, --idle-in-transaction-timeout)\n")
        return EXIT_TIMEOUT
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        sys.stderr.write(f"{command}: database connection lost: {text}\n")
        return EXIT_UNAVAILABLE
    logger.debug("unexpected error", exc_info=exc)
    sys.stderr.write(f"{command}: {type(exc).__name__}: {text}\n")
    return EXIT_ERROR


def entrypoint() -> None:
    raise SystemExit(main())
