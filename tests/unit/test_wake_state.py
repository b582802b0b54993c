"""WakeState.decide: each reason to wake under --wake-policy known-work, and each skip."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from drainer.drain import RunReport
from drainer.errors import ConfigError
from drainer.scheduler import WakeSchedule
from drainer.wake_schedule import check_schedule
from drainer.waking import IdleTimeout, WakeState

T0 = 1_800_000_000.0


def report(remaining_due: int = 0, next_due_at: float | None = None) -> RunReport:
    r = RunReport(run_id="x", queues=["q"])
    r.remaining_due = remaining_due
    if next_due_at is not None:
        r.next_due_at = datetime.fromtimestamp(next_due_at, timezone.utc).isoformat()
    return r


def done(state: WakeState, at: float, **kw: object) -> None:
    state.run_ended(report(**kw), state.run_started(), at)  # type: ignore[arg-type]


def test_a_new_process_drains_in_full_then_sleeps() -> None:
    s = WakeState(idle_s=20, max_sleep_s=3600)
    assert s.decide(T0) == (True, "start: one full drain (a new process knows nothing)")
    done(s, T0)
    wake, why = s.decide(T0 + 100)
    assert not wake and why.startswith("no known work")


def test_a_failed_first_run_is_retried_at_the_next_tick() -> None:
    s = WakeState(idle_s=20, max_sleep_s=3600)
    s.run_started()
    s.run_failed(T0)
    assert s.decide(T0 + 1)[0] and "failed" in s.decide(T0 + 1)[1]


def test_trigger_since_the_last_complete_drain() -> None:
    s = WakeState(idle_s=20, max_sleep_s=3600)
    done(s, T0)
    s.note_trigger()
    wake, why = s.decide(T0 + 1)
    assert wake and why.startswith("trigger: 1 trigger")
    # a run that started after the trigger serves it
    done(s, T0 + 2)
    assert not s.decide(T0 + 3)[0]


def test_a_trigger_during_a_run_is_not_served_by_it() -> None:
    s = WakeState(idle_s=20, max_sleep_s=3600)
    done(s, T0)
    seen = s.run_started()
    s.note_trigger()  # arrives while the run is going: its job may be after the last claim
    s.run_ended(report(), seen, T0 + 5)
    assert s.decide(T0 + 6) == (True, "trigger: 1 trigger since the last complete drain")


def test_a_failed_run_keeps_the_trigger_pending() -> None:
    s = WakeState(idle_s=20, max_sleep_s=3600)
    done(s, T0)
    s.note_trigger()
    s.run_started()
    s.run_failed(T0 + 1)
    assert s.decide(T0 + 2)[1].startswith("trigger")


def test_due_work_left() -> None:
    s = WakeState(idle_s=20, max_sleep_s=3600)
    done(s, T0, remaining_due=7)
    assert s.decide(T0 + 0.5) == (True, "due work left: the last run stopped with 7 due jobs")


def test_a_due_retry_waits_for_the_idle_timeout_after_the_last_run() -> None:
    s = WakeState(idle_s=20, max_sleep_s=3600)
    done(s, T0, next_due_at=T0 + 5)
    wake, why = s.decide(T0 + 4)  # not due yet
    assert not wake and "next job due" in why
    wake, why = s.decide(T0 + 6)  # due, but the compute went quiet only 6 s ago
    assert not wake and "held until" in why
    wake, why = s.decide(T0 + 19.9)
    assert not wake
    wake, why = s.decide(T0 + 20)
    assert wake and why.startswith("retry due")


def test_a_retry_due_after_the_idle_timeout_wakes_when_due() -> None:
    s = WakeState(idle_s=20, max_sleep_s=3600)
    done(s, T0, next_due_at=T0 + 100)
    assert not s.decide(T0 + 99)[0]
    assert s.decide(T0 + 100)[0]


def test_safety_net() -> None:
    s = WakeState(idle_s=20, max_sleep_s=600)
    done(s, T0)
    assert not s.decide(T0 + 599)[0]
    wake, why = s.decide(T0 + 600)
    assert wake and why.startswith("safety net: 10.0 min since the last run")


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
