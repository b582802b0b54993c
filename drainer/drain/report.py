"""The run report: what one drain did, and the fields every job log line carries."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drainer.drain.statements import Statements
    from drainer.job import Job

#: With a progress line (a terminal), remaining due jobs are counted at most this often.
PROGRESS_DUE_INTERVAL_S = 1.0


@dataclass
class RunReport:
    """What one drain did; printed as one JSON object by ``drainer run-once``."""

    run_id: str
    queues: list[str]
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    released: int = 0
    reaped: int = 0
    archived: int = 0
    vacuumed: bool = False
    lost: int = 0
    remaining_due: int = 0
    next_due_at: str | None = None
    duration_s: float = 0.0
    connected_s: float = 0.0
    deadline_hit: bool = False
    stopped_by: str | None = None
    n_dead_tup: int | None = None
    last_autovacuum: str | None = None
    #: Jobs due at the end of the run on queues no handler serves, by queue: nothing
    #: drains them (a misspelt queue name, a handler that was removed).
    unserved_due: dict[str, int] = field(default_factory=dict)
    snoozed: int = 0
    """Jobs whose handler raised Snooze: back to queued later, no attempt used."""
    discarded: int = 0
    """Of ``failed``: failed at once by the task's discard_on/retry_on."""
    followups: int = 0
    """Follow-up jobs inserted with the successes of the jobs that enqueued them."""
    paused: list[str] = field(default_factory=list)
    """Queues of this drain not claimed because an operator paused them."""
    lingered_s: float = 0.0
    """Time spent waiting in the drain's tail for retries due soon (retry_linger)."""
    rate_limited: int = 0
    """Due jobs of rate-limited queues left queued for a later slot by the last claim of
    each such queue (up to 1000 a queue): the next wake, at the slot, runs them."""
    limits: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The limits in force on the drained queues that have any, and where each came from
    (operator, setting or task): {queue: {max_running, max_running_from, rate_limit,
    rate_limit_from}}."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def finished(self) -> int:
        """Jobs whose outcome was written (succeeded, retried or failed for good)."""
        return self.succeeded + self.retried + self.failed


def job_extra(run_id: str, job: Job, **fields: Any) -> dict[str, Any]:
    """The fields every job log line carries (JSON keys, or key=value on a TTY)."""
    return {"run_id": run_id, "job_id": job.id, "queue": job.queue, "attempt": job.attempt,
            **fields}


class Progress:
    """The progress line (a terminal only), with a fresh due count at most each second."""

    def __init__(self, draw: Callable[[RunReport], None], statements: Statements,
                 report: RunReport) -> None:
        self.draw = draw
        self.q = statements
        self.report = report
        self.checked = time.monotonic()
        self.base: tuple[int, int] | None = None  # due jobs counted, claimed by then

    def show(self, *, may_count: bool) -> None:
        """Redraw; ``may_count``: the connection is free for a count (no claims ahead)."""
        now = time.monotonic()
        if now - self.checked >= PROGRESS_DUE_INTERVAL_S and may_count:
            self.checked = now
            self.base = self.q.queue_summary(self.report.queues)[0], self.report.claimed
        if self.base is not None:  # between counts: minus what was claimed since
            due, claimed = self.base
            self.report.remaining_due = max(0, due - (self.report.claimed - claimed))
        self.draw(self.report)
