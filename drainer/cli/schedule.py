"""Waking on a schedule: ``drainer schedule``, with no connection between runs (and, with
``--listen``, on demand too). APScheduler (drainer/scheduler.py) is imported only when
the command runs."""

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
from drainer.cli._output import print_json, seconds_arg, stdout_for_reports_only
from drainer.cli.wake import listen_address, port_number
from drainer.errors import ConfigError

if TYPE_CHECKING:
    from drainer.drain.report import RunReport
    from drainer.recurring import Definition
    from drainer.scheduler import WakeSchedule
    from drainer.settings import Settings
    from drainer.waking import AwakeEstimate, IdleTimeout

# the command's log lines carry the name of the module it runs
logger = logging.getLogger("drainer.scheduler")

#: --dry-run lists this many wakes for recurring occurrences.
DRY_RUN_OCCURRENCES = 5


def configure_schedule(sub: Any) -> None:
    p = add_command(sub, "schedule", "Run the drain on an interval or cron schedule, no "
                    "connection between runs.", schedule_command)
    p.add_argument("--interval", metavar="SECONDS", help="Seconds between wakes (or 15m, 1h). "
                   "With --wake-policy known-work, how often it looks at what it knows (a "
                   "look connects only for a reason) [default there: 1s, and no --cron].")
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
    p.add_argument("--fleet", action="store_true", help="Wake a fleet's tenants "
                   "(DRAINER_FLEET_URL, --tenants): a fleet run-once whenever the control "
                   "table says a tenant is due, sleeping until its earliest next_due_at "
                   "between (--interval: the longest between two looks at it [default: "
                   "10s]); with --listen, POST /drain?tenant=NAME (docs/fleet.md).")


