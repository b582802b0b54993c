"""drainer.wake_schedule: when a schedule wakes (interval or cron, in its time zone), the
schedules refused for keeping the compute awake, the max runtime of a run, awake
estimates; and the scheduler's trigger and its pulling a wake earlier."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from drainer.drain.report import RunReport
from drainer.errors import ConfigError
from drainer.scheduler import _Runner, wake_trigger
from drainer.wake_schedule import WakeSchedule, check_schedule, known_work_wakes
from drainer.waking import DEFAULT_MAX_RUNTIME_CAP_S, IdleTimeout

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
# A Wednesday.
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
# Europe/Berlin 2026: clocks go back 25 October 03:00 CEST -> 02:00 CET.
FALL_EVE = datetime(2026, 10, 24, 12, 0, tzinfo=BERLIN)
NEON = IdleTimeout(300.0, "--platform neon")


def test_the_trigger_the_scheduler_runs_fires_when_the_listing_says() -> None:
    wakes = WakeSchedule(cron="0 3 * * 0", timezone=UTC)
    first = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)  # the Sunday after NOW
    assert wakes.next_wakes(1, NOW) == [first]
    assert wake_trigger(wakes).get_next_fire_time(None, NOW) == first


def test_cron_wakes_are_in_the_schedules_time_zone() -> None:
    berlin = WakeSchedule(cron="0 3 * * *", timezone=BERLIN)
    assert berlin.next_wakes(1, NOW)[0].isoformat() == "2026-11-26T03:00:00+01:00"


def test_the_shortest_gap_across_fall_back_is_a_day() -> None:
    # 02:30 happens twice on the night of the change; the schedule wakes at the first
    # (a 25 h gap), and the shortest gap of the week is still a day, not 0 s
    wakes = WakeSchedule(cron="30 2 * * *", timezone=BERLIN)
    assert wakes.min_gap(FALL_EVE) == 86400
    assert [b.timestamp() - a.timestamp()
            for a, b in pairwise(wakes.next_wakes(2, FALL_EVE))] == [25 * 3600]
    assert WakeSchedule(cron="0 * * * *", timezone=BERLIN).min_gap(FALL_EVE) == 3600


@pytest.mark.parametrize("expr", ["0 3 * * 8", "0 3 * *", "0 3 * * funday", "0 3 * * 5-1",
                                  "61 3 * * *", "0 3 * * 1/0"])
def test_bad_cron_is_one_config_error(expr: str) -> None:
    with pytest.raises(ConfigError, match="--cron"):
        WakeSchedule(cron=expr, timezone=UTC)


def test_exactly_one_of_interval_and_cron() -> None:
    with pytest.raises(ConfigError):
        WakeSchedule()
    with pytest.raises(ConfigError):
        WakeSchedule(interval=600, cron="0 3 * * *")
    with pytest.raises(ConfigError):
        WakeSchedule(interval=0)


def test_interval_wakes_start_now() -> None:
    wakes = WakeSchedule(interval=600, timezone=UTC).next_wakes(3, NOW)
    assert wakes == [NOW, NOW + timedelta(minutes=10), NOW + timedelta(minutes=20)]


def test_an_interval_within_the_idle_timeout_is_refused() -> None:
    with pytest.raises(ConfigError, match="never suspend"):
        check_schedule(WakeSchedule(interval=60), NEON, None, allow_always_on=False)
    with pytest.raises(ConfigError, match="never suspend"):
        check_schedule(WakeSchedule(interval=300), NEON, None, allow_always_on=False)
    assert check_schedule(WakeSchedule(interval=60), NEON, None, allow_always_on=True) == 30
    # an always-on compute has nothing to keep asleep
    assert check_schedule(WakeSchedule(interval=60), IdleTimeout(0, "--platform always-on"),
                          None, allow_always_on=False) == 30


def test_cron_waking_too_often_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"every 2\.0 min"):
        check_schedule(WakeSchedule(cron="*/2 * * * *", timezone=UTC), NEON, None,
                       allow_always_on=False)
    # jitter can bring two cron wakes closer together
    with pytest.raises(ConfigError):
        check_schedule(WakeSchedule(cron="*/10 * * * *", jitter=400, timezone=UTC), NEON,
                       None, allow_always_on=False)


def test_max_runtime_default_and_bounds() -> None:
    assert check_schedule(WakeSchedule(interval=900), NEON, None,
                          allow_always_on=False) == 450
    assert check_schedule(WakeSchedule(cron="0 3 * * 0", timezone=UTC), NEON, None,
                          allow_always_on=False) == DEFAULT_MAX_RUNTIME_CAP_S
    assert check_schedule(WakeSchedule(interval=900), NEON, 60, allow_always_on=False) == 60
    with pytest.raises(ConfigError, match="--max-runtime"):
        check_schedule(WakeSchedule(interval=900), NEON, 900, allow_always_on=False)


def test_awake_estimate_interval() -> None:
    est = WakeSchedule(interval=900).estimate(NEON, 60)
    assert est.wakes_per_day == 96
    assert est.low_s_per_day == pytest.approx(96 * 300)  # 8 h
    assert est.high_s_per_day == pytest.approx(96 * 360)
    assert est.low_share == pytest.approx(1 / 3)
    assert "8.0 h" in est.describe() and "33.3%" in est.describe()


def test_awake_estimate_cron_merges_close_wakes() -> None:
    # 03:00 and 03:02 every day: the compute is up from 03:00 to 03:07, not 2 x 5 min
    est = WakeSchedule(cron="0,2 3 * * *", timezone=UTC).estimate(
        NEON, None, now=NOW)
    assert est.wakes_per_day == pytest.approx(2)
    assert est.low_s_per_day == pytest.approx(420)


def test_interval_jitter_only_delays() -> None:
    trig = wake_trigger(WakeSchedule(interval=10, jitter=5, timezone=UTC))
    gaps = []
    prev = NOW
    for _ in range(200):
        nxt = trig.get_next_fire_time(prev, prev)
        gaps.append((nxt - prev).total_seconds())
        prev = nxt
    assert min(gaps) >= 10 and max(gaps) <= 15
    assert max(gaps) - min(gaps) > 1  # it does vary


class _FakeJob:
    def __init__(self, next_run_time: datetime) -> None:
        self.next_run_time = next_run_time


class _FakeScheduler:
    def __init__(self, next_run_time: datetime) -> None:
        self.job = _FakeJob(next_run_time)
        self.modified: list[datetime] = []

    def get_job(self, job_id: str) -> _FakeJob:
        return self.job

    def modify_job(self, job_id: str, *, next_run_time: datetime) -> None:
        self.modified.append(next_run_time)


@pytest.mark.parametrize("next_due, remaining, expected", [
    (NOW + timedelta(seconds=20), 0, NOW + timedelta(seconds=300)),  # never within the timeout
    (NOW + timedelta(seconds=400), 0, NOW + timedelta(seconds=400)),  # the retry's own time
    (NOW + timedelta(seconds=899.5), 0, None),  # gains less than a second: left alone
    (None, 0, None),  # nothing waiting
    (None, 3, NOW + timedelta(seconds=300)),  # a limit left due work
])
def test_a_run_pulls_the_next_wake_earlier_for_due_work(next_due: datetime | None, remaining: int,
                      expected: datetime | None) -> None:
    runner = _Runner(None, None, threading.Event(), NEON, True, None)  # type: ignore[arg-type]
    fake = _FakeScheduler(NOW + timedelta(seconds=900))
    runner.scheduler = fake
    report = RunReport(run_id="x", queues=["q"], remaining_due=remaining,
                       next_due_at=None if next_due is None else next_due.isoformat())
    runner._pull_earlier(report, NOW)
    assert fake.modified == ([] if expected is None else [expected])


def test_known_work_wakes_for_occurrences_and_the_safety_net_only() -> None:
    # occurrences every 60 s, --max-sleep 600: the safety net never fires
    assert known_work_wakes([60, 120, 180], 600, 0, 200) == [0, 60, 120, 180]
    # a nightly occurrence, --max-sleep 6 h: the safety net fills the gaps
    day = 86400.0
    wakes = known_work_wakes([3 * 3600.0], 6 * 3600, 0, day)
    assert wakes == [0, 3 * 3600, 9 * 3600, 15 * 3600, 21 * 3600]


def test_known_work_checks_max_sleep_not_the_tick_interval() -> None:
    idle = IdleTimeout(20, "--idle-timeout")
    ticks = WakeSchedule(interval=1.0)
    with pytest.raises(ConfigError, match="--interval"):
        check_schedule(ticks, idle, None, allow_always_on=False)
    assert check_schedule(ticks, idle, None, allow_always_on=False, policy="known-work",
                          max_sleep=600) == 300
    with pytest.raises(ConfigError, match="--max-sleep 10 s is not longer"):
        check_schedule(ticks, idle, None, allow_always_on=False, policy="known-work",
                       max_sleep=10)
    with pytest.raises(ConfigError, match="--max-runtime"):
        check_schedule(ticks, idle, 600, allow_always_on=False, policy="known-work",
                       max_sleep=600)
