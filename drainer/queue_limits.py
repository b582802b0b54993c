"""Per-queue limits: at most N running (``max_running``) and at most N claims
per period (``rate_limit``), from three places, the first that sets one wins:

1. the operator's row in ``<table>_queues`` (``drainer limit QUEUE --max-running N
   --rate 10/m``): changed during an incident without a deploy, read once per run;
2. the settings (``DRAINER_MAX_RUNNING="emails=3,slow=1"``, ``--max-running emails=3``,
   ``DRAINER_RATE_LIMIT``, ``--rate-limit``): the deployment's;
3. the task (``@task(max_running=3, rate_limit="10/m")``): the code's default.

Each limit is resolved on its own (an operator's rate limit leaves the task's max_running
in force). Pure: nothing here connects.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from drainer.errors import ConfigError

_RATE = re.compile(r"^\s*(?P<count>\d+)\s*/\s*(?P<n>\d+(?:\.\d+)?)?\s*"
                   r"(?P<unit>ms|s|sec|second|m|min|minute|h|hour|d|day)?\s*$", re.I)
_UNIT_S = {"ms": 0.001, "s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0,
           "minute": 60.0, "h": 3600.0, "hour": 3600.0, "d": 86400.0, "day": 86400.0}

#: The largest count of a rate limit: the claim keeps one entry per claim of the window
#: in the queue's control row, never more than this many jobs' worth.
MAX_RATE_COUNT = 1_000_000

OPERATOR = "operator"
SETTING = "setting"
TASK = "task"


@dataclass(frozen=True)
class Rate:
    """At most ``count`` jobs of a queue claimed in any ``period`` seconds."""

    count: int
    period: float

    def __str__(self) -> str:
        return f"{self.count}/{_period_text(self.period)}"


def _period_text(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return unit if n == 1 else f"{n}{unit}"
    if seconds < 1 and round(seconds * 1000, 6) == int(seconds * 1000):
        return f"{int(seconds * 1000)}ms"
    return f"{seconds:g}s"


def parse_rate(text: Any) -> Rate:
    """``"10/m"``, ``"100/s"``, ``"5/30s"``, ``"1/500ms"``, ``"1000/h"``, or a Rate."""
    if isinstance(text, Rate):
        return text
    m = _RATE.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"not a rate limit: {text!r} (use COUNT/PERIOD: 10/m, 100/s, "
                         "5/30s, 1000/h)")
    count = int(m["count"])
    period = float(m["n"] or 1) * _UNIT_S[(m["unit"] or "s").lower()]
    if not 1 <= count <= MAX_RATE_COUNT:
        raise ValueError(f"rate limit {text!r}: the count must be 1 to {MAX_RATE_COUNT}")
    if period <= 0:
        raise ValueError(f"rate limit {text!r}: the period must be positive")
    return Rate(count, period)


def parse_max_running(text: Any) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"max_running must be a whole number, not {text!r}") from None
    if value < 1:
        raise ValueError(f"max_running must be at least 1, not {value}")
    return value


def split_pairs(value: Any) -> Any:
    """``"a=3, b=1"``, ``["a=3,b=1", "c=2"]`` (repeated flags) or ``{"a": 3}`` (pyproject)
    -> ``["a=3", "b=1", ...]``; None unchanged."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return [f"{k}={v}" for k, v in value.items()]
    items = [value] if isinstance(value, str) else list(value)
    out = [p.strip() for item in items for p in str(item).split(",") if p.strip()]
    return out or None


def pairs(items: Iterable[str] | None, what: str) -> dict[str, str]:
    """``["a=3", "b=1"]`` -> ``{"a": "3", "b": "1"}``; ValueError on a malformed item."""
    out: dict[str, str] = {}
    for item in items or ():
        queue, sep, value = item.partition("=")
        if not sep or not queue.strip() or not value.strip():
            raise ValueError(f"{what}: {item!r} is not QUEUE=VALUE (e.g. emails=3)")
        if queue.strip() in out:
            raise ValueError(f"{what}: queue {queue.strip()!r} is named twice")
        out[queue.strip()] = value.strip()
    return out


def check_max_running(items: list[str] | None) -> list[str] | None:
    """The settings validator of ``max_running``: every item QUEUE=N with N >= 1."""
    for value in pairs(items, "max_running").values():
        parse_max_running(value)
    return items


def check_rate_limit(items: list[str] | None) -> list[str] | None:
    """The settings validator of ``rate_limit``: every item QUEUE=COUNT/PERIOD."""
    for value in pairs(items, "rate_limit").values():
        parse_rate(value)
    return items


@dataclass(frozen=True)
class Control:
    """An operator's limits of one queue, as the run's first statement read them."""

    max_running: int | None = None
    rate: Rate | None = None


@dataclass(frozen=True)
class Resolved:
    """A queue's limits in force for one run, and where each came from."""

    max_running: int | None
    max_running_from: str | None
    rate: Rate | None
    rate_from: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"max_running": self.max_running, "max_running_from": self.max_running_from,
                "rate_limit": None if self.rate is None else str(self.rate),
                "rate_limit_from": self.rate_from}


def resolve(task_max_running: int | None, task_rate: Rate | None,
            setting_max_running: int | None, setting_rate: Rate | None,
            control: Control | None) -> Resolved:
    """Operator, then setting, then task: the first that sets a limit wins, per limit."""
    control = control or Control()
    mr, mr_from = next(((v, src) for v, src in ((control.max_running, OPERATOR),
                                                (setting_max_running, SETTING),
                                                (task_max_running, TASK)) if v is not None),
                       (None, None))
    rate, rate_from = next(((v, src) for v, src in ((control.rate, OPERATOR),
                                                    (setting_rate, SETTING),
                                                    (task_rate, TASK)) if v is not None),
                           (None, None))
    return Resolved(mr, mr_from, rate, rate_from)


def setting_limits(max_running: list[str] | None, rate_limit: list[str] | None
                   ) -> tuple[dict[str, int], dict[str, Rate]]:
    """The settings' per-queue limits as dicts (already validated by Settings)."""
    return ({q: parse_max_running(v) for q, v in pairs(max_running, "max_running").items()},
            {q: parse_rate(v) for q, v in pairs(rate_limit, "rate_limit").items()})


def check_setting_queues(names: Iterable[str], known: Mapping[str, Any],
                         transaction: Iterable[str], what: str) -> None:
    """A setting that names a queue without a handler (a misspelling), or a transaction-mode
    queue (its claim cannot be limited), is a ConfigError."""
    names = list(names)
    missing = [n for n in names if n not in known]
    if missing:
        raise ConfigError(f"{what} names queue {', '.join(map(repr, missing))} with no "
                          f"handler (handlers exist for: {', '.join(known)})")
    tx = [n for n in names if n in set(transaction)]
    if tx:
        raise ConfigError(f"{what} does not apply to transaction=True tasks: "
                          f"{', '.join(map(repr, tx))}")


def with_limits(task: Any, resolved: Resolved) -> Any:
    """The task as the run claims it: its limits replaced by those in force."""
    if task.max_running == resolved.max_running and task.rate_limit == resolved.rate:
        return task
    return dataclasses.replace(task, max_running=resolved.max_running,
                               rate_limit=resolved.rate)
