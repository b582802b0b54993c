"""Cron expressions with cron's meaning and their fire times (pure).

Nothing here imports APScheduler: ``drainer schedule --dry-run`` and its checks
(:mod:`drainer.wake_schedule`) and recurring jobs compute fire times with
:func:`next_fire_times`, and the scheduler fires on the same computation
(``drainer.scheduler`` wraps it in an APScheduler trigger), so what the dry run lists is
what runs.

Daylight saving time follows ISC/Vixie cron. A *fixed-time* expression (neither the
minute nor the hour field starts with ``*``) fires once a day at its wall time: a time
skipped when the clocks go forward fires at the moment they jump (``30 2 * * *`` in
Europe/Berlin on the last Sunday of March: 03:00 CEST), a time that occurs twice when
they go back fires at its first occurrence. A *wildcard* expression (``0 * * * *``,
``*/15 2 * * *``) fires by the clock on the wall as it is: not in a skipped hour, and in
both runs of a repeated hour.
"""

from __future__ import annotations

import calendar
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone, tzinfo

__all__ = [
    "CRON_MACROS", "CRON_WEEKDAYS", "CronExpr", "iter_fire_times", "next_fire_times",
    "parse_cron",
]

#: Weekday names in cron order: 0 (and 7) is Sunday.
CRON_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
CRON_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov",
               "dec")
CRON_MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
#: An expression that matches no day in this many days in a row never fires
#: (``0 0 30 2 *``); 29 February comes back within 8 years.
SEARCH_DAYS = 8 * 366 + 1

_UTC = timezone.utc
_TICK = timedelta(microseconds=1)


# -- parsing --------------------------------------------------------------------------------------


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


def _step(item: str, step_s: str, what: str) -> int:
    if not step_s.isdigit() or int(step_s) == 0:
        raise ValueError(f"invalid step in {what} {item!r}")
    return int(step_s)


def _weekday_set(field: str) -> set[int]:
    """The days (0 = Sunday .. 6) a day-of-week field means."""
    days: set[int] = set()
    for item in field.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"empty item in day of week {field!r}")
        rng, _, step_s = item.partition("/")
        step = _step(item, step_s, "day of week") if step_s else 1
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
    return days


def _value(token: str, what: str, lo: int, hi: int, names: tuple[str, ...] = ()) -> int:
    t = token.strip().lower()
    if t in names:
        return names.index(t) + lo
    if not t.isdigit():
        raise ValueError(f"invalid {what} {token!r}")
    n = int(t)
    if not lo <= n <= hi:
        raise ValueError(f"{what} {token!r} is out of range {lo}-{hi}")
    return n


def _field_set(field: str, what: str, lo: int, hi: int,
               names: tuple[str, ...] = ()) -> set[int]:
    """The values a minute, hour, day-of-month or month field means."""
    out: set[int] = set()
    for item in field.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"empty item in {what} {field!r}")
        rng, _, step_s = item.partition("/")
        step = _step(item, step_s, what) if step_s else 1
        if rng == "*":
            first, last = lo, hi
        elif "-" in rng:
            a, b = rng.split("-", 1)
            first, last = _value(a, what, lo, hi, names), _value(b, what, lo, hi, names)
            if first > last:
                raise ValueError(f"{what} range {rng!r} runs backwards")
        else:
            first = _value(rng, what, lo, hi, names)
            last = hi if step_s else first  # 'N/S' means N-max/S
        out.update(range(first, last + 1, step))
    return out


@dataclass(frozen=True)
class CronExpr:
    """A parsed 5-field cron expression (``m h dom mon dow``), cron's rules included.

    When both day of month and day of week are restricted (neither starts with ``*``), a
    day matches when *either* matches (``0 3 1 * mon`` = the 1st and every Monday).
    ``last_day``: the day-of-month field holds ``last`` (the month's last day).
    """

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    dom_any: bool
    dow_any: bool
    last_day: bool = False

    @property
    def wildcard(self) -> bool:
        """Fires by the wall clock as it is (see the module docstring on DST)."""
        minute, hour = self.text.split()[:2]
        return minute.startswith("*") or hour.startswith("*")

    def matches_day(self, d: date) -> bool:
        if d.month not in self.months:
            return False
        dom = d.day in self.days or (
            self.last_day and d.day == calendar.monthrange(d.year, d.month)[1])
        dow = (d.weekday() + 1) % 7 in self.weekdays
        if not self.dom_any and not self.dow_any:
            return dom or dow
        return dom and dow

    def instants_on(self, d: date, tz: tzinfo) -> list[datetime]:
        """The fire times (UTC) of the wall times of day ``d`` in ``tz``, sorted."""
        if not self.matches_day(d):
            return []
        offset = _steady_offset(d, tz)
        if offset is not None:  # no DST change on this day: wall time - offset
            base = datetime(d.year, d.month, d.day, tzinfo=_UTC) - offset
            return [base + timedelta(hours=h, minutes=m)
                    for h in sorted(self.hours) for m in sorted(self.minutes)]
        out: set[datetime] = set()
        wild = self.wildcard
        for h in sorted(self.hours):
            for m in sorted(self.minutes):
                out.update(_resolve(datetime(d.year, d.month, d.day, h, m), tz, wild))
        return sorted(out)


