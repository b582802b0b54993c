"""The run report: what one drain did (:class:`RunReport`), each job's outcome as written,
counted and logged one line a job (:class:`Tally`), the fields every job log line carries,
and the progress line's counts."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drainer.drain.calls import Outcome
    from drainer.drain.statements import Statements
    from drainer.job import Job

logger = logging.getLogger("drainer.drain")

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
    timeout_over_max_runtime: dict[str, float] = field(default_factory=dict)
    """Queues whose handler time limit (the task's timeout, else --job-timeout) exceeds
    --max-runtime, with that limit in seconds: a job that needs that long can never finish
    within a run."""
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


class Tally:
    """The outcomes of one run, as written."""

    def __init__(self, report: RunReport) -> None:
        self.report = report
        #: Told each job's outcome (succeeded, retried, failed, snoozed, lost) once it is
        #: known: the job's OpenTelemetry span ends then (drainer.otel).
        self.on_outcome: Callable[[Job, str], None] | None = None
        self.followups_due = False  # follow-ups due now on the drained queues were inserted
        self.retry_times: list[datetime] = []  # run_at of this run's retries and snoozes

    def succeeded(self, buf: Sequence[Outcome], ids: set[int]) -> None:
        """Count (and at debug level log) the successes written; the rest were lost."""
        report = self.report
        report.succeeded += len(ids)
        if self.on_outcome is not None:
            for o in buf:
                if o.job.id in ids:
                    self.on_outcome(o.job, "succeeded")
        now = datetime.now(timezone.utc)
        for o in buf:
            if o.job.followups and o.job.id in ids:
                report.followups += len(o.job.followups)
                if any(f.queue in report.queues and (f.run_at is None or f.run_at <= now)
                       for f in o.job.followups):
                    self.followups_due = True
        if logger.isEnabledFor(logging.DEBUG):
            for o in buf:
                if o.job.id in ids:
                    logger.debug("job %d succeeded", o.job.id, extra=job_extra(
                        report.run_id, o.job, outcome="succeeded", duration_s=o.duration_s))
        self._lost(buf, ids)

    def failed(self, buf: Sequence[Outcome], rows: list[tuple[int, str, datetime]]) -> None:
        """Failures written: (id, status, run_at) each, 'failed' for good or 'queued' again."""
        by_id = {o.job.id: o for o in buf}
        for job_id, status, run_at in rows:
            o = by_id[job_id]
            gone = status == "failed"
            if gone:
                self.report.failed += 1
                if o.discard:
                    self.report.discarded += 1
            else:
                self.report.retried += 1
                self.retry_times.append(run_at)
            if self.on_outcome is not None:
                self.on_outcome(o.job, "failed" if gone else "retried")
            first = (o.error or "").split("\n", 1)[0]
            logger.info("job %d failed (attempt %d/%d): %s; %s", job_id, o.job.attempt,
                        o.job.max_attempts, first,
                        "failed for good" if gone else f"retry at {run_at.isoformat()}",
                        extra=job_extra(self.report.run_id, o.job,
                                        outcome="failed" if gone else "retried",
                                        duration_s=o.duration_s, error=first))
        self._lost(buf, {r[0] for r in rows})

    def snoozed(self, buf: Sequence[Outcome], written: dict[int, datetime]) -> None:
        """Snoozes written: {id: the run_at it was moved to}."""
        for o in buf:
            run_at = written.get(o.job.id)
            if run_at is None:
                continue
            self.report.snoozed += 1
            self.retry_times.append(run_at)
            if self.on_outcome is not None:
                self.on_outcome(o.job, "snoozed")
            logger.info("job %d snoozed for %gs (no attempt used): runs at %s", o.job.id,
                        o.snooze, run_at.isoformat(),
                        extra=job_extra(self.report.run_id, o.job, outcome="snoozed",
                                        duration_s=o.duration_s))
        self._lost(buf, set(written))

    def lost_lease(self, outcome: Outcome) -> None:
        """A handler finished after its lease was lost: nothing to write."""
        self.report.lost += 1
        if self.on_outcome is not None:
            self.on_outcome(outcome.job, "lost")
        logger.warning("job %d finished after its lease was lost: outcome not written",
                       outcome.job.id, extra=job_extra(
                           self.report.run_id, outcome.job, outcome="lost",
                           duration_s=outcome.duration_s))

    def next_retry_at(self, now: datetime) -> datetime | None:
        """The earliest retry or snooze this run wrote that is not due yet (those due
        already were there for the claim that just found nothing)."""
        self.retry_times = [t for t in self.retry_times if t > now]
        return min(self.retry_times, default=None)

    def _lost(self, buf: Sequence[Outcome], written: set[int]) -> None:
        for o in buf:
            if o.job.id not in written:
                self.report.lost += 1
                if self.on_outcome is not None:
                    self.on_outcome(o.job, "lost")
                logger.warning(
                    "job %d: outcome not written (UPDATE 0): it is no longer ours, another "
                    "worker owns it, it was reaped or cancelled", o.job.id,
                    extra=job_extra(self.report.run_id, o.job, outcome="lost",
                                    duration_s=o.duration_s))
