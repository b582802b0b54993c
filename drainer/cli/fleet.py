"""``drainer fleet ...``: many tenant databases from one control database.

``migrate`` (the control table and every tenant's jobs table), ``due`` (say tenants have
work), ``run-once`` (drain the due tenants), ``status`` and ``next-wake`` (the control
database only). The library is :mod:`drainer.fleet`, imported when a command runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from drainer.cli._base import SCOPES, Command, Parser, add_settings_flags
from drainer.cli._output import (
    JSON_HELP,
    emit,
    print_json,
    stdout_for_reports_only,
    text_table,
)
from drainer.errors import EXIT_OK, EXIT_TENANTS_FAILED, ConfigError

if TYPE_CHECKING:
    from drainer.fleet.control import Control
    from drainer.settings import Settings

logger = logging.getLogger("drainer.fleet")

#: The settings scopes of each fleet command (``fleet``'s own flags are SCOPES["fleet"]).
FLEET_SCOPES: dict[str, tuple[str, ...]] = {
    "migrate": ("db", "fleet"),
    "due": ("db", "fleet"),
    "run-once": ("db", "run", "fleet"),
    "status": ("db", "fleet"),
    "next-wake": ("db", "fleet"),
}

_EXIT_NOTE = (f"Exit codes: {EXIT_OK} every tenant served, {EXIT_TENANTS_FAILED} some "
              "tenants failed (each tenant's line says how; the others were served), 2 "
              "usage or configuration, 3 control database unreachable, 4 control table "
              "missing (run drainer fleet migrate).")


def configure_fleet(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "fleet", help="Many tenant databases from one control database: migrate, due, "
        "run-once, status, next-wake.",
        description="Drain a fleet of tenant databases, connecting only to those with "
        "known work: the control database (--fleet-url) holds each tenant's next due time, "
        "last run and outcome. " + _EXIT_NOTE)
    add_settings_flags(p, SCOPES["fleet"])
    p.set_defaults(func=_usage(p))
    commands = p.add_subparsers(dest="fleet_command", metavar="COMMAND", parser_class=Parser,
                                help="What to do with the fleet (drainer fleet COMMAND "
                                "--help for its flags).")

    m = _command(commands, "migrate", "Create the control table, then migrate every "
                 "tenant's jobs table (bounded parallel, idempotent, resumable: one JSON "
                 "line a tenant, then a summary).", migrate_command)
    m.add_argument("--recheck", action="store_true",
                   help="Connect to every tenant, also those the control table records at "
                   "the latest version (skipped by default, without a connection).")

    d = _command(commands, "due", "Say tenants have work, on the control database only "
                 "(the next fleet run-once drains them; nothing connects to them now).",
                 due_command)
    d.add_argument("names", nargs="+", metavar="NAME", help="Tenant names.")
    d.add_argument("--at", metavar="TIME", help="Due from this time: ISO 8601 (UTC unless "
                   "it has an offset), or a duration from now (90s, 15m) [default: now].")

    _command(commands, "run-once", "Drain the tenants whose known due time has passed and "
             "those never drained, --fleet-concurrency at a time, each as run-once would; "
             "print one JSON report with a line per tenant.", run_once_command)

    s = _command(commands, "status", "Every tenant's row of the control table (next due "
                 "time, last run, outcome, schema version, lease); no tenant is connected "
                 "to.", status_command)
    s.add_argument("--json", action="store_true", help=JSON_HELP)

    w = _command(commands, "next-wake", "Print when the next fleet wake has known work "
                 "(ISO 8601, UTC): now when a tenant is due or never drained, else the "
                 "earliest known due time; nothing when there is none.", next_wake_command)
    w.add_argument("--json", action="store_true", help="One JSON object: next_wake_at, "
                   "reason, tenant, due_now, never_drained, leased, tenants.")


def _command(commands: Any, name: str, help_text: str, func: Command
             ) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = commands.add_parser(
        name, help=help_text, description=f"{help_text} {_EXIT_NOTE}")
    add_settings_flags(p, FLEET_SCOPES[name])
    for action in p._actions:  # a tenant's URL comes from the tenants, never this flag
        if action.dest == "database_url":
            action.help = argparse.SUPPRESS

    def run(args: argparse.Namespace, settings: Settings) -> int:
        args.command = f"fleet {name}"  # what an error line starts with (drainer.cli.main)
        return func(args, settings)

    p.set_defaults(func=run)
    return p


def _usage(parser: argparse.ArgumentParser) -> Command:
    def usage(args: argparse.Namespace, settings: Settings) -> int:
        parser.print_usage(sys.stderr)
        sys.stderr.write("drainer fleet: error: name a command: migrate, due, run-once, "
                         "status or next-wake (see drainer fleet --help)\n")
        return 2

    return usage


def _control(settings: Settings) -> tuple[Any, Control]:
    from drainer.fleet.control import Control, connect_control

    conn = connect_control(settings)
    return conn, Control(conn, settings.schema_name)


def _tenant_logs() -> Any:
    """Each log line of a tenant's work names the tenant (``tenant`` in JSON logs)."""
    from drainer.fleet.run import TenantLogs

    logs = TenantLogs()
    for handler in logging.getLogger("drainer").handlers:
        handler.addFilter(logs)
    return logs


