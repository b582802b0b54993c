"""Handlers for the multi-queue benchmark: no-op handlers on ``bench0`` .. ``bench4``."""

from __future__ import annotations

from drainer import Job, task

QUEUES = [f"bench{n}" for n in range(5)]


def _register(queue: str) -> None:
    @task(queue)
    def noop(job: Job) -> None:
        pass


for _queue in QUEUES:
    _register(_queue)
