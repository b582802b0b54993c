"""What became of each job whose outcome went out: counted in the run report, logged one
line a job, told to tracing; and what the run wrote that comes due again (retries,
snoozes, follow-ups), which the loop's tail and the next wake need."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from drainer.drain.report import RunReport, job_extra

if TYPE_CHECKING:
    from drainer.drain.calls import Outcome
    from drainer.job import Job

logger = logging.getLogger("drainer.drain")


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