def _stopping(what: str) -> Callable[[str], None]:
    def note(name: str) -> None:
        logger.info("received %s: %s", name, what)

    return note


# -- migrate --------------------------------------------------------------------------------------


def migrate_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer._signals import stop_on_signals
    from drainer.fleet.migrate import migrate_fleet
    from drainer.fleet.tenants import load_tenants

    _tenant_logs()
    tenants = None if settings.fleet_tenants_query else load_tenants(settings)[0]
    conn, control = _control(settings)
    with conn:
        if tenants is None:
            tenants = load_tenants(settings, conn)[0]
        stop = threading.Event()
        with stop_on_signals(stop, _stopping("no more tenants are started; those being "
                                             "migrated finish")):
            result = migrate_fleet(settings, tenants, control, recheck=args.recheck,
                                   stop=stop, on_line=lambda line: print_json(line.as_dict()))
    print_json(result.as_dict())
    return EXIT_TENANTS_FAILED if result.failed else EXIT_OK


# -- due ------------------------------------------------------------------------------------------


def _at(text: str | None) -> datetime | None:
    if text is None:
        return None
    from drainer.settings import parse_duration

    try:
        return datetime.now(timezone.utc) + timedelta(seconds=float(parse_duration(text)))
    except (TypeError, ValueError, OverflowError):
        pass
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--at: not an ISO 8601 time nor a duration: {text!r}") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def due_command(args: argparse.Namespace, settings: Settings) -> int:
    import psycopg

    from drainer.errors import SchemaError
    from drainer.fleet.marks import due
    from drainer.fleet.tenants import check_name

    names = list(dict.fromkeys(check_name(n) for n in args.names))
    at = _at(args.at)
    conn, _ = _control(settings)
    with conn:
        try:
            due(conn, names, at, schema=settings.schema_name)
        except psycopg.errors.UndefinedTable:
            raise SchemaError(f"the fleet's control table in schema {settings.schema_name} "
                              "is not set up: run `drainer fleet migrate` first") from None
    print_json({"due": names, "at": None if at is None else at.isoformat()})
    return EXIT_OK


# -- run-once -------------------------------------------------------------------------------------


def run_once_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer._signals import stop_on_signals
    from drainer.fleet.run import run_fleet

    logs = _tenant_logs()
    stop = threading.Event()
    with stop_on_signals(stop, _stopping("no new turns; running tenants stop claiming, "
                                         "release what has not started, and are recorded")
                         ), stdout_for_reports_only():
        report = run_fleet(settings, stop=stop, logs=logs)
    print_json(report.as_dict())
    return EXIT_TENANTS_FAILED if report.failed else EXIT_OK


# -- status and next-wake -------------------------------------------------------------------------


def status_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.fleet.status import fleet_status
    from drainer.fleet.tenants import listed_names

    conn, control = _control(settings)
    with conn:
        control.check()
        found = fleet_status(control, listed_names(settings, conn))
    emit(found, render_status, as_json=args.json)
    return EXIT_OK


def render_status(status: dict[str, Any]) -> str:
    """The status as a table for people."""
    head = ("tenant", "next due", "last finished", "outcome", "fails", "schema", "leased")
    rows = [head]
    for t in status["tenants"]:
        rows.append((t["tenant"],
                     "now" if t["due_now"] else (t["next_due_at"] or "-"),
                     t["last_finished_at"] or "never", t["outcome"] or "-",
                     str(t["failures"]), str(t["schema_version"] or "-"),
                     "yes" if t["leased_by"] else "-"))
    rows += [(n, "now", "never (not in the control table)", "-", "0", "-", "-")
             for n in status["never_seen"]]
    lines = text_table(rows, right=(4, 5), caps=(40, 32, 32, 12, 5, 6, 6))
    c = status["counts"]
    lines.append(f"{c['tenants']} tenants: {c['due_now']} due now, {c['never_drained']} "
                 f"never drained, {c['failing']} failing, {c['leased']} being drained")
    return "\n".join(lines)


