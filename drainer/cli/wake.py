"""Waking on a schedule or on demand: ``drainer schedule`` and ``drainer serve``.

APScheduler (drainer/scheduler.py) and the HTTP server (drainer/serve.py) are imported
only when these commands run.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import sys
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import TYPE_CHECKING, Any

from drainer.cli._base import add_command
from drainer.cli._output import print_json, seconds_arg
from drainer.errors import ConfigError

if TYPE_CHECKING:
    from drainer.drain.report import RunReport
    from drainer.recurring import Definition
    from drainer.scheduler import WakeSchedule
    from drainer.settings import Settings
    from drainer.waking import AwakeEstimate, IdleTimeout

# the commands' log lines carry the names of the modules they run
schedule_log = logging.getLogger("drainer.scheduler")
serve_log = logging.getLogger("drainer.serve")


# -- schedule -------------------------------------------------------------------------------------


def configure_schedule(sub: Any) -> None:
    p = add_command(sub, "schedule", "Run the drain on an interval or cron schedule, no "
                    "connection between runs.", schedule_command)
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
    p.add_argument("--host", metavar="HOST", help="With --port, the same as --listen "
                   "HOST:PORT (serve's form) [default: 127.0.0.1].")
    p.add_argument("--port", type=port_number, metavar="PORT",
                   help="Take triggers on this port (the same as --listen HOST:PORT).")
    p.add_argument("--no-auth", action="store_true", help="With --listen: accept POST /drain "
                   "without a bearer token (only behind something that authenticates).")


def port_number(text: str) -> int:
    """argparse ``type=`` of --port: 0 (any free one) to 65535; else a usage error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number (0 to 65535): {text}")
    return value


def listen_address(args: argparse.Namespace, default_host: str | None,
                   default_port: int | None) -> tuple[str, int] | None:
    """--listen HOST:PORT or --host/--port (both forms on serve and schedule), or None.

    ``default_host``/``default_port``: serve's (it always listens); schedule has none, so
    it listens only when --listen or --port is given.
    """
    from drainer.serve import parse_listen

    if args.listen is not None:
        if args.host is not None or args.port is not None:
            raise ConfigError("give --listen HOST:PORT or --host/--port, not both")
        return parse_listen(args.listen)
    if args.port is None and default_port is None:
        if args.host is not None:
            raise ConfigError("--host needs --port (or use --listen HOST:PORT)")
        return None
    host = args.host if args.host is not None else default_host or "127.0.0.1"
    port = args.port if args.port is not None else default_port
    assert port is not None
    return host, port


