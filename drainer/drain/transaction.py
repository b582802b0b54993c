"""Transaction mode: claim, run and record a batch inside one transaction (the row lock held
for the whole job, the handler's writes in the job's own savepoint)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from drainer.drain.handlers import Outcome, Running, call
from drainer.drain.outcomes import Outcomes

if TYPE_CHECKING:
    import psycopg

    from drainer.db import ClaimedRow, Queries
    from drainer.registry import Task


class _HandlerFailed(Exception):
    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome


def run_batch(conn: psycopg.Connection[Any], queries: Queries, outcomes: Outcomes,
              task: Task, size: int, lease: float,
              make: Callable[[Task, ClaimedRow], Running]) -> int:
    """Claim up to ``size`` jobs of ``task``'s queue and run them one by one, each in a
    savepoint rolled back when its handler fails; returns how many were claimed."""
    with conn.transaction():
        rows = queries.claim_batch(task.queue, size, lease)
        for row in rows:
            r = make(task, row)
            r.job.conn = conn
            r.job._extend = None  # the claim's transaction holds the row lock
            try:
                with conn.transaction():
                    outcome = call(task, r.job)
                    if not outcome.ok:
                        raise _HandlerFailed(outcome)
            except _HandlerFailed as failed:
                outcomes.add(failed.outcome)
            else:
                outcomes.add(outcome)
            finally:
                r.job.conn = None
        outcomes.write()
    return len(rows)
