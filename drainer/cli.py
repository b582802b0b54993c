"""The ``drainer`` command: parse, build settings, call the library, map errors to exit codes.

Exit codes: 0 done (also when a limit stopped a drain), 1 anything else, 2 usage or
configuration error, 3 database unreachable, 4 schema missing or out of date.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from drainer._redact import redact
from drainer.errors import (
    EXIT_ERROR,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    ConfigError,
    DrainerError,
)

if TYPE_CHECKING:
    from drainer.settings import AnySettings, Settings

logger = logging.getLogger("drainer.cli")

#: Which settings scopes (see settings.py) each command takes as flags.
_SCOPES: dict[str, tuple[str, ...]] = {
    "migrate": ("db",),
    "enqueue": ("db", "enqueue", "trigger"),
    "status": ("db",),
    "run-once": ("db", "run"),
    "demo": ("db", "run"),
    "schedule": ("db", "run", "wake", "trigger", "schedule"),
    "serve": ("db", "run", "trigger"),
    "worker": ("db", "run", "wake"),
    "audit": ("db", "wake"),
    "jobs": ("db",),
    "show": ("db",),
    "retry": ("db",),
    "cancel": ("db",),
    "purge": ("db",),
}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {redact(message)} (see {self.prog} --help)\n")
        raise SystemExit(EXIT_USAGE)


def _add_settings_flags(parser: argparse.ArgumentParser, scopes: Sequence[str]) -> None:
    from drainer._settings_table import FIELDS

    groups: dict[str, argparse._ArgumentGroup] = {}
    titles = {"db": "database and logging", "run": "drain", "enqueue": "enqueue",
              "trigger": "trigger", "wake": "waking and the compute's idle timeout",
              "schedule": "wake policy"}
    for spec in FIELDS:
        scope = next((s for s in spec.scopes if s in scopes), None)
        if scope is None:
            continue
        group = groups.get(scope)
        if group is None:
            group = groups[scope] = parser.add_argument_group(titles.get(scope, scope))
        if spec.kind == "bool":
            group.add_argument(spec.flag, dest=spec.name, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=spec.help)
        elif spec.kind == "list":
            group.add_argument(spec.flag, dest=spec.name, action="append",
                               default=argparse.SUPPRESS, metavar=spec.metavar, help=spec.help)
        else:
            group.add_argument(spec.flag, dest=spec.name, default=argparse.SUPPRESS,
                               metavar=spec.metavar, help=spec.help)


def settings_from_args(args: argparse.Namespace) -> AnySettings:
    """Settings from the flags given on the command line (others from env/pyproject).

    Commands registered with ``add_fast`` get SettingsValues when the pydantic-free check
    accepts every value (importing pydantic costs about as long as an empty drain);
    anything else goes through ``load_settings``, the authority, which also words the
    error. The other commands (long-running, or copying the model) get Settings.
    """
    from drainer._settings_table import FIELD_NAMES, FIELDS, SettingsValues

    overrides = {k: v for k, v in vars(args).items() if k in FIELD_NAMES}
    if "queues" in overrides:
        overrides["queues"] = [q.strip() for v in overrides["queues"] for q in v.split(",")
                               if q.strip()]
    if getattr(args, "fast_settings", False):
        from drainer._settings_core import fast_values

        values = fast_values(FIELDS, overrides)
        if values is not None:
            return SettingsValues(values)
    from drainer.settings import load_settings

    return load_settings(**overrides)


def _setup_logging(settings: AnySettings) -> None:
    from drainer.logs import setup_logging

    setup_logging(settings.log_level, settings.log_format)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


# -- commands -----------------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace, settings: AnySettings) -> int:
    if args.print_grants:
        from drainer.grants import render_grants

        try:
            sys.stdout.write(render_grants(
                settings.schema_name, settings.table, drainer_role=args.drainer_role,
                producer_role=args.producer_role, maintain=args.maintain))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return 0

    from drainer.db import connect
    from drainer.migrate import install_notify_trigger, migrate

    with connect(settings) as conn:
        result = migrate(conn, settings.schema_name, settings.table)
        if args.notify_trigger:
            install_notify_trigger(conn, settings.schema_name, settings.table)
            result.notify_trigger = True
    print_json(result.as_dict())
    return 0


def cmd_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.commands import enqueue_command

    return enqueue_command(args, settings)


def cmd_status(args: argparse.Namespace, settings: AnySettings) -> int:
    from drainer.status import status_command

    return status_command(args, settings)


def cmd_run_once(args: argparse.Namespace, settings: AnySettings) -> int:
    from drainer.drain import run_once
    from drainer.progress import progress_printer

    progress = progress_printer()
    try:
        report = run_once(settings, handle_signals=True, progress=progress)
    finally:
        if progress is not None:
            progress.close()
    print_json(report.as_dict())
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.demo import demo_command

    return demo_command(args, settings)


def _lazy(target: str) -> Callable[[argparse.Namespace, AnySettings], int]:
    """A command implemented in another module, imported only when it runs."""

    def run(args: argparse.Namespace, settings: AnySettings) -> int:
        module, _, func = target.partition(":")
        try:
            impl = getattr(importlib.import_module(module), func)
        except (ImportError, AttributeError):
            raise ConfigError(f"`drainer {args.command}` is not available in this "
                              "version") from None
        result: int = impl(args, settings)
        return result

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="drainer",
        description="Drain a PostgreSQL job table and exit, so a serverless database can "
        "suspend. Every flag can also be set as a DRAINER_* variable or in [tool.drainer] "
        "of pyproject.toml.",
        epilog="Exit codes: 0 done (also when a limit stopped the drain), 1 other error, "
        "2 usage or configuration, 3 database unreachable, 4 schema missing or out of date.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def add(name: str, help_text: str, func: Callable[[argparse.Namespace, Settings], int],
            fast: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _add_settings_flags(p, _SCOPES[name])
        p.set_defaults(func=func, fast_settings=fast)
        return p

    def add_fast(name: str, help_text: str,
                 func: Callable[[argparse.Namespace, AnySettings], int]
                 ) -> argparse.ArgumentParser:
        """A command whose code also takes SettingsValues (see settings_from_args)."""
        return add(name, help_text, func, fast=True)

    p = add_fast("migrate", "Create or upgrade the jobs table (idempotent; adopts the article's "
            "table).", cmd_migrate)
    p.add_argument("--notify-trigger", action="store_true",
                   help="Also install the AFTER INSERT trigger that pg_notify('drainer', "
                   "queue)s, for `drainer worker`.")
    p.add_argument("--print-grants", action="store_true",
                   help="Print the SQL that creates the least-privilege drainer and producer "
                   "roles for this schema and table (as deploy/sql/roles.sql), without "
                   "connecting, and exit.")
    p.add_argument("--drainer-role", default="drainer", metavar="NAME",
                   help="With --print-grants: the role drainer runs as [default: drainer].")
    p.add_argument("--producer-role", default="drainer_producer", metavar="NAME",
                   help="With --print-grants: the role producers enqueue as "
                   "[default: drainer_producer].")
    p.add_argument("--maintain", action="store_true",
                   help="With --print-grants: also GRANT MAINTAIN (PostgreSQL 17+), so "
                   "drainer may VACUUM the table it does not own.")

    p = add("enqueue", "Enqueue one job (JSON argument) or many (JSON lines on stdin).",
            cmd_enqueue)
    p.add_argument("queue", metavar="QUEUE", help="Queue name.")
    p.add_argument("payload", metavar="JSON", nargs="?",
                   help="The job's payload as JSON. Omit it to read one payload per line "
                   "from stdin (all or nothing).")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--delay", metavar="SECONDS", help="Run no sooner than this many "
                      "seconds from now (also 30s, 15m, 2h, 1d).")
    when.add_argument("--run-at", metavar="ISO", help="Run no sooner than this ISO 8601 "
                      "time (with a time zone; UTC if none).")
    p.add_argument("--priority", type=int, default=0, help="Higher runs first [default: 0].")
    p.add_argument("--dedup-key", metavar="KEY", help="Skip the job when one with this key "
                   "is already queued or running.")

    p = add_fast("status", "What the queue is doing, and the jobs table's health.", cmd_status)
    p.description = ("What the queue is doing: jobs by queue and status, due jobs and the "
            "oldest due job's age, expired leases waiting for the reaper, the next due time, "
            "failed (dead-letter) counts with their most common errors, table and index "
            "size, dead tuples, last (auto)vacuum, other drainer sessions and the oldest "
            "open transaction. One connection, four statements.")
    p.add_argument("--json", action="store_true", help="Print one JSON object on stdout "
                   "(the default when stdout is not a terminal; on a terminal the output is "
                   "a readable table).")

    add_fast("run-once", "Drain every due job once, run maintenance, print the run report, exit.",
        cmd_run_once)

    p = add("demo", "Run the whole flow on a throwaway embedded PostgreSQL (or "
            "DRAINER_DATABASE_URL).", cmd_demo)
    p.add_argument("--jobs", type=int, default=200, help="Sample jobs to enqueue "
                   "[default: 200].")
    p.add_argument("--keep", action="store_true", help="Keep the demo's schema afterwards "
                   "(on DRAINER_DATABASE_URL).")

    p = add("schedule", "Run the drain on an interval or cron schedule, no connection "
            "between runs.", _lazy("drainer.scheduler:schedule_command"))
    p.add_argument("--interval", metavar="SECONDS", help="Seconds between wakes (or 15m, 1h).")
    p.add_argument("--jitter", metavar="SECONDS", help="Random delay added to each wake.")
    p.add_argument("--cron", metavar="EXPR", help="Crontab expression 'm h dom mon dow' "
                   "(0 and 7 are Sunday).")
    p.add_argument("--allow-always-on", action="store_true",
                   help="Accept an interval shorter than the idle timeout (keeps the "
                   "compute awake).")
    p.add_argument("--dry-run", action="store_true", help="Print the next five wakes and "
                   "the awake estimate, then exit without connecting.")
    p.add_argument("--pull-earlier", action="store_true",
                   help="After a run, bring the next wake forward to the earliest retry "
                   "waiting for its backoff, never sooner than the idle timeout after the "
                   "run ended [default: off].")
    p.add_argument("--timezone", metavar="TZ", help="IANA time zone of --cron and of the "
                   "printed wake times [default: the system's].")
    p.add_argument("--listen", metavar="HOST:PORT", help="Also take triggers: POST /drain "
                   "on this address (as drainer serve: bearer DRAINER_TRIGGER_TOKEN, "
                   "coalesced, GET /healthz never touches the database) runs a drain at once, "
                   "never alongside a scheduled one; port 0 picks a free one.")
    p.add_argument("--no-auth", action="store_true", help="With --listen: accept POST /drain "
                   "without a bearer token (only behind something that authenticates).")

    p = add("serve", "HTTP trigger: POST /drain starts a drain; GET /healthz never touches "
            "the database.", _lazy("drainer.serve:serve_command"))
    p.add_argument("--host", default="127.0.0.1", help="Address to listen on "
                   "[default: 127.0.0.1].")
    p.add_argument("--port", type=int, default=None, help="Port [default: $PORT (set by "
                   "Cloud Run and Knative), else 8080; 0 picks a free one].")
    p.add_argument("--no-auth", action="store_true",
                   help="Accept POST /drain without a bearer token (only behind something "
                   "that authenticates; by default serve refuses to start without "
                   "DRAINER_TRIGGER_TOKEN).")

    p = add("worker", "Always-on worker: LISTEN/NOTIFY on a direct connection plus a "
            "fallback poll (keeps the compute awake).", _lazy("drainer.worker:worker_command"))
    p.add_argument("--max-poll-interval", metavar="SECONDS", default="60",
                   help="Longest fallback poll interval while empty [default: 60].")
    p.add_argument("--min-poll-interval", metavar="SECONDS", default="1",
                   help="First fallback poll interval after work was seen; doubles while "
                   "the queue stays empty [default: 1].")

    p = add("audit", "Sample pg_stat_activity and name what keeps the compute awake. "
            "Exit 0 if the compute could suspend, 1 if something keeps it awake.",
            _lazy("drainer.audit:audit_command"))
    p.add_argument("--duration", metavar="SECONDS", default="60",
                   help="How long to sample [default: 60].")
    p.add_argument("--json", action="store_true", help="One JSON object on stdout.")
    p.add_argument("--only-database", metavar="NAME", action="append",
                   help="Only sessions of this database (repeatable) [default: every "
                   "database: they all run on the same compute].")
    p.add_argument("--only-user", metavar="NAME", action="append",
                   help="Only sessions of this user (repeatable).")
    p.add_argument("--only-application", metavar="PATTERN", action="append",
                   help="Only sessions whose application_name is LIKE this pattern "
                   "(repeatable; e.g. 'myapp%%'). Autovacuum workers have none.")
    p.add_argument("--only-pid", metavar="PID", action="append",
                   help="Only these backend pids (repeatable or comma-separated).")

    _add_ops_commands(sub, add_fast)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _add_ops_commands(sub: Any, add: Callable[..., argparse.ArgumentParser]) -> None:
    """jobs, show, retry, cancel, purge (drainer/ops.py): each touches only what it names."""
    out_help = ("Print one JSON object on stdout (the default when stdout is not a "
                "terminal; on a terminal the output is a readable table).")
    statuses = ("queued", "running", "done", "failed")

    p = add("jobs", "List jobs, newest first, with the first line of their last_error.",
            _lazy("drainer.ops:jobs_command"))
    p.add_argument("--queue", dest="job_queue", metavar="QUEUE",
                   help="Only jobs of this queue.")
    p.add_argument("--status", choices=statuses, help="Only jobs with this status.")
    p.add_argument("--limit", type=_positive_int, default=50, metavar="N",
                   help="Show at most N jobs [default: 50].")
    p.add_argument("--json", action="store_true", help=out_help)

    p = add("show", "Show one job with its payload and full last_error.",
            _lazy("drainer.ops:show_command"))
    p.description = ("Show one job: every column, its payload and its full last_error "
                     "(error and traceback tail). Exit 1 when there is no such job.")
    p.add_argument("id", metavar="ID", type=_positive_int, help="The job's id.")
    p.add_argument("--json", action="store_true", help=out_help)

    p = add("retry", "Put failed jobs back in the queue (by id, queue, or all).",
            _lazy("drainer.ops:retry_command"))
    p.description = ("Put failed jobs back in the queue: status queued, attempts 0, due "
            "now (last_error is kept until the job runs again). Give exactly one of --id, "
            "--queue, --all-failed. Jobs whose dedup key is now held by a queued or "
            "running job, and jobs cancelled while running whose owner's lease has not "
            "run out yet, are skipped and counted; nothing else is touched. Prints the "
            "counts.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", dest="ids", metavar="N", type=_positive_int, nargs="+",
                       action="extend", help="These failed jobs (ids that are not failed "
                       "are counted as not_failed / not_found and left alone).")
    which.add_argument("--queue", dest="job_queue", metavar="QUEUE",
                       help="Every failed job of this queue.")
    which.add_argument("--all-failed", action="store_true",
                       help="Every failed job of every queue.")
    p.add_argument("--dry-run", action="store_true",
                   help="Report what would be retried; change nothing.")
    p.add_argument("--json", action="store_true", help=out_help)

    p = add("cancel", "Cancel queued or running jobs by id.",
            _lazy("drainer.ops:cancel_command"))
    p.description = ("Cancel jobs: queued and running jobs become failed with last_error "
            "'cancelled'. A running job's owner notices at its next heartbeat (within "
            "about two thirds of the lease), sets job.cancelled so the handler can stop, "
            "and its outcome is not written; a handler that ignores job.cancelled runs to "
            "its end. Done and failed jobs are left alone; jobs locked by a transaction "
            "(a transaction-mode job in flight) are counted as busy. Prints the counts.")
    p.add_argument("--id", dest="ids", metavar="N", type=_positive_int, nargs="+",
                   action="extend", required=True, help="The jobs to cancel.")
    p.add_argument("--dry-run", action="store_true",
                   help="Report what would be cancelled; change nothing.")
    p.add_argument("--json", action="store_true", help=out_help)

    p = add("purge", "Delete old done or failed jobs now (manual archival).",
            _lazy("drainer.ops:purge_command"))
    p.description = ("Delete finished jobs now (manual archival), in batches of "
                     "DRAINER_ARCHIVE_BATCH_SIZE rows a statement. Queued and running jobs "
                     "are never purged. Prints the count.")
    p.add_argument("--status", required=True, choices=("done", "failed"),
                   help="Which finished jobs: done, or failed (the dead-letter queue).")
    p.add_argument("--older-than", required=True, metavar="AGE",
                   help="Only jobs finished longer ago than this: seconds or 30s, 15m, "
                   "12h, 7d (0 = all of them).")
    p.add_argument("--dry-run", action="store_true",
                   help="Count what would be purged; change nothing.")
    p.add_argument("--json", action="store_true", help=out_help)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        settings = settings_from_args(args)
        _setup_logging(settings)
        code: int = args.func(args, settings)
        return code
    except DrainerError as exc:
        sys.stderr.write(f"drainer {args.command}: {redact(str(exc))}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(f"drainer {args.command}: interrupted\n")
        return 130
    except Exception as exc:
        return _unexpected(args.command, exc)


def _unexpected(command: str, exc: Exception) -> int:
    import psycopg

    text = redact(" ".join(str(exc).split()) or type(exc).__name__)
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        sys.stderr.write(f"drainer {command}: database connection lost: {text}\n")
        return EXIT_UNAVAILABLE
    logger.debug("unexpected error", exc_info=exc)
    sys.stderr.write(f"drainer {command}: {type(exc).__name__}: {text}\n")
    return EXIT_ERROR


def entrypoint() -> None:
    raise SystemExit(main())


if __name__ == "__main__":  # pragma: no cover
    entrypoint()
