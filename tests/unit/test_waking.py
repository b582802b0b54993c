"""drainer.waking: the idle timeout, the polling rule, awake estimates, the known-work policy."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from drainer.drain import RunReport
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


def _report(remaining_due: int = 0, next_due_at: str | None = None) -> RunReport:
    return RunReport(run_id="x", queues=["q"], remaining_due=remaining_due,
                     next_due_at=next_due_at)


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
            state.run_ended(_report(), seen, clock.advance(2.0))  # a 2 s drain
    times = [at for at, _ in wakes]
    assert wakes[:3] == [(0, "start"), (3610, "safety net"), (5000, "trigger")]
    # then one wake per --max-sleep after the last run ended: 8610, 12220, ... 84420
    assert times[3:5] == [8610, 12220] and times[-1] == 84420
    assert {why for _, why in wakes[3:]} == {"safety net"} and len(wakes) == 3 + 22


def test_known_work_holds_a_due_retry_until_the_idle_timeout_has_passed() -> None:
    from datetime import datetime, timezone

    clock = Clock()
    state = WakeState(idle_s=300, max_sleep_s=3600)
    due = datetime.fromtimestamp(T0 + 60, timezone.utc).isoformat()
    state.run_ended(_report(next_due_at=due), state.run_started(), clock())
    clock.advance(120)
    wake, why = state.decide(clock())
    assert not wake and "held until" in why
    clock.advance(180)
    wake, why = state.decide(clock())  # 300 s after the run: the compute went quiet then
    assert wake and why.startswith("retry due")


def test_a_scheduled_tick_reads_the_injected_clock() -> None:
    """drainer.scheduler's tick asks the policy with its clock: before --max-sleep it does
    not even try to run (no settings are needed); after it, it tries (and fails here)."""
    import threading

    from drainer.scheduler import _Runner

    clock = Clock()
    runner = _Runner(None, None, threading.Event(), NEON, False, None,  # type: ignore[arg-type]
                     policy="known-work", max_sleep=3600, clock=clock)
    runner.state.run_ended(_report(), runner.state.run_started(), clock())
    clock.advance(3599)
    runner()
    assert runner.runs == 0
    clock.advance(1)
    runner()  # the safety net: a run starts (run_once(None) fails, which is logged)
    assert runner.runs == 1 and runner.state.last_end == clock()
