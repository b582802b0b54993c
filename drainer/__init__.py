"""drainer: run the jobs in a PostgreSQL table, then let the database suspend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drainer.job import Job, JobCancelled, Retry, Snooze
from drainer.registry import Registry, Task, default_registry, task

__all__ = [
    "Job",
    "JobCancelled",
    "Registry",
    "Retry",
    "RunReport",
    "Settings",
    "Snooze",
    "Task",
    "default_registry",
    "enqueue",
    "enqueue_many",
    "load_settings",
    "recurring",
    "run_once",
    "task",
]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from drainer.drain import RunReport, run_once
    from drainer.producer import enqueue, enqueue_many
    from drainer.registry import recurring  # at run time the module, made callable
    from drainer.settings import Settings, load_settings

# Heavy parts (psycopg, pydantic) load on first use: `from drainer import task` in an app
# module stays cheap.
_LAZY = {
    "run_once": "drainer.drain",
    "RunReport": "drainer.drain",
    "enqueue": "drainer.producer",
    "enqueue_many": "drainer.producer",
    "Settings": "drainer.settings",
    "load_settings": "drainer.settings",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'drainer' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
