"""Job control's Python surface: Snooze, Retry, @task options, results."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

import drainer
from drainer.drain.calls import ResultError, call, result_json
from drainer.job import Job
from drainer.registry import Registry


def job(queue: str = "q") -> Job:
    return Job(1, queue, {}, 1, 5, None)


def test_snooze_and_retry_validate() -> None:
    assert drainer.Snooze(5).seconds == 5.0
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError):
            drainer.Snooze(bad)
    with pytest.raises(ValueError):
        drainer.Retry(base=0)
    with pytest.raises(ValueError):
        drainer.Retry(max_attempts=0)
    for kw in ({"base": float("nan")}, {"cap": float("nan")}, {"cap": -1.0},
               {"jitter": float("nan")}, {"max_attempts": 2**40}):
        with pytest.raises(ValueError):
            drainer.Retry(**kw)  # type: ignore[arg-type]
    drainer.Retry(base=1e308, cap=float("inf"))  # a wait at run_at's ceiling (fail_many)
    with pytest.raises(drainer.Snooze):
        job().snooze(3)


def test_task_options_are_checked() -> None:
    r = Registry()
    with pytest.raises(ValueError):
        r.task("a", max_running=0)
    with pytest.raises(ValueError):
        r.task("a", max_running=2, transaction=True)
    with pytest.raises(TypeError):
        r.task("a", discard_on=("not a type",))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        r.task("a", retry={"base": 1})  # type: ignore[arg-type]

    @r.task("b", retry=drainer.Retry(max_attempts=4), retry_on=TimeoutError,
            discard_on=(KeyError,))
    def b(j: Job) -> None: ...

    t = r.tasks["b"]
    assert t.max_attempts == 4 and t.attempts_limit == 4
    assert t.discards(KeyError()) and t.discards(ValueError())
    assert not t.discards(TimeoutError())


def test_outcomes_of_a_handler() -> None:
    r = Registry()

    @r.task("s")
    def s(j: Job) -> Any:
        if j.payload.get("snooze"):
            raise drainer.Snooze(7)
        return j.payload.get("value")

    t = r.tasks["s"]
    j = job("s")
    j.payload = {"snooze": True}
    o = call(t, j)
    assert (o.ok, o.snooze) == (False, 7.0)
    j.payload = {"value": {"a": 1}}
    assert call(t, j).result == '{"a": 1}'
    j.payload = {"value": "x" * 100}
    o = call(t, j, result_max_bytes=50)
    assert not o.ok and o.error is not None and o.error.startswith("ResultError:")
    with pytest.raises(ResultError):
        result_json(float("nan"), 100)
    with pytest.raises(ResultError):
        result_json("\x00", 100)


def test_follow_ups_are_recorded_and_checked() -> None:
    j = job()
    j.enqueue("next", {"n": 1}, priority=3)
    assert [(f.queue, f.payload, f.priority) for f in j.followups] == [("next", {"n": 1}, 3)]
    with pytest.raises(TypeError):
        j.enqueue("next", {"when": datetime.now()})
    with pytest.raises(ValueError):
        j.enqueue("next", {}, run_at=datetime.now())
