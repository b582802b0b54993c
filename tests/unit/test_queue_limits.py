"""drainer.queue_limits: rate syntax, QUEUE=VALUE items, and the precedence of the limits."""

from __future__ import annotations

import pytest

from drainer.queue_limits import (
    Control,
    Rate,
    parse_rate,
    resolve,
    setting_limits,
    split_pairs,
)
from drainer.registry import Registry


@pytest.mark.parametrize(("text", "rate", "shown"), [
    ("10/m", Rate(10, 60), "10/m"), ("5/s", Rate(5, 1), "5/s"), ("100 / h", Rate(100, 3600),
                                                                   "100/h"),
    ("2/30s", Rate(2, 30), "2/30s"), ("1/500ms", Rate(1, 0.5), "1/500ms"),
    ("7/1.5s", Rate(7, 1.5), "7/1.5s"), ("3/2m", Rate(3, 120), "3/2m"),
    ("1/day", Rate(1, 86400), "1/d"),
])
def test_rates(text: str, rate: Rate, shown: str) -> None:
    assert parse_rate(text) == rate and str(rate) == shown


@pytest.mark.parametrize("text", ["", "ten/m", "10/fortnight", "0/s", "10/0s", "-1/s", "1/m/s",
                                  "4"])
def test_bad_rates(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rate(text)


def test_pairs_from_env_flags_and_pyproject() -> None:
    assert split_pairs("a=3, b=1,,") == ["a=3", "b=1"]
    assert split_pairs(["a=3,b=1", "c=2"]) == ["a=3", "b=1", "c=2"]
    assert split_pairs({"a": 3, "b": "1/s"}) == ["a=3", "b=1/s"]
    assert split_pairs(None) is None
    assert setting_limits(["a=3"], ["b=10/m"]) == ({"a": 3}, {"b": Rate(10, 60)})
    with pytest.raises(ValueError, match="named twice"):
        setting_limits(["a=3", "a=4"], None)


def test_operator_then_setting_then_task_each_limit_on_its_own() -> None:
    task_rate, set_rate, op_rate = Rate(1, 1), Rate(2, 1), Rate(3, 1)
    r = resolve(5, task_rate, None, None, None)
    assert (r.max_running, r.max_running_from, r.rate, r.rate_from) == (5, "task", task_rate,
                                                                        "task")
    r = resolve(5, task_rate, 4, set_rate, None)
    assert (r.max_running_from, r.rate_from) == ("setting", "setting")
    r = resolve(5, task_rate, 4, set_rate, Control(max_running=1))
    assert (r.max_running, r.max_running_from, r.rate, r.rate_from) == (1, "operator",
                                                                        set_rate, "setting")
    r = resolve(None, None, None, None, Control(rate=op_rate))
    assert (r.max_running, r.rate, r.rate_from) == (None, op_rate, "operator")
    r = resolve(None, None, None, None, None)
    assert r.as_dict() == {"max_running": None, "max_running_from": None, "rate_limit": None,
                           "rate_limit_from": None}


def test_task_rate_limit_is_checked_when_the_app_loads() -> None:
    reg = Registry()
    with pytest.raises(ValueError, match="task 'q': not a rate limit"):
        reg.task("q", rate_limit="often")
    with pytest.raises(ValueError, match="rate_limit does not apply to transaction=True"):
        reg.task("q", rate_limit="1/s", transaction=True)

    @reg.task("ok", rate_limit="10/m")
    def ok(job: object) -> None:
        pass

    assert reg.tasks["ok"].rate_limit == Rate(10, 60)
