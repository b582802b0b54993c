"""What stops a drain (a stop request, the deadline, --max-jobs: :class:`Limits`, questions
only; the loop records the answer with :func:`record`, in one place), and the queues' limits
in force for a run (the operator's, the settings', the tasks': :func:`limited_tasks`; see
:mod:`drainer.queue_limits` for the order they apply in).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from drainer import queue_limits
from drainer.drain.report import RunReport

if TYPE_CHECKING:
    from drainer.registry import Registry, Task
    from drainer.settings import Settings

logger = logging.getLogger("drainer.drain")

#: ``stopped_by`` values, in the order they are checked.
SIGNAL = "signal"
MAX_RUNTIME = "max_runtime"
MAX_JOBS = "max_jobs"


@dataclass(frozen=True)
class Limits:
    """The limits of one drain. ``deadline`` is a ``time.monotonic()`` instant."""

    stop: threading.Event
    deadline: float | None = None
    max_jobs: int | None = None

    def stopped_by(self, claimed: int, now: float | None = None) -> str | None:
        """Which limit says stop claiming now (None: none does)."""
        if self.stop.is_set():
            return SIGNAL
        if self.deadline is not None and (time.monotonic() if now is None else now) \
                >= self.deadline:
            return MAX_RUNTIME
        if self.max_jobs is not None and claimed >= self.max_jobs:
            return MAX_JOBS
        return None

    def must_release(self, now: float | None = None) -> bool:
        """Shutdown or the deadline: claimed jobs that have not started go back at once.

        (--max-jobs only stops claiming: what was claimed within the limit still runs.)
        """
        return self.stop.is_set() or (self.deadline is not None and (
            time.monotonic() if now is None else now) >= self.deadline)


def record(report: RunReport, stopped_by: str | None) -> None:
    """Note the first limit that stopped the run (a later one does not replace it)."""
    if stopped_by is None:
        return
    report.stopped_by = report.stopped_by or stopped_by
    if stopped_by != SIGNAL:
        report.deadline_hit = True


@dataclass(frozen=True)
class SettingLimits:
    """--max-running / --rate-limit by queue."""

    max_running: dict[str, int] = field(default_factory=dict)
    rates: dict[str, queue_limits.Rate] = field(default_factory=dict)


def setting_limits(settings: Settings, registry: Registry) -> SettingLimits:
    """--max-running / --rate-limit by queue; a queue without a handler (a misspelling) or
    in transaction mode is a ConfigError, before anything connects."""
    max_running, rates = queue_limits.setting_limits(settings.max_running, settings.rate_limit)
    transactional = [name for name, t in registry.tasks.items() if t.transaction]
    queue_limits.check_setting_queues(max_running, registry.tasks, transactional,
                                      "--max-running / DRAINER_MAX_RUNNING")
    queue_limits.check_setting_queues(rates, registry.tasks, transactional,
                                      "--rate-limit / DRAINER_RATE_LIMIT")
    return SettingLimits(max_running, rates)


def limited_tasks(registry: Registry, report: RunReport, limits: SettingLimits,
                  controls: dict[str, queue_limits.Control]) -> dict[str, Task]:
    """The drained queues' tasks with the limits in force for this run, noted in the
    report. An operator's limit on a transaction-mode queue cannot apply: a warning."""
    tasks = dict(registry.tasks)
    for name in report.queues:
        task = tasks[name]
        control = controls.get(name)
        if control is None and task.max_running is None and task.rate_limit is None \
                and name not in limits.max_running and name not in limits.rates:
            continue  # no limit from anyone: the task as it is (most queues; 300 add up)
        if task.transaction:
            if control is not None:
                logger.warning("queue %s: `drainer limit` does not apply to transaction=True "
                               "tasks; ignored", name, extra={"run_id": report.run_id})
            continue
        resolved = queue_limits.resolve(task.max_running, task.rate_limit,
                                        limits.max_running.get(name), limits.rates.get(name),
                                        control)
        tasks[name] = queue_limits.with_limits(task, resolved)
        if resolved.max_running is not None or resolved.rate is not None:
            report.limits[name] = resolved.as_dict()
    return tasks
