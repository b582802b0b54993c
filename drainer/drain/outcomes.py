"""Outcomes on their way to the table: buffered, written fenced in one statement per kind,
counted in the run report, logged one line per job."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from drainer._loaders import UndecodablePayload
from drainer.drain.handlers import Outcome, Running
from drainer.drain.report import RunReport, job_extra
from drainer.drain.statements import Statements
from drainer.job import DEFAULT_MAX_ATTEMPTS, Job

if TYPE_CHECKING:
    from drainer.registry import Task

logger = logging.getLogger("drainer.drain")


def undecodable(r: Running) -> Outcome | None:
    """A job whose payload the client could not decode: failed at once, on its own (it
    would fail the same way every time), before any handler sees it."""
    payload = r.job.payload
    if not isinstance(payload, UndecodablePayload):
        return None
    return Outcome(r.job, r.task, False, f"payload cannot be decoded: {payload.error}",
                   max_attempts=0)


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
        #: Told each job's outcome (succeeded, retried, failed, lost) once it is known:
        #: the job's OpenTelemetry span ends then (drainer.otel).
        self.on_outcome: Callable[[Job, str], None] | None = None
        self.snoozed: list[Outcome] = []
        self.tasks: dict[str, Task] = {}  # the registry's: follow-ups' default max_attempts
        self.followups_due = False  # follow-ups due now on our queues were inserted
        self.retry_times: list[datetime] = []  # run_at of this drain's retries and snoozes

    def __len__(self) -> int:
        return len(self.ok) + len(self.failed) + len(self.snoozed)

    def completion(self, buf: Sequence[Outcome]) -> dict[str, Any]:
        """The results and follow-ups of successes, as the completion statements take them
        (in this order, for the pipeline's positional parameters)."""
        followups = [self._followup(f, o.job.id) for o in buf for f in o.job.followups]
        return {"results": [o.result for o in buf],
                "followups": json.dumps(followups) if followups else None}

    def _followup(self, f: Any, parent: int) -> dict[str, Any]:
        out: dict[str, Any] = f.as_json(parent)
        if out["max_attempts"] is None:
            task = self.tasks.get(f.queue)
            out["max_attempts"] = task.attempts_limit if task is not None and \
                task.attempts_limit is not None else DEFAULT_MAX_ATTEMPTS
        return out

    def add(self, outcome: Outcome, *, lost: bool = False) -> None:
        """Buffer a finished job's outcome; ``lost``: its lease was lost, nothing to write."""
        if lost:
            self.report.lost += 1
            if self.on_outcome is not None:
                self.on_outcome(outcome.job, "lost")
            logger.warning("job %d finished after its lease was lost: outcome not written",
                           outcome.job.id, extra=job_extra(
                               self.report.run_id, outcome.job, outcome="lost",
                               duration_s=outcome.duration_s))
            return
        if outcome.snooze is not None:
            self.snoozed.append(outcome)
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
                [o.job.id for o in buf], [o.job.fence for o in buf], delete=self.delete,
                **self.completion(buf)))
        self.write_failures()

    def written(self, buf: Sequence[Outcome], ids: set[int]) -> None:
        """Count (and at debug level log) the successes written; the rest were lost."""
        self.report.succeeded += len(ids)
        if self.on_outcome is not None:
            for o in buf:
                if o.job.id in ids:
                    self.on_outcome(o.job, "succeeded")
        now = datetime.now(timezone.utc)
        for o in buf:
            if o.job.followups and o.job.id in ids:
                self.report.followups += len(o.job.followups)
                if any(f.queue in self.report.queues and (f.run_at is None or f.run_at <= now)
                       for f in o.job.followups):
                    self.followups_due = True
        if logger.isEnabledFor(logging.DEBUG):
            for o in buf:
                if o.job.id in ids:
                    logger.debug("job %d succeeded", o.job.id, extra=job_extra(
                        self.report.run_id, o.job, outcome="succeeded",
                        duration_s=o.duration_s))
        self._count_lost(buf, ids)

    def write_failures(self) -> None:
        """Write the buffered snoozes and failures: a retry later, or failed for good."""
        self.write_snoozes()
        if not self.failed:
            return
        buf, self.failed = self.failed, []
        policies = [o.task.retry for o in buf]
        rows = self.q.fail_many(
            [o.job.id for o in buf], [o.job.fence for o in buf],
            [o.error or "unknown error" for o in buf],
            [0 if o.discard else o.task.attempts_limit if o.max_attempts is None
             else o.max_attempts for o in buf],
            self.retry_base, self.retry_cap,
            bases=[None if p is None else p.base for p in policies],
            caps=[None if p is None else p.cap for p in policies],
            jitters=[0.0 if p is None else p.jitter for p in policies])
        by_id = {o.job.id: o for o in buf}
        for job_id, status, run_at in rows:
            o = by_id[job_id]
            if status == "failed":
                self.report.failed += 1
                if o.discard:
                    self.report.discarded += 1
            else:
                self.report.retried += 1
                self._due(run_at)
            if self.on_outcome is not None:
                self.on_outcome(o.job, "failed" if status == "failed" else "retried")
            first = (o.error or "").split("\n", 1)[0]
            logger.info("job %d failed (attempt %d/%d): %s; %s", job_id, o.job.attempt,
                        o.job.max_attempts, first,
                        "failed for good" if status == "failed" else
                        f"retry at {run_at.isoformat()}",
                        extra=job_extra(self.report.run_id, o.job,
                                        outcome="failed" if status == "failed" else "retried",
                                        duration_s=o.duration_s, error=first))
        self._count_lost(buf, {r[0] for r in rows})

    def write_snoozes(self) -> None:
        """Write the buffered snoozes: back to queued later, no attempt used."""
        if not self.snoozed:
            return
        buf, self.snoozed = self.snoozed, []
        seconds = [o.snooze or 0.0 for o in buf]
        written = self.q.snooze_many([o.job.id for o in buf], [o.job.fence for o in buf],
                                     seconds)
        for o in buf:
            run_at = written.get(o.job.id)
            if run_at is None:
                continue
            self.report.snoozed += 1
            self._due(run_at)
            if self.on_outcome is not None:
                self.on_outcome(o.job, "snoozed")
            logger.info("job %d snoozed for %gs (no attempt used): runs at %s", o.job.id,
                        o.snooze, run_at.isoformat(),
                        extra=job_extra(self.report.run_id, o.job, outcome="snoozed",
                                        duration_s=o.duration_s))
        self._count_lost(buf, set(written))

    def _due(self, run_at: datetime) -> None:
        self.retry_times.append(run_at)

    def next_retry_at(self, now: datetime) -> datetime | None:
        """The earliest retry or snooze this drain wrote that is not due yet (those due
        already were there for the claim that just found nothing)."""
        self.retry_times = [t for t in self.retry_times if t > now]
        return min(self.retry_times, default=None)

    def _count_lost(self, buf: Sequence[Outcome], written: set[int]) -> None:
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
