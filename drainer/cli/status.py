"""Looking without changing anything: ``drainer status`` (the queue and its table) and
``drainer audit`` (what keeps the compute awake)."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any

from drainer.cli._base import add_command
from drainer.cli._output import JSON_HELP, emit, seconds_arg
from drainer.errors import ConfigError

if TYPE_CHECKING:
    from drainer.audit import AuditResult, SessionFilter
    from drainer.settings import Settings

logger = logging.getLogger("drainer.audit")


def configure_status(sub: Any) -> None:
    p = add_command(sub, "status", "What the queue is doing, and the jobs table's health.",
                    status_command, description=(
                        "What the queue is doing: jobs by queue and status, due jobs and the "
                        "oldest due job's age, expired leases waiting for the reaper, the "
                        "next due time, failed (dead-letter) counts with their most common "
                        "errors, table and index size, dead tuples, last (auto)vacuum, other "
                        "drainer sessions and the oldest open transaction, and the recurring "
                        "series (with --app: the app's definitions, next fire time, last "
                        "outcome, unserved queues). One connection, four statements."))
    p.add_argument("--json", action="store_true", help="Print one JSON object on stdout "
                   "(the default when stdout is not a terminal; on a terminal the output is "
                   "a readable table).")


def status_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.status import collect_status, render_status

    emit(collect_status(settings), render_status, as_json=args.json)
    return 0


def configure_audit(sub: Any) -> None:
    p = add_command(sub, "audit", "Sample pg_stat_activity and name what keeps the compute "
                    "awake. Exit 0 if the compute could suspend, 1 if something keeps it "
                    "awake.", audit_command)
    p.add_argument("--duration", metavar="DURATION", default="60",
                   help="How long to sample: seconds, or 30s, 5m [default: 60s].")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("--html", metavar="FILE", help="Also write the window's timeline as one "
                   "self-contained HTML page (inline SVG, no script): awake and asleep "
                   "bands, each session's activity, who kept the compute awake and why, "
                   "where it would have suspended.")
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


def _filters_from_args(args: argparse.Namespace) -> SessionFilter:
    from drainer.audit import SessionFilter

    pids = None
    if args.only_pid:
        try:
            pids = [int(p) for v in args.only_pid for p in v.split(",") if p.strip()]
        except ValueError:
            raise ConfigError("--only-pid takes process ids (numbers)") from None
    return SessionFilter(databases=args.only_database or None, users=args.only_user or None,
                         application_names=args.only_application or None, pids=pids)


def _table(result: AuditResult) -> str:
    from drainer.audit import format_table

    return format_table(result).rstrip("\n")


def audit_command(args: argparse.Namespace, settings: Settings) -> int:
    """Exit 0 if the compute could suspend, 1 if something keeps it up."""
    from drainer.audit import audit
    from drainer.waking import fmt_seconds, idle_timeout_of

    duration = seconds_arg("--duration", args.duration)
    if duration <= 0:
        raise ConfigError("--duration must be more than 0 seconds")
    idle = idle_timeout_of(settings)
    if idle.assumed:
        logger.warning("idle timeout unknown: assuming %s (%s)", fmt_seconds(idle.seconds),
                       idle.source)
    result = audit(settings, duration=duration, filters=_filters_from_args(args), idle=idle)
    if args.html:
        from drainer.audit.html import write_html

        try:
            path = write_html(args.html, [("drainer audit", result)])
        except OSError as exc:
            raise ConfigError(f"--html: cannot write {args.html}: {exc.strerror or exc}"
                              ) from None
        logger.info("timeline written to %s", path, extra={"html": str(path)})
    emit(result.as_dict(), lambda _: _table(result), as_json=args.json)
    return 0 if result.could_suspend else 1
