"""Which queues a run drains, and under which limits (the operator's, the settings', the
tasks'; see :mod:`drainer.queue_limits` for the order they apply in)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from drainer import queue_limits
from drainer.app import load_app
from drainer.errors import ConfigError

if TYPE_CHECKING:
    from drainer.drain.report import RunReport
    from drainer.registry import Registry, Task
    from drainer.settings import Settings

logger = logging.getLogger("drainer.drain")


@dataclass(frozen=True)
class SettingLimits:
    """--max-running / --rate-limit by queue."""

    max_running: dict[str, int] = field(default_factory=dict)
    rates: dict[str, queue_limits.Rate] = field(default_factory=dict)


def resolve_queues(settings: Settings, registry: Registry) -> list[str]:
    """The queues this drain claims: those with handlers, or the --queue subset of them."""
    if settings.app:
        load_app(settings.app)
    known = registry.queues()
    if not known:
        raise ConfigError(
            "no handlers registered: name the module with your @task functions in "
            "DRAINER_APP or --app"
        )
    if not settings.queues:
        return known
    missing = [q for q in settings.queues if q not in registry.tasks]
    if missing:
        raise ConfigError(
            f"no handler for queue {', '.join(map(repr, missing))} (handlers exist for: "
            f"{', '.join(known)})"
        )
    return list(dict.fromkeys(settings.queues))


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


def warn_unserved(report: RunReport, served: list[str]) -> None:
    """One warning line for due jobs that no handler of this app will ever claim."""
    if not report.unserved_due:
        return
    jobs = sum(report.unserved_due.values())
    listed = ", ".join(f"{q!r} ({n})" for q, n in report.unserved_due.items())
    logger.warning("%d due job(s) on queues no handler serves: %s; nothing drains them "
                   "(a misspelt queue name? handlers exist for: %s)", jobs, listed,
                   ", ".join(served),
                   extra={"run_id": report.run_id, "unserved_due": report.unserved_due})
