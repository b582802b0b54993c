"""Jobs claimed and not handed to a handler yet: their leases are the run's from the claim
on (the heartbeat extends them), they start as handler slots free, and they are given back
without using up an attempt when the run stops before they start."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from drainer.db.loaders import UndecodablePayload
from drainer.drain.calls import Running, make_running
from drainer.drain.outcomes import undecodable

if TYPE_CHECKING:
    from drainer.drain.claims import Batch
    from drainer.drain.clock import BatchClock
    from drainer.drain.handlers import Handlers
    from drainer.drain.outcomes import Outcomes
    from drainer.drain.report import RunReport
    from drainer.drain.statements import Statements
    from drainer.job import Job
    from drainer.registry import Task

logger = logging.getLogger("drainer.drain")


class Pending:
    """The claimed jobs waiting for a handler, in claim order."""

    def __init__(self, handlers: Handlers, outcomes: Outcomes, lease: Callable[[Task], float],
                 extend: Callable[[Job, float | None], bool]) -> None:
        self.handlers = handlers
        self.outcomes = outcomes
        self.lease = lease
        self.extend = extend  # what job.extend() calls
        self.jobs: deque[Running] = deque()

    def __len__(self) -> int:
        return len(self.jobs)

    def __bool__(self) -> bool:
        return bool(self.jobs)

    def __iter__(self) -> Iterator[Running]:
        return iter(self.jobs)

    def take(self, batch: Batch) -> None:
        """Claimed rows become jobs waiting to start; a row whose payload could not be
        decoded fails at once, alone (the rest of the batch runs)."""
        extend, jobs, handlers = self.extend, self.jobs, self.handlers
        for task, row in batch:
            r = make_running(task, row, self.lease(task), handlers.timeout(task))
            if isinstance(row.payload, UndecodablePayload):
                poison = undecodable(r)
                if poison is not None:
                    self.outcomes.add(poison)
                    continue
            r.job._extend = extend
            jobs.append(r)

    def full(self) -> bool:
        """No slot for the next job waiting (or none waits)."""
        return not self.jobs or self.handlers.in_flight() >= self.handlers.slots(self.jobs[0])

    def start(self, clock: BatchClock) -> None:
        """Hand over what the handlers' slots take now."""
        starting: list[Running] = []
        jobs, slots = self.jobs, self.handlers.slots
        busy = self.handlers.in_flight()
        while jobs and busy + len(starting) < slots(jobs[0]):
            starting.append(jobs.popleft())
        if starting:
            self.handlers.ready(starting)  # the threads' start is not the batch's time
            clock.start(time.monotonic(), len(starting))
            self.handlers.start_many(starting)

    def release(self, q: Statements, report: RunReport, *, take_back: bool) -> None:
        """Give back the jobs that did not start (with ``take_back``, also those queued to
        handler threads but not picked up yet), without using up an attempt."""
        jobs = list(self.jobs)
        self.jobs.clear()
        if take_back:
            jobs.extend(self.handlers.take_back())
        if not jobs:
            return
        released = q.release_many([r.job.id for r in jobs], [r.job.fence for r in jobs])
        report.released += len(released)
        logger.info("released %d claimed jobs that had not started", len(released),
                    extra={"run_id": report.run_id})
