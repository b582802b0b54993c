"""drainer.cron: cron's meaning (0 and 7 = Sunday, names, macros), fire times across DST."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from drainer.cron import iter_fire_times, next_fire_times, parse_cron

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
# A Wednesday.
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
# Europe/Berlin 2026: clocks go forward 29 March 02:00 CET -> 03:00 CEST (01:00 UTC), back
# 25 October 03:00 CEST -> 02:00 CET (01:00 UTC).
SPRING_EVE = datetime(2026, 3, 28, 12, 0, tzinfo=BERLIN)
FALL_EVE = datetime(2026, 10, 24, 12, 0, tzinfo=BERLIN)


def gaps(times: list[datetime]) -> list[float]:
    # aware datetimes of one zone subtract by the wall clock: compare real time
    return [b.timestamp() - a.timestamp() for a, b in pairwise(times)]


def iso(times: list[datetime]) -> list[str]:
    return [t.isoformat() for t in times]


def on(day: str, times: list[datetime]) -> list[str]:
    return [t for t in iso(times) if t.startswith(day)]


# -- cron's meaning -------------------------------------------------------------------------------


@pytest.mark.parametrize("dow", ["0", "7", "sun", "SUN", "Sun"])
def test_zero_seven_and_the_name_are_sunday(dow: str) -> None:
    fires = next_fire_times(f"0 3 * * {dow}", UTC, NOW, 4)
    assert [f.strftime("%A") for f in fires] == ["Sunday"] * 4
    assert fires[0] == datetime(2026, 11, 29, 3, 0, tzinfo=UTC)


@pytest.mark.parametrize("dow, days", [
    ("1-5", {"Mon", "Tue", "Wed", "Thu", "Fri"}),
    ("mon-fri", {"Mon", "Tue", "Wed", "Thu", "Fri"}),
    ("sat,sun", {"Sat", "Sun"}),
    ("6,0", {"Sat", "Sun"}),
    ("0-2", {"Sun", "Mon", "Tue"}),
    ("5-7", {"Fri", "Sat", "Sun"}),
    ("fri-sun", {"Fri", "Sat", "Sun"}),
    ("*/2", {"Sun", "Tue", "Thu", "Sat"}),
    ("1/3", {"Mon", "Thu", "Sun"}),
    ("*", {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}),
])
def test_weekday_ranges_and_steps(dow: str, days: set[str]) -> None:
    fires = next_fire_times(f"0 3 * * {dow}", UTC, NOW, 21)
    assert {f.strftime("%a") for f in fires} == days


def test_month_names_and_numbers_agree() -> None:
    by_name = next_fire_times("0 0 1 jan,jul *", UTC, NOW, 4)
    assert by_name == next_fire_times("0 0 1 1,7 *", UTC, NOW, 4)
    assert [(f.year, f.month) for f in by_name] == [(2027, 1), (2027, 7), (2028, 1), (2028, 7)]


@pytest.mark.parametrize("macro, expr", [
    ("@hourly", "0 * * * *"), ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"),
    ("@weekly", "0 0 * * 0"), ("@monthly", "0 0 1 * *"), ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"), ("@DAILY", "0 0 * * *"),
])
def test_macros(macro: str, expr: str) -> None:
    assert next_fire_times(macro, BERLIN, NOW, 5) == next_fire_times(expr, BERLIN, NOW, 5)


def test_weekly_is_sunday_midnight() -> None:
    assert next_fire_times("@weekly", UTC, NOW, 1) == [datetime(2026, 11, 29, tzinfo=UTC)]


def test_day_of_month_or_day_of_week() -> None:
    fires = next_fire_times("0 3 1 * mon", UTC, NOW, 6)
    assert datetime(2026, 11, 30, 3, tzinfo=UTC) in fires  # a Monday
    assert datetime(2026, 12, 1, 3, tzinfo=UTC) in fires  # the 1st, a Tuesday
    assert all(f.day == 1 or f.strftime("%a") == "Mon" for f in fires)
    # with '*' in one of them the other alone decides; '*/2' counts as '*' (AND)
    assert {f.day for f in next_fire_times("0 3 1 * *", UTC, NOW, 3)} == {1}
    assert all(f.day % 2 == 1 and f.strftime("%a") == "Mon"
               for f in next_fire_times("0 3 */2 * mon", UTC, NOW, 5))


def test_last_day_of_month() -> None:
    fires = next_fire_times("0 0 last * *", UTC, NOW, 4)
    assert [f.date().isoformat() for f in fires] == ["2026-11-30", "2026-12-31", "2027-01-31",
                                                     "2027-02-28"]


def test_strictly_after() -> None:
    at = datetime(2026, 11, 26, 3, 0, tzinfo=UTC)
    assert next_fire_times("0 3 * * *", UTC, at, 1) == [at + timedelta(days=1)]
    assert next_fire_times("0 3 * * *", UTC, at - timedelta(microseconds=1), 1) == [at]


def test_an_expression_that_never_fires_ends() -> None:
    assert next_fire_times("0 0 30 2 *", UTC, NOW, 3) == []
    leap = next_fire_times("0 0 29 2 *", UTC, NOW, 2)
    assert [f.year for f in leap] == [2028, 2032]


@pytest.mark.parametrize("expr", ["61 * * * *", "0 24 * * *", "0 0 0 * *", "0 0 * 13 *",
                                  "0 0 * * 8", "0 0 * * funday", "0 0 * * 5-1", "0 5-1 * * *",
                                  "0 0 * * 1/0", "0 0 * *", "0 0 * * * *", "0 0 ,1 * *",
                                  "x 0 * * *"])
def test_bad_expressions_raise_value_error(expr: str) -> None:
    with pytest.raises(ValueError):
        parse_cron(expr)


# -- DST ------------------------------------------------------------------------------------------


def test_spring_forward_a_fixed_time_in_the_gap_fires_at_the_jump() -> None:
    fires = next_fire_times("30 2 * * *", BERLIN, SPRING_EVE, 3)
    assert iso(fires) == ["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00",
                          "2026-03-31T02:30:00+02:00"]
    assert fires[0] == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    # two fixed times in the gap, and one at the jump: one fire
    assert on("2026-03-29", next_fire_times("0,30 2,3 * * *", BERLIN, SPRING_EVE, 6)) == [
        "2026-03-29T03:00:00+02:00", "2026-03-29T03:30:00+02:00"]


def test_spring_forward_wildcards_skip_the_missing_hour() -> None:
    hourly = next_fire_times("0 * * * *", BERLIN, datetime(2026, 3, 29, 0, 30, tzinfo=BERLIN), 3)
    assert iso(hourly) == ["2026-03-29T01:00:00+01:00", "2026-03-29T03:00:00+02:00",
                           "2026-03-29T04:00:00+02:00"]
    assert gaps(hourly) == [3600, 3600]
    assert on("2026-03-29", next_fire_times("*/30 2 * * *", BERLIN, SPRING_EVE, 4)) == []


def test_fall_back_a_fixed_time_fires_once() -> None:
    fires = next_fire_times("30 2 * * *", BERLIN, FALL_EVE, 3)
    assert iso(fires) == ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00",
                          "2026-10-27T02:30:00+01:00"]


def test_fall_back_wildcards_fire_in_both_runs_of_the_hour() -> None:
    hourly = next_fire_times("0 * * * *", BERLIN, datetime(2026, 10, 25, 0, 30, tzinfo=BERLIN), 4)
    assert iso(hourly) == ["2026-10-25T01:00:00+02:00", "2026-10-25T02:00:00+02:00",
                           "2026-10-25T02:00:00+01:00", "2026-10-25T03:00:00+01:00"]
    assert gaps(hourly) == [3600] * 3
    half = on("2026-10-25", next_fire_times("*/30 2 * * *", BERLIN, FALL_EVE, 6))
    assert half == ["2026-10-25T02:00:00+02:00", "2026-10-25T02:30:00+02:00",
                    "2026-10-25T02:00:00+01:00", "2026-10-25T02:30:00+01:00"]


def test_a_whole_year_in_berlin_hourly_and_daily() -> None:
    start = datetime(2026, 1, 1, tzinfo=BERLIN) - timedelta(microseconds=1)
    end = datetime(2027, 1, 1, tzinfo=BERLIN)
    hourly = []
    for t in iter_fire_times("0 * * * *", BERLIN, start):
        if t >= end:
            break
        hourly.append(t)
    assert len(hourly) == 8760  # every real hour of 2026, none twice
    assert set(gaps(hourly)) == {3600}
    daily = next_fire_times("30 2 * * *", BERLIN, start, 366)
    assert len({t.date() for t in daily[:365]}) == 365 and daily[365].year == 2027
    assert all(g > 0 for g in gaps(daily))


# -- the same wakes as APScheduler's CronTrigger where there is no DST ----------------------------


@pytest.mark.parametrize("expr, dow", [
    ("*/7 * * * *", "*"), ("0 3 * * 0", "sun"), ("15 */4 * * 1-5", "mon,tue,wed,thu,fri"),
    ("0 0 1,15 * *", "*"), ("0 12 * 2-4 *", "*"), ("5 4 * * 6,0", "sat,sun"),
])
def test_same_fires_as_apscheduler_in_utc(expr: str, dow: str) -> None:
    from apscheduler.triggers.cron import CronTrigger

    minute, hour, dom, month, _ = expr.split()
    trig = CronTrigger(minute=minute, hour=hour, day=dom, month=month, day_of_week=dow,
                       timezone=UTC)
    theirs: list[datetime] = []
    prev = None
    for _ in range(60):
        nxt = trig.get_next_fire_time(prev, prev or NOW)
        theirs.append(nxt)
        prev = nxt + timedelta(microseconds=1)
    assert next_fire_times(expr, UTC, NOW - timedelta(microseconds=1), 60) == theirs