def parse_cron(expr: str) -> CronExpr:
    """Parse ``m h dom mon dow`` or a macro (``@hourly``, ``@daily``...); ValueError if bad."""
    text = CRON_MACROS.get(expr.strip().lower(), expr)
    fields = text.split()
    if len(fields) != 5:
        raise ValueError(f"a cron expression has 5 fields 'm h dom mon dow', got {len(fields)}")
    minute, hour, dom, month, dow = fields
    dom_items = [i.strip().lower() for i in dom.split(",")]
    last_day = "last" in dom_items
    dom_rest = ",".join(i for i in dom_items if i != "last")
    return CronExpr(
        text=" ".join(fields),
        minutes=frozenset(_field_set(minute, "minute", 0, 59)),
        hours=frozenset(_field_set(hour, "hour", 0, 23)),
        days=frozenset(_field_set(dom_rest, "day of month", 1, 31)) if dom_rest
        else frozenset(),
        months=frozenset(_field_set(month, "month", 1, 12, CRON_MONTHS)),
        weekdays=frozenset(_weekday_set(dow)),
        dom_any=dom.startswith("*"), dow_any=dow.startswith("*"), last_day=last_day,
    )


# -- fire times -----------------------------------------------------------------------------------


def _local(t: datetime, tz: tzinfo) -> datetime:
    return t.astimezone(tz).replace(tzinfo=None)


def _steady_offset(d: date, tz: tzinfo) -> timedelta | None:
    """The UTC offset of ``tz`` all through day ``d``, or None when it changes that day."""
    start = datetime(d.year, d.month, d.day)
    ends = (start, start + timedelta(days=1))
    offsets = {e.replace(tzinfo=tz, fold=f).utcoffset() for e in ends for f in (0, 1)}
    if len(offsets) != 1:
        return None
    (offset,) = offsets
    return offset


def _resolve(wall: datetime, tz: tzinfo, wildcard: bool) -> list[datetime]:
    """The instants (UTC) a naive wall time in ``tz`` fires at (0, 1 or 2 of them)."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(_UTC)
    second = wall.replace(tzinfo=tz, fold=1).astimezone(_UTC)
    if first == second:
        return [first]
    a, b = sorted((first, second))
    if _local(a, tz) == wall:  # the wall time occurs twice (clocks went back)
        return [a, b] if wildcard else [a]
    if wildcard:  # skipped by the clock (clocks went forward)
        return []
    # a fixed time in the gap fires when the clocks jump: the first instant past ``a``
    # (still before the gap) whose offset is the one after it
    after = b.astimezone(tz).utcoffset()
    lo, hi = a, b
    while hi - lo > _TICK:
        mid = lo + (hi - lo) / 2
        if mid.astimezone(tz).utcoffset() == after:
            hi = mid
        else:
            lo = mid
    return [hi]


def iter_fire_times(expr: str | CronExpr, tz: tzinfo, after: datetime) -> Iterator[datetime]:
    """Every fire time strictly after ``after``, ascending, as aware datetimes in ``tz``.

    Ends when no day matches for :data:`SEARCH_DAYS` days in a row.
    """
    spec = parse_cron(expr) if isinstance(expr, str) else expr
    start = after.astimezone(_UTC)
    day = _local(start, tz).date() - timedelta(days=1)
    pending: list[datetime] = []
    quiet = 0
    while quiet <= SEARCH_DAYS and day < date.max:
        fresh = [t for t in spec.instants_on(day, tz) if t > start]
        quiet = 0 if fresh else quiet + 1
        pending.extend(fresh)
        pending.sort()
        day += timedelta(days=1)
        # a day's times may run past the next midnight (a fold across it): hold one day back
        final = datetime(day.year, day.month, day.day, tzinfo=tz).astimezone(_UTC) \
            - timedelta(days=1)
        while pending and pending[0] < final:
            yield pending.pop(0).astimezone(tz)
    for t in pending:
        yield t.astimezone(tz)


def next_fire_times(expr: str | CronExpr, tz: tzinfo, after: datetime, n: int
                    ) -> list[datetime]:
    """The next ``n`` fire times of a cron expression strictly after ``after`` (fewer if it
    stops firing), aware in ``tz``, correct across DST changes (see the module docstring)."""
    return list(itertools.islice(iter_fire_times(expr, tz, after), n))