def wake_schedule_from_args(args: argparse.Namespace, policy: str = "always") -> WakeSchedule:
    """The ticks of --interval or --cron; with --wake-policy known-work and neither, a look
    every :data:`~drainer.wake_schedule.KNOWN_WORK_TICK_S` (known-work decides when to
    drain: a tick without a reason connects to nothing)."""
    from drainer.scheduler import WakeSchedule
    from drainer.wake_schedule import KNOWN_WORK_TICK_S

    tz: tzinfo | None = None
    if args.timezone:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            tz = ZoneInfo(args.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigError(f"--timezone: unknown time zone {args.timezone!r}") from None
    interval = seconds_arg("--interval", args.interval)
    note = ""
    if policy == "known-work" and interval is None and args.cron is None:
        interval = KNOWN_WORK_TICK_S
        note = "known-work looks at what it knows, connecting only for a reason"
    return WakeSchedule(interval=interval, cron=args.cron,
                        jitter=seconds_arg("--jitter", args.jitter) or 0.0, timezone=tz,
                        note=note)


def schedule_command(args: argparse.Namespace, settings: Settings) -> int:
    """Validate, print the awake estimate, run until SIGTERM/SIGINT."""
    if args.fleet:
        from drainer.cli.fleet import schedule_fleet

        return schedule_fleet(args, settings, listen_address(args, None, None))
    from drainer.wake_schedule import check_schedule
    from drainer.waking import idle_timeout_of

    wakes = wake_schedule_from_args(args, settings.wake_policy)
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
        """The estimate's line; with known-work, what it counts (the safety net and the
        recurring occurrences) and what not."""
        from drainer.waking import fmt_seconds

        if self.policy != "known-work" or self.idle.never_suspends:
            return estimate.describe()
        what = ("with no other work: the recurring occurrences and the --max-sleep safety "
                "net in longer gaps" if self.definitions
                else "with no work: the --max-sleep safety net only")
        trig = ("each triggered drain adds its drain time to the wake its producer already "
                "caused; " if self.listen is not None else "")
        return (estimate.describe().replace("awake estimate:", "awake estimate (known-work, "
                                            f"{what}):", 1)
                + f"; {trig}each group of due retries or left work adds about drain time + "
                f"{fmt_seconds(self.idle.seconds)}")

    def dry_run(self, estimate: AwakeEstimate, max_sleep: float) -> list[str]:
        """What --dry-run prints: the schedule, its next wakes, the triggers, the recurring
        definitions, a run's max runtime and the awake estimate."""
        from drainer.scheduler import DRY_RUN_WAKES
        from drainer.waking import fmt_seconds

        lines = [f"schedule: {self.wakes.describe()}"]
        if self.policy == "known-work":
            lines.append(f"wake policy: known-work (ticks check without connecting; a tick "
                         f"wakes after a trigger, with due work left, for a retry, delayed "
                         f"job or lease come due (at once: the compute is up for "
                         f"{fmt_seconds(self.idle.seconds)} after a run), or "
                         f"{fmt_seconds(max_sleep)} after the last run (--max-sleep))")
            lines.append(f"next {DRY_RUN_WAKES} ticks (the first drains in full; with no "
                         "work, later ones skip):")
        else:
            lines.append("wake policy: always (every tick drains)")
            lines.append(f"next {DRY_RUN_WAKES} wakes:")
        lines.extend(f"  {when.isoformat()}" for when in self.wakes.next_wakes(DRY_RUN_WAKES))
        if self.listen is not None:
            lines.append(f"triggers: POST http://{self.listen[0]}:{self.listen[1]}/drain "
                         "drains at once")
        lines.extend(self.recurring_lines())
        lines.append(f"max runtime of a run: {fmt_seconds(self.max_runtime)}")
        lines.append(self.describe_estimate(estimate))
        return lines

    def recurring_lines(self) -> list[str]:
        """The dry run's lines on recurring definitions: each, and the wakes they cause."""
        from drainer.recurring import occurrence_times
        from drainer.waking import fmt_seconds

        definitions, idle = self.definitions, self.idle
        if not definitions:
            return []
        lines = [f"recurring definitions ({len(definitions)}):"]
        now = datetime.now(timezone.utc)
        for d in definitions:
            lines.append(f"  {d.describe()}, catch-up {d.catch_up}")
            fires = occurrence_times([d], [d.queue], now, now + timedelta(days=7), limit=2000)
            gap = min((b - a for a, b in itertools.pairwise(fires)), default=None)
            if (self.policy == "known-work" and gap is not None and not idle.never_suspends
                    and gap <= idle.seconds):
                lines.append(f"    fires as often as every {fmt_seconds(gap)}, not longer "
                             f"than the {fmt_seconds(idle.seconds)} idle timeout: the compute "
                             "will not suspend between its occurrences")
        if self.policy == "known-work":
            firsts = occurrence_times(definitions, [d.queue for d in definitions], now,
                                      now + timedelta(days=366), limit=DRY_RUN_OCCURRENCES)
            lines.append(f"next {len(firsts)} wakes for their occurrences (known-work wakes "
                         "for each, and for nothing else when there is no other work):")
            lines.extend(f"  {datetime.fromtimestamp(t, timezone.utc).isoformat()}"
                         for t in firsts)
        else:
            lines.append("  (wake policy always: an occurrence runs at the first tick after its "
                         "fire time; it adds no wakes)")
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
        logger.warning("idle timeout unknown: assuming %s (%s)",
                             fmt_seconds(idle.seconds), idle.source)
    if (plan.policy == "always" and not idle.never_suspends
            and plan.wakes.min_gap() <= idle.seconds + max_runtime):
        logger.warning("a run that uses its full max runtime (%s) leaves less than the "
                             "idle timeout before the next wake: such wakes keep the compute "
                             "up until the next one", fmt_seconds(max_runtime))
    logger.info(plan.describe_estimate(estimate),
                      extra={"awake_estimate": estimate.as_dict(), "wake_policy": plan.policy})
    run_settings = settings.model_copy(update={"max_runtime": max_runtime})
    _share_log_handlers()

    stop = threading.Event()

    def stopping(name: str) -> None:
        logger.info("received %s: no new runs; a run in progress releases unstarted "
                          "jobs and gives running ones the %s grace period", name,
                          fmt_seconds(settings.grace))

    def exit_now(name: str) -> None:
        sys.stderr.write(f"drainer schedule: second {name}: exiting now; running jobs "
                         "are left to their lease\n")
        os._exit(1)

    with stop_on_signals(stop, stopping, exit_now), stdout_for_reports_only():
        runs = run_schedule(run_settings, plan.wakes, stop=stop, idle=idle,
                            pull_earlier=args.pull_earlier, on_report=_print_report,
                            policy=plan.policy, max_sleep=settings.max_sleep,
                            listen=plan.listen, token=token)
    logger.info("stopped after %d run(s)", runs)
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
