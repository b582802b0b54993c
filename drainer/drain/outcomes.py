"""Outcomes on their way to the table: buffered, written fenced in one statement per kind,
counted in the run report, logged one line per job."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from drainer.drain.handlers import Outcome
from drainer.drain.report import RunReport, job_extra
from drainer.drain.statements import Statements

logger = logging.getLogger("drainer.drain")


class Outcomes:
    """Buffers of finished jobs (successes, failures) and their fenced writes.

    Successes may also leave with the next claim (:mod:`drainer.drain.claims` takes them
    with :meth:`take_successes` and hands back what was written to :meth:`written`).
    """

    def __init__(self, statements: Statements, report: RunReport, *, delete: bool,
                 retry_base: float, retry_cap: float) -> None:
        self.q = statements
        self.report = report
        self.delete = delete
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.ok: list[Outcome] = []
        self.failed: list[Outcome] = []

    def __len__(self) -> int:
        return len(self.ok) + len(self.failed)

    def add(self, outcome: Outcome, *, lost: bool = False) -> None:
        """Buffer a finished job's outcome; ``lost``: its lease was lost, nothing to write."""
        if lost:
            self.report.lost += 1
            logger.warning("job %d finished after its lease was lost: outcome not written",
                           outcome.job.id, extra=job_extra(
                               self.report.run_id, outcome.job, outcome="lost",
                               duration_s=outcome.duration_s))
            return
        (self.ok if outcome.ok else self.failed).append(outcome)

    def take_successes(self) -> list[Outcome]:
        """The buffered successes, to be written by the caller (see :meth:`written`)."""
        buf, self.ok = self.ok, []
        return buf

    def put_back(self, successes: list[Outcome]) -> None:
        """Successes whose statement rolled back: written again later, first."""
        self.ok = successes + self.ok

    def write(self) -> None:
        """Write every buffered outcome, fenced, one statement per kind."""
        if self.ok:
            buf = self.take_successes()
            self.written(buf, self.q.complete_many(
                [o.job.id for o in buf], [o.job.fence for o in buf], delete=self.delete))
        self.write_failures()

    def written(self, buf: Sequence[Outcome], ids: set[int]) -> None:
        """Count (and at debug level log) the successes written; the rest were lost."""
        self.report.succeeded += len(ids)
        if logger.isEnabledFor(logging.DEBUG):
            for o in buf:
                if o.job.id in ids:
                    logger.debug("job %d succeeded", o.job.id, extra=job_extra(
                        self.report.run_id, o.job, outcome="succeeded",
                        duration_s=o.duration_s))
        self._count_lost(buf, ids)

    def write_failures(self) -> None:
        """Write the buffered failures: a retry later, or failed for good."""
        if not self.failed:
            return
        buf, self.failed = self.failed, []
        rows = self.q.fail_many(
            [o.job.id for o in buf], [o.job.fence for o in buf],
            [o.error or "unknown error" for o in buf], [o.task.max_attempts for o in buf],
            self.retry_base, self.retry_cap)
        by_id = {o.job.id: o for o in buf}
        for job_id, status, run_at in rows:
            if status == "failed":
                self.report.failed += 1
            else:
                self.report.retried += 1
            o = by_id[job_id]
            first = (o.error or "").split("\n", 1)[0]
            logger.info("job %d failed (attempt %d/%d): %s; %s", job_id, o.job.attempt,
                        o.job.max_attempts, first,
                        "failed for good" if status == "failed" else
                        f"retry at {run_at.isoformat()}",
                        extra=job_extra(self.report.run_id, o.job,
                                        outcome="failed" if status == "failed" else "retried",
                                        duration_s=o.duration_s, error=first))
        self._count_lost(buf, {r[0] for r in rows})

    def _count_lost(self, buf: Sequence[Outcome], written: set[int]) -> None:
        for o in buf:
            if o.job.id not in written:
                self.report.lost += 1
                logger.warning(
                    "job %d: outcome not written (UPDATE 0): it is no longer ours, another "
                    "worker owns it, it was reaped or cancelled", o.job.id,
                    extra=job_extra(self.report.run_id, o.job, outcome="lost",
                                    duration_s=o.duration_s))