def next_wake_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.fleet.status import fleet_next_wake
    from drainer.fleet.tenants import listed_names

    conn, control = _control(settings)
    with conn:
        control.check()
        wake = fleet_next_wake(control, listed_names(settings, conn), settings.fleet_max_sleep)
    if args.json:
        print_json(wake.as_dict())
    elif wake.at is not None:
        sys.stdout.write(f"{wake.at.astimezone(timezone.utc):%Y-%m-%dT%H:%M:%SZ}\n")
        sys.stdout.flush()
    return EXIT_OK


# -- the fleet's trigger and schedule (drainer serve --fleet, drainer schedule --fleet) ----------


def _checked_tenants(settings: Settings) -> list[str] | None:
    """The tenant names of a tenants file (a bad file: exit 2 before anything starts), or
    None when they come from --tenants-query or the control table (read at each mark)."""
    from drainer.fleet.control import control_settings
    from drainer.fleet.tenants import load_tenants, names

    control_settings(settings)  # no DRAINER_FLEET_URL: exit 2
    if settings.fleet_tenants_query or not settings.fleet_tenants:
        return None
    return names(load_tenants(settings)[0])


def fleet_trigger(settings: Settings, address: tuple[str, int], token: str | None,
                  drain: Any = None) -> tuple[Any, str]:
    """``drainer serve --fleet``'s server (``drain``: schedule --fleet's, which waits for
    its loop's run) and what its start line says."""
    from drainer.drain import resolve_queues
    from drainer.fleet.trigger import TenantMarks
    from drainer.registry import default_registry
    from drainer.serve import fleet_drain_func, make_server

    listed = _checked_tenants(settings)
    resolve_queues(settings, default_registry)  # loads the app; exit 2 if wrong
    server = make_server(settings, *address, token=token,
                         drain=drain or fleet_drain_func(settings, _tenant_logs()),
                         mark=TenantMarks(settings, listed))
    count = "the control table's" if listed is None else f"{len(listed)}"
    return server, f"fleet of {count} tenants: POST /drain?tenant=NAME"


def schedule_fleet(args: argparse.Namespace, settings: Settings,
                   listen: tuple[str, int] | None) -> int:
    """``drainer schedule --fleet``: the known-work policy across the fleet until a signal
    (``listen``: where POST /drain?tenant=NAME is taken, None: nowhere)."""
    from drainer._http import HttpHost
    from drainer._signals import stop_on_signals
    from drainer.cli._output import seconds_arg
    from drainer.fleet.loop import DEFAULT_LOOK_S, FleetLoop

    for flag, given in (("--cron", args.cron), ("--pull-earlier", args.pull_earlier),
                        ("--jitter", args.jitter)):
        if given:
            raise ConfigError(f"{flag} does not go with --fleet: a fleet wakes when the "
                              "control table says a tenant is due")
    look = seconds_arg("--interval", args.interval) or DEFAULT_LOOK_S
    if args.no_auth and listen is None:
        raise ConfigError("--no-auth only goes with --listen")
    lines = [f"schedule: --fleet, a look at the control table every {look:g} s at most "
             "(no tenant connected to)",
             "wake policy: known-work across the fleet (a fleet run when a tenant is due "
             "or never drained; else sleep until the earliest known next_due_at)"]
    if listen is not None:
        lines.append(f"triggers: POST http://{listen[0]}:{listen[1]}/drain?tenant=NAME marks "
                     "the tenant due and drains at once")
    if args.dry_run:
        sys.stdout.write("".join(line + "\n" for line in lines))
        return EXIT_OK
    _checked_tenants(settings)
    conn, control = _control(settings)  # unreachable: exit 3; no control table: exit 4
    with conn:
        control.check()
    stop = threading.Event()
    loop = FleetLoop(settings, stop=stop, look=look, logs=_tenant_logs(),
                     on_report=lambda report: print_json(report.as_dict()))
    http = HttpHost.nothing()
    if listen is not None:
        from drainer.serve import trigger_token

        server, _ = fleet_trigger(settings, listen, trigger_token(settings, args.no_auth),
                                  drain=loop.triggered)
        http = HttpHost(server, name="drainer-schedule-http", grace=settings.grace)
    for line in lines[:2]:  # the listening line says where triggers go
        logger.info("%s", line)
    with stop_on_signals(stop, _stopping("no new fleet runs; the one in progress stops "
                                         "claiming and is recorded")), \
            stdout_for_reports_only(), http:
        if listen is not None:
            http.start("no tenant connected to until one is due")
        runs = loop.run()
        http.close()
    logger.info("stopped after %d fleet run(s)", runs)
    return EXIT_OK
