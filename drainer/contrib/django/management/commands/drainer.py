"""``manage.py drainer <command> [args]``: drainer's CLI on Django's database.

::

    python manage.py drainer migrate
    python manage.py drainer run-once            # handlers: every installed app's jobs.py
    python manage.py drainer run-once --app myproject.jobs
    python manage.py drainer --database replica status

Everything after ``drainer`` (and an optional leading ``--database ALIAS``) is given to
``drainer.cli.main`` as it is; the database is ``DATABASES[ALIAS]`` (default ``default``),
passed as DRAINER_DATABASE_URL for that call (an explicit ``--database-url`` flag still
wins). With no app module named (``--app``, DRAINER_APP or ``[tool.drainer] app``) the app
is ``drainer.contrib.django.autodiscover``: each installed app's ``jobs.py``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.connection import ConnectionDoesNotExist

AUTODISCOVER = "drainer.contrib.django.autodiscover"


def _split_database(argv: Sequence[str]) -> tuple[str, list[str]]:
    """(alias, the rest) from ``[--database ALIAS | --database=ALIAS] drainer args``."""
    args = list(argv)
    if args and args[0] == "--database" and len(args) > 1:
        return args[1], args[2:]
    if args and args[0].startswith("--database="):
        return args[0].split("=", 1)[1], args[1:]
    return "default", args


def _names_an_app(args: Sequence[str]) -> bool:
    if any(a == "--app" or a.startswith("--app=") for a in args):
        return True
    if os.environ.get("DRAINER_APP"):
        return True
    try:
        from drainer._pyproject import read_pyproject
        from drainer.settings import Settings

        return bool(read_pyproject(set(Settings.model_fields)).get("app"))
    except Exception:  # drainer itself reports a broken pyproject
        return True


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


#: How drainer's usage lines and errors name the program here.
PROG = "manage.py drainer"


def run(args: Sequence[str], using: str = "default", prog: str = PROG) -> int:
    """Run ``drainer <args>`` on ``DATABASES[using]``; drainer's exit code. ``prog``: the
    program's name in drainer's usage lines and errors."""
    from drainer.cli import main
    from drainer.contrib.django import database_url
    from drainer.errors import ConfigError

    try:
        env = {"DRAINER_DATABASE_URL": database_url(using)}
    except (ConfigError, ConnectionDoesNotExist) as exc:
        print(f"{prog}: error: --database {using}: {exc}", file=sys.stderr)
        return 2
    if not _names_an_app(args):
        env["DRAINER_APP"] = AUTODISCOVER
    with _environ(env):
        return int(main(list(args), prog=prog) or 0)


class Command(BaseCommand):  # type: ignore[misc]
    help = ("Run a drainer command on this project's database, e.g. `manage.py drainer "
            "migrate`, `manage.py drainer run-once`. `manage.py drainer --help` for drainer's.")

    def run_from_argv(self, argv: list[str]) -> None:
        # Everything goes to drainer's own parser, its --help included.
        using, args = _split_database(argv[2:])
        code = run(args, using, f"{os.path.basename(argv[0])} {argv[1]}")
        if code:
            sys.exit(code)

    def add_arguments(self, parser: CommandParser) -> None:  # call_command()
        # drainer parses its own flags (drainer.cli): Django only passes the rest through
        parser.add_argument("--database", default="default")
        parser.add_argument("drainer_args", nargs="...")  # argparse.REMAINDER

    def handle(self, *args: Any, **options: Any) -> None:
        code = run(options["drainer_args"], options["database"])
        if code:
            raise CommandError(f"drainer exited with {code}", returncode=code)