def wake_schedule_from_args(args: argparse.Namespace) -> WakeSchedule:
    from drainer.scheduler import WakeSchedule

    tz: tzinfo | None = None
    if args.timezone:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            tz = ZoneInfo(args.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigError(f"--timezone: unknown time zone {args.timezone!r}") from None
    return WakeSchedule(interval=seconds_arg("--interval", args.interval), cron=args.cron,
                        jitter=seconds_arg("--jitter", args.jitter) or 0.0, timezone=tz)


def schedule_command(args: argparse.Namespace, settings: Settings) -> int:
    """Validate, print the awake estimate, run until SIGTERM/SIGINT."""
    from drainer.wake_schedule import check_schedule
    from drainer.waking import idle_timeout_of

    wakes = wake_schedule_from_args(args)
    idle = idle_timeout_of(settings)
    max_runtime = check_schedule(wakes, idle, settings.max_runtime,
                                 allow_always_on=args.allow_always_on,
                                 policy=settings.wake_policy, max_sleep=settings.max_sleep)
    listen = listen_address(args, None, None)
    token: str | None = None
    if listen is not None:
        from drainer.serve import trigger_token

        token = trigger_token(settings, args.no_auth)
    elif args.no_auth:
        raise ConfigError("--no-auth only goes with --listen")
    plan = _SchedulePlan(wakes, idle, max_runtime, settings.wake_policy, listen,
                         _served_definitions(settings))
    estimate = plan.estimate(settings.max_sleep)
    if args.dry_run:
        sys.stdout.write("".join(line + "\n" for line in plan.dry_run(estimate,
                                                                    settings.max_sleep)))
        return 0
    return _run_schedule(args, settings, plan, estimate, token)


@dataclass(frozen=True)
class _SchedulePlan:
    """What ``drainer schedule`` will do, checked: its wakes, the idle timeout they are
    measured against, a run's longest runtime, the wake policy, where it takes triggers
    (None: it does not) and the recurring definitions of the queues it serves."""

    wakes: WakeSchedule
    idle: IdleTimeout
    max_runtime: float
    policy: str
    listen: tuple[str, int] | None
    definitions: list[Definition]

    def estimate(self, max_sleep: float) -> AwakeEstimate:
        """How long the compute stays up a day: known-work wakes for the recurring
        occurrences and the --max-sleep safety net, always for every tick."""
        from drainer.waking import estimate_interval

        if self.policy != "known-work":
            return self.wakes.estimate(self.idle, self.max_runtime)
        if not self.definitions:
            return estimate_interval(max_sleep, 0.0, self.idle, self.max_runtime)
        from drainer.wake_schedule import known_work_estimate

        return known_work_estimate(self.definitions, [d.queue for d in self.definitions],
                                   self.idle, max_sleep, self.max_runtime,
                                   datetime.now(timezone.utc))

    def describe_estimate(self, estimate: AwakeEstimate) -> str:
        return _describe_estimate(estimate, self.policy, self.idle, self.listen is not None,
                                  recurring=bool(self.definitions))

    def dry_run(self, estimate: AwakeEstimate, max_sleep: float) -> list[str]:
        """What --dry-run prints: the schedule, its next wakes, the triggers, the recurring
        definitions, a run's max runtime and the awake estimate."""
        from drainer.scheduler import DRY_RUN_WAKES
        from drainer.waking import fmt_seconds

        lines = [f"schedule: {self.wakes.describe()}"]
        if self.policy == "known-work":
            lines.append(f"wake policy: known-work (ticks check without connecting; a tick "
                         f"wakes after a trigger, with due work left, for a retry come due "
                         f"but not sooner than {fmt_seconds(self.idle.seconds)} after the "
                         f"last run, or {fmt_seconds(max_sleep)} after the last run "
                         f"(--max-sleep))")
            lines.append(f"next {DRY_RUN_WAKES} ticks (the first drains in full; with no "
                         "work, later ones skip):")
        else:
            lines.append("wake policy: always (every tick drains)")
            lines.append(f"next {DRY_RUN_WAKES} wakes:")
        lines.extend(f"  {when.isoformat()}" for when in self.wakes.next_wakes(DRY_RUN_WAKES))
        if self.listen is not None:
            lines.append(f"triggers: POST http://{self.listen[0]}:{self.listen[1]}/drain "
                         "drains at once")
        lines.extend(_describe_recurring(self.definitions, self.policy, self.idle))
        lines.append(f"max runtime of a run: {fmt_seconds(self.max_runtime)}")
        lines.append(self.describe_estimate(estimate))
        return lines


def _run_schedule(args: argparse.Namespace, settings: Settings, plan: _SchedulePlan,
                  estimate: AwakeEstimate, token: str | None) -> int:
    """Log the warnings and the estimate, then run the schedule until a signal."""
    from drainer._signals import stop_on_signals
    from drainer.drain import resolve_queues
    from drainer.registry import default_registry
    from drainer.scheduler import run_schedule
    from drainer.waking import fmt_seconds

    resolve_queues(settings, default_registry)  # fail now, not at the first wake
    idle, max_runtime = plan.idle, plan.max_runtime
    if idle.assumed:
        schedule_log.warning("idle timeout unknown: assuming %s (%s)",
                             fmt_seconds(idle.seconds), idle.source)
    if (plan.policy == "always" and not idle.never_suspends
            and plan.wakes.min_gap() <= idle.seconds + max_runtime):
        schedule_log.warning("a run that uses its full max runtime (%s) leaves less than the "
                             "idle timeout before the next wake: such wakes keep the compute "
                             "up until the next one", fmt_seconds(max_runtime))
    schedule_log.info(plan.describe_estimate(estimate),
                      extra={"awake_estimate": estimate.as_dict(), "wake_policy": plan.policy})
    run_settings = settings.model_copy(update={"max_runtime": max_runtime})
    _share_log_handlers()

    stop = threading.Event()

    def stopping(name: str) -> None:
        schedule_log.info("received %s: no new runs; a run in progress releases unstarted "
                          "jobs and gives running ones the %s grace period", name,
                          fmt_seconds(settings.grace))

    def exit_now(name: str) -> None:
        sys.stderr.write(f"drainer schedule: second {name}: exiting now; running jobs "
                         "are left to their lease\n")
        os._exit(1)

    with stop_on_signals(stop, stopping, exit_now):
        runs = run_schedule(run_settings, plan.wakes, stop=stop, idle=idle,
                            pull_earlier=args.pull_earlier, on_report=_print_report,
                            policy=plan.policy, max_sleep=settings.max_sleep,
                            listen=plan.listen, token=token)
    schedule_log.info("stopped after %d run(s)", runs)
    return 0


def _served_definitions(settings: Settings) -> list[Definition]:
    """The recurring definitions of the queues this schedule serves (loads the app)."""
    from drainer.drain import resolve_queues
    from drainer.recurring import served
    from drainer.registry import default_registry

    if not settings.app and not default_registry.tasks:
        return []
    queues = resolve_queues(settings, default_registry)
    return served(default_registry.schedules.values(), queues)


def _describe_recurring(definitions: list[Definition], policy: str, idle: IdleTimeout
                        ) -> list[str]:
    """The dry run's lines on recurring definitions: each, and the wakes they cause."""
    from drainer.recurring import occurrence_times
    from drainer.waking import fmt_seconds

    if not definitions:
        return []
    lines = [f"recurring definitions ({len(definitions)}):"]
    now = datetime.now(timezone.utc)
    for d in definitions:
        lines.append(f"  {d.describe()}, catch-up {d.catch_up}")
        fires = occurrence_times([d], [d.queue], now, now + timedelta(days=7), limit=2000)
        gap = min((b - a for a, b in itertools.pairwise(fires)), default=None)
        if (policy == "known-work" and gap is not None and not idle.never_suspends
                and gap <= idle.seconds):
            lines.append(f"    fires as often as every {fmt_seconds(gap)}, not longer than the "
                         f"{fmt_seconds(idle.seconds)} idle timeout: the compute will not "
                         "suspend between its occurrences")
    if policy == "known-work":
        firsts = occurrence_times(definitions, [d.queue for d in definitions], now,
                                  now + timedelta(days=366), limit=DRY_RUN_OCCURRENCES)
        lines.append(f"next {len(firsts)} wakes for their occurrences (known-work wakes "
                     "for each, and for nothing else when there is no other work):")
        lines.extend(f"  {datetime.fromtimestamp(t, timezone.utc).isoformat()}" for t in firsts)
    else:
        lines.append("  (wake policy always: an occurrence runs at the first tick after its "
                     "fire time; it adds no wakes)")
    return lines


#: --dry-run lists this many wakes for recurring occurrences.
DRY_RUN_OCCURRENCES = 5


def _describe_estimate(estimate: AwakeEstimate, policy: str, idle: IdleTimeout,
                       listening: bool, *, recurring: bool = False) -> str:
    """The estimate's line; with known-work, what it counts (the safety net and the
    recurring occurrences) and what not."""
    from drainer.waking import fmt_seconds

    if policy != "known-work" or idle.never_suspends:
        return estimate.describe()
    what = ("with no other work: the recurring occurrences and the --max-sleep safety net "
            "in longer gaps" if recurring else "with no work: the --max-sleep safety net only")
    trig = ("each triggered drain adds its drain time to the wake its producer already "
            "caused; " if listening else "")
    return (estimate.describe().replace("awake estimate:", "awake estimate (known-work, "
                                        f"{what}):", 1)
            + f"; {trig}each group of due retries or left work adds about drain time + "
            f"{fmt_seconds(idle.seconds)}")


def _print_report(report: RunReport) -> None:
    from drainer.cli.run import log_where_to_look

    log_where_to_look(report.run_id)
    print_json(report.as_dict())


def _share_log_handlers() -> None:
    """APScheduler's warnings (a wake skipped because a run is still going) in our format."""
    ours = logging.getLogger("drainer")
    aps = logging.getLogger("apscheduler")
    aps.setLevel(logging.WARNING)
    aps.propagate = False
    for h in ours.handlers:
        aps.addHandler(h)


# -- next-wake ------------------------------------------------------------------------------------


def configure_next_wake(sub: Any) -> None:
    p = add_command(sub, "next-wake", "Print when the next drain is needed (ISO 8601, UTC), "
                    "for one-shot schedules (EventBridge Scheduler at(), Cloud Tasks).",
                    next_wake_command, description=(
                        "Print when the next drain is needed, in UTC: now if jobs are due, "
                        "else the earliest of the next queued job and the next occurrence "
                        "of the app's recurring definitions; nothing (exit 0) when there is "
                        "neither. One connection that syncs the definitions (as a drain's "
                        "start does) and reads the queue; --offline computes from the "
                        "definitions alone without connecting."))
    p.add_argument("--offline", action="store_true", help="Do not connect: the next fire "
                   "time of the recurring definitions only (retries and enqueued jobs are "
                   "not seen).")
    p.add_argument("--json", action="store_true", help="One JSON object: next_wake_at, "
                   "reason, remaining_due, next_due_at, next_recurring_at, recurring_key.")


def next_wake_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.status import next_wake

    found = next_wake(settings, offline=args.offline)
    if args.json:
        print_json(found.as_dict())
    elif found.at is not None:
        sys.stdout.write(f"{found.at:%Y-%m-%dT%H:%M:%SZ}\n")
        sys.stdout.flush()
    return 0


# -- serve ----------------------------------------------------------------------------------------


def configure_serve(sub: Any) -> None:
    p = add_command(sub, "serve", "HTTP trigger: POST /drain starts a drain; GET /healthz "
                    "never touches the database.", serve_command)
    p.add_argument("--host", metavar="HOST", help="Address to listen on "
                   "[default: 127.0.0.1].")
    p.add_argument("--port", type=port_number, metavar="PORT", help="Port [default: $PORT "
                   "(set by Cloud Run and Knative), else 8080; 0 picks a free one].")
    p.add_argument("--listen", metavar="HOST:PORT", help="Host and port in one (schedule "
                   "--listen's form); instead of --host/--port.")
    p.add_argument("--no-auth", action="store_true",
                   help="Accept POST /drain without a bearer token (only behind something "
                   "that authenticates; by default serve refuses to start without "
                   "DRAINER_TRIGGER_TOKEN).")


def serve_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer._signals import stop_on_signals
    from drainer.drain import resolve_queues
    from drainer.registry import default_registry
    from drainer.serve import make_server, serve_until, trigger_token

    address = listen_address(args, "127.0.0.1", _env_port())
    assert address is not None
    token = trigger_token(settings, args.no_auth)
    settings.dsn  # noqa: B018 - a missing database URL is a configuration error (exit 2)
    queues = resolve_queues(settings, default_registry)  # loads the app; exit 2 if wrong
    server = make_server(settings, *address, token=token)
    stop_requested = threading.Event()

    def stopping(name: str) -> None:
        serve_log.info("received %s: no new drains; the running one finishes or releases "
                       "its jobs", name)

    with stop_on_signals(stop_requested, stopping):
        started = serve_until(server, stop_requested, grace=settings.grace,
                              note=f"queues: {', '.join(queues)}; no database connection "
                              "until a drain is requested")
    serve_log.info("stopped after %d drain(s)", started)
    return 0


def _env_port() -> int:
    """$PORT (Cloud Run, Knative), else serve's default port."""
    from drainer.serve import DEFAULT_PORT

    raw = os.environ.get("PORT")
    if not raw:
        return DEFAULT_PORT
    try:
        return port_number(raw)
    except argparse.ArgumentTypeError:
        raise ConfigError(f"PORT is not a port number: {raw!r}") from None
