"""``drainer schedule``: wake on an interval or a cron schedule, drain, hold nothing in between.

Built on APScheduler 3.x (imported only here, only when the command runs). Each wake calls
the same :func:`drainer.drain.run_once` as ``drainer run-once``: one connection, opened at
the start of the run and closed at its end, so the compute can suspend between runs.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any

from drainer.errors import ConfigError, DrainerError
from drainer.settings import DEFAULT_MAX_SLEEP_S
from drainer.waking import (
    AwakeEstimate,
    IdleTimeout,
    estimate_from_wakes,
    estimate_interval,
    fmt_seconds,
    idle_timeout_of,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from drainer.drain import RunReport
    from drainer.registry import Registry
    from drainer.settings import Settings

logger = logging.getLogger(__name__)

#: Without --max-runtime, a run stops claiming after this fraction of the shortest time
#: between two wakes, so it ends well before the next wake.
DEFAULT_MAX_RUNTIME_FRACTION = 0.5
#: ... and never more than an hour (a weekly cron does not want 3.5-day drains).
DEFAULT_MAX_RUNTIME_CAP_S = 3600.0
#: --dry-run prints this many wakes.
DRY_RUN_WAKES = 5
#: A pulled-earlier wake must gain at least this much on the scheduled one.
PULL_EARLIER_MIN_GAIN_S = 1.0
#: Cron schedules are examined over this window (gaps, wakes a day).
CRON_HORIZON_S = 7 * 86400.0
CRON_MAX_FIRES = 20_000

JOB_ID = "drain"

WAKE_POLICIES = ("always", "known-work")

#: Weekday names in cron order: 0 (and 7) is Sunday.
CRON_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
CRON_MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


# -- cron with cron's meaning ---------------------------------------------------------------------


def _cron_day(token: str) -> int:
    """A day-of-week token in cron numbering: 0-7 (0 and 7 Sunday) or sun..sat."""
    t = token.strip().lower()
    if t.isdigit():
        n = int(t)
        if not 0 <= n <= 7:
            raise ValueError(f"day of week {token!r} is out of range 0-7")
        return n
    if t[:3] in CRON_WEEKDAYS and len(t) == 3:
        return CRON_WEEKDAYS.index(t)
    raise ValueError(f"invalid day of week {token!r} (use 0-7 or sun-sat)")


def cron_weekdays(field: str) -> str:
    """Translate cron's day-of-week field into APScheduler 3's ``day_of_week``.

    Cron counts 0 (and 7) as Sunday; APScheduler 3's numbers start at Monday, so numbers
    are never passed through: the field is expanded to the set of days it means and
    written with names, which both read the same way (``0`` -> ``sun``, ``1-5`` ->
    ``mon,tue,wed,thu,fri``, ``5-7`` -> ``fri,sat,sun``, ``*/2`` -> ``sun,tue,thu,sat``).
    """
    days: set[int] = set()
    for item in field.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"empty item in day of week {field!r}")
        rng, _, step_s = item.partition("/")
        step = 1
        if step_s:
            if not step_s.isdigit() or int(step_s) == 0:
                raise ValueError(f"invalid step in day of week {item!r}")
            step = int(step_s)
        if rng == "*":
            first, last = 0, 6
        elif "-" in rng:
            a, b = rng.split("-", 1)
            first, last = _cron_day(a), _cron_day(b)
            if last == 0 and first > 0:  # mon-sun, fri-sun: Sunday closes the week
                last = 7
            if first > last:
                raise ValueError(f"day-of-week range {rng!r} runs backwards")
        else:
            first = _cron_day(rng)
            last = 7 if step_s else first  # vixie cron: 'N/S' means N-7/S
        days.update(d % 7 for d in range(first, last + 1, step))
    if days == set(range(7)):
        return "*"
    return ",".join(CRON_WEEKDAYS[d] for d in sorted(days))


def cron_trigger(expr: str, tz: tzinfo, jitter: float | None = None) -> Any:
    """An APScheduler trigger that fires when cron would fire for ``expr``.

    Besides the day-of-week numbering, cron has one more rule APScheduler lacks: when both
    day of month and day of week are restricted (neither starts with ``*``), a day matches
    when *either* matches (``0 3 1 * mon`` = the 1st and every Monday).
    """
    from apscheduler.triggers.combining import OrTrigger
    from apscheduler.triggers.cron import CronTrigger

    text = CRON_MACROS.get(expr.strip().lower(), expr)
    fields = text.split()
    if len(fields) != 5:
        raise ValueError(f"a cron expression has 5 fields 'm h dom mon dow', got {len(fields)}")
    minute, hour, dom, month, dow = fields
    weekdays = cron_weekdays(dow)
    common = {"minute": minute, "hour": hour, "month": month, "timezone": tz}
    if not dom.startswith("*") and not dow.startswith("*"):
        return OrTrigger([CronTrigger(day=dom, day_of_week="*", **common),
                          CronTrigger(day="*", day_of_week=weekdays, **common)],
                         jitter=jitter or None)
    return CronTrigger(day=dom, day_of_week=weekdays, jitter=jitter or None, **common)


# -- the wake schedule ----------------------------------------------------------------------------


@dataclass(frozen=True)
class WakeSchedule:
    """When to wake: every ``interval`` seconds (first wake at start) or on a cron expression.

    ``jitter`` delays each wake by a random 0..jitter seconds. With an interval, APScheduler
    counts the next wake from the previous (delayed) one, so two wakes are never closer
    than the interval; with cron, each wake is delayed from its cron time.
    """

    interval: float | None = None
    cron: str | None = None
    jitter: float = 0.0
    timezone: tzinfo | None = None

    def __post_init__(self) -> None:
        if (self.interval is None) == (self.cron is None):
            raise ConfigError("give either --interval SECONDS or --cron 'm h dom mon dow'")
        if self.interval is not None and self.interval <= 0:
            raise ConfigError("--interval must be more than 0 seconds")
        if self.jitter < 0:
            raise ConfigError("--jitter must not be negative")
        if self.cron is not None:
            try:
                cron_trigger(self.cron, self.tz)
            except ValueError as exc:
                raise ConfigError(f"--cron {self.cron!r}: {exc}") from None

    @property
    def tz(self) -> tzinfo:
        if self.timezone is not None:
            return self.timezone
        from tzlocal import get_localzone

        return get_localzone()

    def trigger(self, *, jitter: bool = True) -> Any:
        """The APScheduler trigger (``jitter=False``: the wakes before the random delay)."""
        j = self.jitter if jitter and self.jitter > 0 else None
        if self.cron is not None:
            return cron_trigger(self.cron, self.tz, j)
        from apscheduler.triggers.interval import IntervalTrigger

        return IntervalTrigger(seconds=self.interval, jitter=j, timezone=self.tz)

    def describe(self) -> str:
        jit = f" + up to {fmt_seconds(self.jitter)} jitter" if self.jitter else ""
        if self.interval is not None:
            return f"every {fmt_seconds(self.interval)}{jit}, first wake at start"
        return f"cron {self.cron!r} ({self.tz}){jit}"

    def next_wakes(self, n: int, now: datetime | None = None) -> list[datetime]:
        """The next ``n`` wakes before jitter (with an interval, the first is ``now``)."""
        now = now or datetime.now(self.tz)
        if self.interval is not None:
            return [now + timedelta(seconds=self.interval * k) for k in range(n)]
        trig = self.trigger(jitter=False)
        out: list[datetime] = []
        prev: datetime | None = None
        cursor = now
        while len(out) < n:
            nxt = trig.get_next_fire_time(prev, cursor)
            if nxt is None:
                break
            out.append(nxt)
            prev, cursor = nxt, nxt + timedelta(microseconds=1)
        return out

    def _cron_fires(self, now: datetime) -> list[datetime]:
        trig = self.trigger(jitter=False)
        end = now + timedelta(seconds=CRON_HORIZON_S)
        fires: list[datetime] = []
        prev: datetime | None = None
        cursor = now
        while len(fires) < CRON_MAX_FIRES:
            nxt = trig.get_next_fire_time(prev, cursor)
            if nxt is None or nxt >= end:
                break
            fires.append(nxt)
            prev, cursor = nxt, nxt + timedelta(microseconds=1)
        return fires

    def min_gap(self, now: datetime | None = None) -> float:
        """The shortest time in seconds between two wakes (cron: over the next week)."""
        if self.interval is not None:
            return self.interval
        fires = self._cron_fires(now or datetime.now(self.tz))
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(fires)]
        if not gaps:
            return CRON_HORIZON_S
        return max(0.0, min(gaps) - self.jitter)

    def estimate(self, idle: IdleTimeout, max_drain_s: float | None,
                 now: datetime | None = None) -> AwakeEstimate:
        """How long these wakes keep the compute awake a day (see drainer.waking)."""
        if self.interval is not None:
            return estimate_interval(self.interval, self.jitter, idle, max_drain_s)
        now = now or datetime.now(self.tz)
        fires = self._cron_fires(now)
        window = CRON_HORIZON_S
        if len(fires) >= CRON_MAX_FIRES:
            window = (fires[-1] - now).total_seconds() or 1.0
        return estimate_from_wakes([f.timestamp() + self.jitter / 2 for f in fires],
                                   now.timestamp(), window, idle, max_drain_s)


def check_schedule(wakes: WakeSchedule, idle: IdleTimeout, max_runtime: float | None, *,
                   allow_always_on: bool, policy: str = "always",
                   max_sleep: float | None = None) -> float:
    """Refuse schedules that keep the compute awake; return the max runtime of one run.

    With ``known-work`` a tick that finds no reason does not connect, so ticks may come
    as often as you like; what wakes an idle compute is the safety net, so it is
    ``--max-sleep`` that must be longer than the idle timeout, and it bounds a run.
    """
    if policy == "known-work":
        assert max_sleep is not None
        if not idle.never_suspends and max_sleep <= idle.seconds and not allow_always_on:
            raise ConfigError(
                f"--max-sleep {fmt_seconds(max_sleep)} is not longer than the "
                f"{fmt_seconds(idle.seconds)} idle timeout ({idle.source}): the safety net "
                "alone would keep the compute awake; use a longer --max-sleep, or pass "
                "--allow-always-on")
        if max_runtime is None:
            return min(DEFAULT_MAX_RUNTIME_CAP_S,
                       max(1.0, max_sleep * DEFAULT_MAX_RUNTIME_FRACTION))
        if max_runtime >= max_sleep:
            raise ConfigError(f"--max-runtime {fmt_seconds(max_runtime)} must be shorter than "
                              f"--max-sleep {fmt_seconds(max_sleep)}")
        return max_runtime
    gap = wakes.min_gap()
    if not idle.never_suspends and gap <= idle.seconds and not allow_always_on:
        limit = f"the {fmt_seconds(idle.seconds)} idle timeout ({idle.source})"
        if wakes.interval is not None:
            raise ConfigError(
                f"--interval {fmt_seconds(gap)} is not longer than {limit}: the compute "
                "would never suspend (awake 24 h a day); use a longer interval, or pass "
                "--allow-always-on")
        raise ConfigError(
            f"--cron {wakes.cron!r} wakes as often as every {fmt_seconds(gap)}, not longer "
            f"than {limit}: the compute would not suspend between those wakes; space them "
            "further apart, or pass --allow-always-on")
    if max_runtime is None:
        return min(DEFAULT_MAX_RUNTIME_CAP_S, max(1.0, gap * DEFAULT_MAX_RUNTIME_FRACTION))
    if max_runtime >= gap:
        raise ConfigError(f"--max-runtime {fmt_seconds(max_runtime)} must be shorter than "
                          f"the {fmt_seconds(gap)} between two wakes")
    return max_runtime


# -- the known-work wake policy -------------------------------------------------------------------


@dataclass
class WakeState:
    """What the process knows about the queue, to tell whether a tick has a reason to wake.

    Kept in memory only: a new process knows nothing, so its first tick drains in full.
    Times are epoch seconds. ``last_end`` is when the last run (or failed attempt) ended:
    the compute went quiet then, so a wake for a due retry waits until ``last_end +
    idle_s`` (one wake then takes every retry that came due meanwhile).
    """

    idle_s: float
    max_sleep_s: float
    completed: int = 0
    last_end: float | None = None
    remaining_due: int = 0
    next_due_at: float | None = None
    triggers: int = 0
    triggers_served: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def note_trigger(self) -> None:
        with self._lock:
            self.triggers += 1

    def run_started(self) -> int:
        """Call when a run starts; pass the result to :meth:`run_ended`."""
        with self._lock:
            return self.triggers

    def run_ended(self, report: RunReport, triggers_at_start: int, at: float) -> None:
        """A run completed: it saw every trigger that came before it started."""
        nxt = datetime.fromisoformat(report.next_due_at) if report.next_due_at else None
        with self._lock:
            self.completed += 1
            self.last_end = at
            self.remaining_due = report.remaining_due
            self.next_due_at = nxt.timestamp() if nxt is not None else None
            self.triggers_served = max(self.triggers_served, triggers_at_start)

    def run_failed(self, at: float) -> None:
        """A run failed (database unreachable...): what was known stays, so it is retried."""
        with self._lock:
            self.last_end = at

    def decide(self, now: float) -> tuple[bool, str]:
        """(wake?, why) for a tick at ``now``."""
        with self._lock:
            if self.completed == 0:
                if self.last_end is None:
                    return True, "start: one full drain (a new process knows nothing)"
                return True, "no complete drain yet (the last attempt failed)"
            assert self.last_end is not None
            pending = self.triggers - self.triggers_served
            if pending > 0:
                return True, (f"trigger: {pending} trigger{'' if pending == 1 else 's'} "
                              "since the last complete drain")
            if self.remaining_due > 0:
                return True, (f"due work left: the last run stopped with "
                              f"{self.remaining_due} due job"
                              f"{'' if self.remaining_due == 1 else 's'}")
            quiet_until = self.last_end + self.idle_s
            held = ""
            if self.next_due_at is not None and self.next_due_at <= now:
                due = _clock(self.next_due_at)
                if now >= quiet_until:
                    return True, (f"retry due: a job the last run saw waiting came due at "
                                  f"{due}")
                held = (f"a job came due at {due}, held until {_clock(quiet_until)} (idle "
                        "timeout after the last run) to group wakes; ")
            asleep = now - self.last_end
            if asleep >= self.max_sleep_s:
                return True, (f"safety net: {fmt_seconds(asleep)} since the last run "
                              f"(--max-sleep {fmt_seconds(self.max_sleep_s)})")
            nxt = ("" if self.next_due_at is None or held else
                   f"next job due {_clock(self.next_due_at)}; ")
            return False, (f"no known work: no trigger since the last drain, none left due; "
                           f"{held}{nxt}safety net at "
                           f"{_clock(self.last_end + self.max_sleep_s)}")


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


# -- running --------------------------------------------------------------------------------------


class _Runner:
    """The scheduled job: one drain per call, never two at once, none after ``stop``."""

    def __init__(self, settings: Settings, registry: Registry | None, stop: threading.Event,
                 idle: IdleTimeout, pull_earlier: bool,
                 on_report: Callable[[RunReport], None] | None, policy: str = "always",
                 max_sleep: float | None = None) -> None:
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

    def __call__(self) -> None:
        """A scheduled tick: drain (policy always), or only when there is known work."""
        if self.stop.is_set():
            return
        if not self.lock.acquire(blocking=False):
            logger.debug("tick skipped: a run is in progress")
            return
        try:
            if self.policy == "known-work":
                wake, why = self.state.decide(time.time())
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
            return self._run().as_dict()

    def _run(self) -> RunReport:
        """One run_once; raises what it raises (after noting the failure)."""
        from drainer.drain import run_once

        self.runs += 1
        seen = self.state.run_started()
        try:
            report = run_once(self.settings, registry=self.registry, stop=self.stop)
        except BaseException:
            self.state.run_failed(time.time())
            raise
        self.state.run_ended(report, seen, time.time())
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

    def settings_tz(self) -> tzinfo:
        tz = getattr(self.scheduler, "timezone", None)
        if tz is None:
            from datetime import timezone

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


def run_schedule(settings: Settings, wakes: WakeSchedule, *, stop: threading.Event,
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

    idle = idle or idle_timeout_of(settings)
    runner = _Runner(settings, registry, stop, idle, pull_earlier, on_report,
                     policy or settings.wake_policy, max_sleep)
    server: Any = None
    http: threading.Thread | None = None
    if listen is not None:
        from drainer.serve import make_server

        server = make_server(settings, listen[0], listen[1], token=token,
                             drain=runner.triggered, on_request=runner.state.note_trigger)
        host, port = server.server_address[:2]
        http = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                name="drainer-schedule-http", daemon=True)
        http.start()
        logger.info("listening on http://%s:%d (POST /drain, GET /healthz, GET /runs/<id>); "
                    "no database connection until a drain is due", host, port,
                    extra={"port": port})
        if on_listening is not None:
            on_listening(host, port)
    scheduler = BackgroundScheduler(
        executors={"default": ThreadPoolExecutor(max_workers=1)},
        job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": None},
        timezone=wakes.tz,
    )
    runner.scheduler = scheduler
    first: dict[str, Any] = {}
    if wakes.interval is not None:
        first["next_run_time"] = datetime.now(wakes.tz)
    scheduler.add_job(runner, wakes.trigger(), id=JOB_ID, name="drain", **first)
    if wakes.interval is not None:
        logger.info("scheduled: %s", wakes.describe())
    else:
        nxt = wakes.next_wakes(1)
        logger.info("scheduled: %s; next wake %s", wakes.describe(),
                    nxt[0].isoformat() if nxt else "never")
    if runner.policy == "known-work":
        logger.info("wake policy known-work: a tick connects only after a trigger, with due "
                    "work left, for a retry come due (not sooner than %s after the last run), "
                    "or %s after the last run (--max-sleep)", fmt_seconds(idle.seconds),
                    fmt_seconds(runner.state.max_sleep_s))
    scheduler.start()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
            server.coalescer.shutdown(timeout=0)  # no new drains; the one running ends below
        scheduler.shutdown(wait=True)
        if server is not None:
            server.coalescer.shutdown(timeout=settings.grace + 60)
    return runner.runs
