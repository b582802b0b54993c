"""drainer.waking: the idle timeout, the polling rule, awake estimates, and the known-work
policy (WakeState): each reason to wake and each skip."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from drainer.drain.report import RunReport
from drainer.errors import ConfigError
from drainer.waking import (
    ASSUMED_IDLE_TIMEOUT_S,
    DEFAULT_MAX_RUNTIME_CAP_S,
    IdleTimeout,
    WakeState,
    covered_seconds,
    estimate_from_wakes,
    estimate_interval,
    idle_timeout_of,
    max_runtime_for,
    polls_faster_than_idle,
)

NEON = IdleTimeout(300.0, "--platform neon")
NEVER = IdleTimeout(0.0, "--platform always-on")
T0 = 1_800_000_000.0


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> float:
        self.t += s
        return self.t


def settings(**kw: Any) -> Any:
    return SimpleNamespace(**{"idle_timeout": None, "platform": None, **kw})


def test_idle_timeout_is_the_flag_then_the_platform_then_assumed() -> None:
    assert idle_timeout_of(settings(idle_timeout=42.0, platform="neon")) == IdleTimeout(
        42.0, "--idle-timeout")
    neon = idle_timeout_of(settings(platform="neon"))
    assert neon.source == "--platform neon" and not neon.assumed
    guess = idle_timeout_of(settings())
    assert guess.seconds == ASSUMED_IDLE_TIMEOUT_S and guess.assumed
    assert IdleTimeout(0, "x").never_suspends and not NEON.never_suspends


@pytest.mark.parametrize("period, inclusive, keeps", [
    (60, False, True), (299.9, False, True), (300, False, False), (300, True, True),
    (301, True, False), (3600, False, False),
])
def test_polls_faster_than_idle(period: float, inclusive: bool, keeps: bool) -> None:
    assert polls_faster_than_idle(period, NEON, inclusive=inclusive) is keeps


def test_a_compute_that_never_suspends_is_kept_awake_by_anything() -> None:
    assert polls_faster_than_idle(86400, NEVER)
    assert polls_faster_than_idle(86400, NEVER, inclusive=True)


def test_max_runtime_for_a_gap() -> None:
    assert max_runtime_for(900, None, "x") == 450
    assert max_runtime_for(1.0, None, "x") == 1.0  # at least a second
    assert max_runtime_for(7 * 86400, None, "x") == DEFAULT_MAX_RUNTIME_CAP_S
    assert max_runtime_for(900, 60, "x") == 60
    with pytest.raises(ConfigError, match=r"--max-runtime 15\.0 min must be shorter than the gap"):
        max_runtime_for(900, 900, "the gap")


def test_covered_seconds_merges_overlapping_wakes_and_clips() -> None:
    assert covered_seconds([0, 100, 1000], 300, 0, 2000) == 400 + 300
    assert covered_seconds([-200, 1900], 300, 0, 2000) == 100 + 100


def test_estimates() -> None:
    est = estimate_interval(900, 0, NEON, 60)
    assert est.wakes_per_day == 96 and est.low_s_per_day == pytest.approx(96 * 300)
    assert est.high_s_per_day == pytest.approx(96 * 360)
    assert estimate_interval(60, 0, NEON, None).low_share == 1.0
    day = estimate_from_wakes([T0 + 3600.0], T0, 86400, NEON, None)
    assert day.wakes_per_day == 1 and day.low_s_per_day == 300 and day.high_s_per_day is None
    assert "never suspends" in estimate_interval(900, 0, NEVER, None).describe()


def report(remaining_due: int = 0, next_due_at: float | None = None) -> RunReport:
    return RunReport(run_id="x", queues=["q"], remaining_due=remaining_due,
                     next_due_at=None if next_due_at is None
                     else datetime.fromtimestamp(next_due_at, timezone.utc).isoformat())


def done(state: WakeState, at: float, **kw: Any) -> None:
    state.run_ended(report(**kw), state.run_started(), at)


def test_known_work_with_an_injected_clock() -> None:
    """A day of ticks every 10 s on a clock moved by hand, no work: the policy wakes at
    start, for the one trigger, and otherwise only for the --max-sleep safety net."""
    clock = Clock()
    state = WakeState(idle_s=300, max_sleep_s=3600)
    wakes: list[tuple[float, str]] = []
    for i in range(8640):
        clock.t = T0 + 10 * i
        if i == 500:
            state.note_trigger()
        wake, why = state.decide(clock())
        if wake:
            wakes.append((clock() - T0, why.split(":")[0]))
            seen = state.run_started()
            state.run_ended(report(), seen, clock.advance(2.0))  # a 2 s drain
    times = [at for at, _ in wakes]
    assert wakes[:3] == [(0, "start"), (3610, "safety net"), (5000, "trigger")]
    # then one wake per --max-sleep after the last run ended: 8610, 12220, ... 84420
    assert times[3:5] == [8610, 12220] and times[-1] == 84420
    assert {why for _, why in wakes[3:]} == {"safety net"} and len(wakes) == 3 + 22


def test_a_scheduled_tick_reads_the_injected_clock() -> None:
    """drainer.scheduler's tick asks the policy with its clock: before --max-sleep it does
    not even try to run (no settings are needed); after it, it tries (and fails here)."""
    import threading

    from drainer.scheduler import _Runner

    clock = Clock()
    runner = _Runner(None, None, threading.Event(), NEON, False, None,  # type: ignore[arg-type]
                     policy="known-work", max_sleep=3600, clock=clock)
    runner.state.run_ended(report(), runner.state.run_started(), clock())
    clock.advance(3599)
    runner()
    assert runner.runs == 0
    clock.advance(1)
    runner()  # the safety net: a run starts (run_once(None) fails, which is logged)
    assert runner.runs == 1 and runner.state.last_end == clock()


# -- WakeState.decide: each reason to wake under --wake-policy known-work, and each skip


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


def test_a_retry_due_while_the_compute_is_still_up_wakes_when_due() -> None:
    """Not held until the idle timeout after the last run: that would let the compute
    suspend and resume it for the retry (a resume, the same awake time)."""
    s = WakeState(idle_s=20, max_sleep_s=3600)
    done(s, T0, next_due_at=T0 + 5)
    wake, why = s.decide(T0 + 4)  # not due yet
    assert not wake and "next job due" in why
    wake, why = s.decide(T0 + 5)
    assert wake and why.startswith("retry due") and "still up: no resume" in why


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
