"""``drainer schedule``'s APScheduler glue: wake on an interval or a cron schedule, drain.

Each wake calls the same :func:`drainer.drain.run_once` as ``drainer run-once``: one
connection, opened at the start of the run and closed at its end, so the compute can
suspend between runs. What the schedule means lives elsewhere and imports no APScheduler:
cron expressions in :mod:`drainer.cron`, the schedule and its checks in
:mod:`drainer.wake_schedule`, the idle timeout, awake estimates and the known-work policy
in :mod:`drainer.waking`; the HTTP side of ``--listen`` is :mod:`drainer.serve`'s.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta, timezone, tzinfo
from typing import TYPE_CHECKING, Any

from apscheduler.triggers.base import BaseTrigger

from drainer import wake_schedule
from drainer.cron import iter_fire_times
from drainer.errors import ConfigError, DrainerError
from drainer.waking import (
    DEFAULT_MAX_SLEEP_S,
    WAKE_POLICIES,
    WakeState,
    fmt_seconds,
    idle_timeout_of,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from drainer.cron import CronExpr
    from drainer.drain.report import RunReport
    from drainer.registry import Registry
    from drainer.settings import Settings
    from drainer.waking import IdleTimeout

logger = logging.getLogger(__name__)

#: --dry-run prints this many wakes.
DRY_RUN_WAKES = 5
#: A pulled-earlier wake must gain at least this much on the scheduled one.
PULL_EARLIER_MIN_GAIN_S = 1.0

JOB_ID = "drain"
#: known-work's one-shot wake at the last report's next_due_at (see _Runner._wake_when_due)
DUE_JOB_ID = "due"
#: past next_due_at by this much: the database's clock and this machine's may differ a little
DUE_MARGIN_S = 0.05

_TICK = timedelta(microseconds=1)


# -- triggers -------------------------------------------------------------------------------------


class CronWakeTrigger(BaseTrigger):  # type: ignore[misc]  # APScheduler 3 is untyped
    """An APScheduler trigger that fires at :func:`drainer.cron.iter_fire_times`' times.

    So the scheduler fires when ``--dry-run`` says it will, with cron's meaning (0 and 7 =
    Sunday, day of month *or* day of week) and cron's DST rules; ``jitter`` delays each
    fire by a random 0..jitter seconds, as APScheduler's own triggers do.
    """

    __slots__ = ("expr", "jitter", "timezone")

    def __init__(self, expr: CronExpr, tz: tzinfo, jitter: float | None = None) -> None:
        self.expr = expr
        self.timezone = tz
        self.jitter = jitter

    def get_next_fire_time(self, previous_fire_time: datetime | None,
                           now: datetime) -> datetime | None:
        # as APScheduler's CronTrigger: the first fire at or after now, or right after the
        # previous one when that is earlier (a missed fire, which coalescing folds in)
        after = now.astimezone(timezone.utc) - _TICK
        if previous_fire_time is not None:
            after = min(after, previous_fire_time.astimezone(timezone.utc))
        nxt = next(iter_fire_times(self.expr, self.timezone, after), None)
        if nxt is None:
            return None
        fire: datetime | None = self._apply_jitter(nxt, self.jitter, now)
        return fire

    def __str__(self) -> str:
        return f"cron[{self.expr.text}]"

    def __repr__(self) -> str:
        return f"<CronWakeTrigger ({self.expr.text!r}, timezone='{self.timezone}')>"


def wake_trigger(wakes: wake_schedule.WakeSchedule, *, jitter: bool = True) -> Any:
    """The APScheduler trigger of a wake schedule (``jitter=False``: before the random delay)."""
    j = wakes.jitter if jitter and wakes.jitter > 0 else None
    if wakes.cron is not None:
        return CronWakeTrigger(wakes.cron_expr, wakes.tz, j)
    from apscheduler.triggers.interval import IntervalTrigger

    return IntervalTrigger(seconds=wakes.interval, jitter=j, timezone=wakes.tz)


class WakeSchedule(wake_schedule.WakeSchedule):
    """:class:`drainer.wake_schedule.WakeSchedule` with its APScheduler trigger."""

    def trigger(self, *, jitter: bool = True) -> Any:
        """The APScheduler trigger (``jitter=False``: the wakes before the random delay)."""
        return wake_trigger(self, jitter=jitter)


# -- running --------------------------------------------------------------------------------------


class _Runner:
    """The scheduled job: one drain per call, never two at once, none after ``stop``."""

    def __init__(self, settings: Settings, registry: Registry | None, stop: threading.Event,
                 idle: IdleTimeout, pull_earlier: bool,
                 on_report: Callable[[RunReport], None] | None, policy: str = "always",
                 max_sleep: float | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if policy not in WAKE_POLICIES:
            raise ConfigError(f"--wake-policy must be one of {', '.join(WAKE_POLICIES)}")
        self.policy = policy
        if max_sleep is None:  # settings may be a stand-in in unit tests
            max_sleep = float(getattr(settings, "max_sleep", DEFAULT_MAX_SLEEP_S))
        self.state = WakeState(idle.seconds, max_sleep)
        self.settings = settings
        self.registry = registry
        self.stop = stop
        self.idle = idle
        self.pull_earlier = pull_earlier
        self.on_report = on_report
        self.scheduler: Any = None
        self.runs = 0
        self.lock = threading.Lock()
        self.clock = clock  # epoch seconds, for the known-work policy (tests pass their own)

    def __call__(self) -> None:
        """A scheduled tick: drain (policy always), or only when there is known work."""
        if self.stop.is_set():
            return
        if not self.lock.acquire(blocking=False):
            logger.debug("tick skipped: a run is in progress")
            return
        try:
            if self.policy == "known-work":
                wake, why = self.state.decide(self.clock())
                if not wake:
                    logger.debug("tick skipped, no connection: %s", why,
                                 extra={"wake": False, "reason": why})
                    return
                logger.info("wake: %s", why, extra={"wake": True, "reason": why})
            try:
                self._run()
            except DrainerError as exc:
                logger.error("run failed: %s (next wake as scheduled)", exc)
            except Exception as exc:
                logger.error("run failed: %s: %s (next wake as scheduled)",
                             type(exc).__name__, " ".join(str(exc).split()), exc_info=exc)
        finally:
            self.lock.release()

    def triggered(self, coalescer_stop: threading.Event) -> dict[str, Any]:
        """A drain asked for by POST /drain: waits for a scheduled run to end, never overlaps."""
        with self.lock:
            if self.stop.is_set() or coalescer_stop.is_set():
                raise DrainerError("shutting down: the drain did not start")
            logger.info("wake: trigger (POST /drain)", extra={"wake": True,
                                                             "reason": "trigger"})
            from drainer.serve import requested_run_id

            return self._run(requested_run_id()).as_dict()

    def _run(self, run_id: str | None = None) -> RunReport:
        """One run_once; raises what it raises (after noting the failure). ``run_id``:
        the one POST /drain answered for a triggered run."""
        from drainer.drain import run_once

        self.runs += 1
        seen = self.state.run_started()
        try:
            report = run_once(self.settings, registry=self.registry, stop=self.stop,
                              run_id=run_id)
        except BaseException:
            self.state.run_failed(self.clock())
            raise
        self.state.run_ended(report, seen, self.clock())
        self._wake_when_due(report)
        ended = datetime.now(self.settings_tz())
        if self.on_report is not None:
            self.on_report(report)
        if not self.idle.never_suspends:
            logger.info("run took %s: this wake keeps the compute up about %s (drain + "
                        "%s idle timeout)", fmt_seconds(report.duration_s),
                        fmt_seconds(report.duration_s + self.idle.seconds),
                        fmt_seconds(self.idle.seconds),
                        extra={"run_id": report.run_id, "duration_s": report.duration_s,
                               "awake_s": round(report.duration_s + self.idle.seconds, 3)})
        if self.pull_earlier and not self.stop.is_set():
            self._pull_earlier(report, ended)
        return report

    def _wake_when_due(self, report: RunReport) -> None:
        """known-work: a tick at the report's next_due_at (a retry, a delayed job, a snooze,
        a lease), besides the --interval ticks, so that it runs when due, not up to an
        interval later (while the compute is still up from this run, that costs no resume)."""
        if self.policy != "known-work" or self.scheduler is None or not report.next_due_at \
                or self.stop.is_set():
            return
        due = datetime.fromisoformat(report.next_due_at) + timedelta(seconds=DUE_MARGIN_S)
        self.scheduler.add_job(self, "date", run_date=due, id=DUE_JOB_ID, name="due",
                               replace_existing=True)

    def settings_tz(self) -> tzinfo:
        tz = getattr(self.scheduler, "timezone", None)
        if tz is None:
            return timezone.utc
        assert isinstance(tz, tzinfo)
        return tz

    def _pull_earlier(self, report: RunReport, ended: datetime) -> None:
        """Bring the next wake forward to the next retry, never within the idle timeout."""
        if report.remaining_due:
            due = ended  # a limit stopped the run with due work left
        elif report.next_due_at:
            due = datetime.fromisoformat(report.next_due_at)
        else:
            return
        when = max(due, ended + timedelta(seconds=self.idle.seconds))
        job = self.scheduler.get_job(JOB_ID) if self.scheduler is not None else None
        if job is None or job.next_run_time is None:
            return
        if when < job.next_run_time - timedelta(seconds=PULL_EARLIER_MIN_GAIN_S):
            self.scheduler.modify_job(JOB_ID, next_run_time=when)
            logger.info("next wake pulled earlier to %s (next job due %s; scheduled wake was "
                        "%s)", when.isoformat(), due.isoformat(),
                        job.next_run_time.isoformat())


def run_schedule(settings: Settings, wakes: wake_schedule.WakeSchedule, *, stop: threading.Event,
                 registry: Registry | None = None, idle: IdleTimeout | None = None,
                 pull_earlier: bool = False,
                 on_report: Callable[[RunReport], None] | None = None,
                 policy: str | None = None, max_sleep: float | None = None,
                 listen: tuple[str, int] | None = None, token: str | None = None,
                 on_listening: Callable[[str, int], None] | None = None) -> int:
    """Drain on ``wakes`` until ``stop`` is set; return how many runs started.

    ``settings.max_runtime`` bounds each run (set it below the time between wakes).
    Setting ``stop`` starts no new run and asks the one in progress to shut down as
    ``run_once(stop=...)`` does (release unstarted jobs, grace period for running ones);
    this returns when it has. No signal handlers are installed here.

    ``policy`` (default ``settings.wake_policy``): ``always`` drains at every tick;
    ``known-work`` drains at a tick only for a reason (:meth:`WakeState.decide`).
    ``listen=(host, port)`` also serves POST /drain (``token``: the bearer token, None:
    none asked) with drainer serve's handler and coalescing; a triggered drain runs at
    once, after the scheduled run in progress if any. ``on_listening(host, port)`` is
    called with the bound address.
    """
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.background import BackgroundScheduler

    from drainer._http import HttpHost

    idle = idle or idle_timeout_of(settings)
    runner = _Runner(settings, registry, stop, idle, pull_earlier, on_report,
                     policy or settings.wake_policy, max_sleep)
    http = HttpHost.nothing()
    if listen is not None:
        from drainer.serve import make_server

        http = HttpHost(make_server(settings, listen[0], listen[1], token=token,
                                    drain=runner.triggered,
                                    on_request=runner.state.note_trigger),
                        name="drainer-schedule-http", grace=settings.grace)
    with http:
        if listen is not None:
            http.start("no database connection until a drain is due", on_listening)
        scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=1)},
            job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": None},
            timezone=wakes.tz,
        )
        runner.scheduler = scheduler
        first: dict[str, Any] = {}
        if wakes.interval is not None:
            first["next_run_time"] = datetime.now(wakes.tz)
        scheduler.add_job(runner, wake_trigger(wakes), id=JOB_ID, name="drain", **first)
        if wakes.interval is not None:
            logger.info("scheduled: %s", wakes.describe())
        else:
            nxt = wakes.next_wakes(1)
            logger.info("scheduled: %s; next wake %s", wakes.describe(),
                        nxt[0].isoformat() if nxt else "never")
        if runner.policy == "known-work":
            logger.info("wake policy known-work: a tick connects only after a trigger, with "
                        "due work left, for a retry, delayed job or lease come due (at once: "
                        "the compute is up for %s after a run), or %s after the last run "
                        "(--max-sleep)",
                        fmt_seconds(idle.seconds), fmt_seconds(runner.state.max_sleep_s))
        scheduler.start()
        try:
            while not stop.wait(0.5):
                pass
        finally:
            http.close()  # no new drains from POST /drain; the one running ends below
            scheduler.shutdown(wait=True)
    return runner.runs


# -- the command ----------------------------------------------------------------------------------
