"""Outcomes on their way to the table: the only writer of outcomes.

Finished jobs are buffered by kind (successes, failures, snoozes) and leave in one
fenced statement per kind, by one of five ways:

- alone (:meth:`Outcomes.write`);
- with the next claim, in one statement (:meth:`Outcomes.with_claim`:
  ``complete_many_and_claim``, one round trip and one commit a batch);
- ahead in the pipeline, the same statement sent while the batch in hand runs and read
  later (:meth:`Outcomes.send_ahead`, :meth:`Outcomes.receive`, :meth:`Outcomes.settle`);
- with the end of the run (:meth:`Outcomes.with_finish`: ``finish_run`` behind them);
- inside a transaction-mode task's transaction (:meth:`Outcomes.in_transaction`).

A statement that carries successes with something else rolls back whole on a deadlock
(another drainer's claim or archive met it): :meth:`Outcomes._deadlocked` is the one
fallback, which puts them back to be written again. A statement that fails on one row the
table cannot store (:data:`UNSTORABLE`: what a handler handed back got past the checks of
:func:`drainer.drain.calls.returned`) is split (:meth:`Outcomes._bisect`), so that only that
job fails and the others are written. What was written is counted by
:class:`~drainer.drain.report.Tally`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from drainer.db.connect import one_line, timeout_kind
from drainer.db.loaders import UndecodablePayload
from drainer.drain.calls import Outcome, Running
from drainer.drain.clock import BatchClock
from drainer.drain.report import Tally
from drainer.job import DEFAULT_MAX_ATTEMPTS

if TYPE_CHECKING:
    from drainer.db.queries import ClaimedRow
    from drainer.drain.claims import Claim
    from drainer.drain.report import RunReport
    from drainer.drain.statements import Pipeline, Statements
    from drainer.registry import Task

logger = logging.getLogger("drainer.drain")

#: What a batch statement fails with when one of its rows cannot be stored: a data
#: exception (SQLSTATE class 22: a NUL, an integer or an interval out of range) or a CHECK.
#: Nothing was written (one statement, one transaction); the same rows fail the same way
#: every time, so the batch is split until the row is alone.
UNSTORABLE = (psycopg.errors.DataError, psycopg.errors.CheckViolation)



def connection_lost(exc: BaseException) -> bool:
    """An error that is the connection going, not a statement's (a timeout, a cancel)."""
    return isinstance(exc, psycopg.OperationalError) and timeout_kind(exc) is None


def undecodable(r: Running) -> Outcome | None:
    """A job whose payload the client could not decode: failed at once, on its own (it
    would fail the same way every time), before any handler sees it."""
    payload = r.job.payload
    if not isinstance(payload, UndecodablePayload):
        return None
    return Outcome(r.job, r.task, False, f"payload cannot be decoded: {payload.error}",
                   max_attempts=0)


@dataclass
class _Ahead:
    """A completion and claim in flight in the pipeline."""

    successes: list[Outcome]
    claim: Claim
    sent: float  # time.monotonic() when it went out


class Outcomes:
    """The buffered outcomes of one run and every statement that writes them."""

    def __init__(self, statements: Statements, report: RunReport, *, delete: bool,
                 retry_base: float, retry_cap: float, pipeline: Pipeline | None = None,
                 clock: BatchClock | None = None) -> None:
        self.q = statements
        self.report = report
        self.delete = delete  # delete-on-complete: successes delete their rows
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.pipeline = pipeline
        self.clock = clock or BatchClock()  # round trips of what goes with a claim
        self.tally = Tally(report)
        self.ok: list[Outcome] = []
        self.failed: list[Outcome] = []
        self.snoozed: list[Outcome] = []
        self.tasks: dict[str, Task] = {}  # the registry's: follow-ups' default max_attempts
        self.ahead: list[_Ahead] = []  # in flight in the pipeline, oldest first
        #: before a statement goes ahead on an idle connection: connected again if it was
        #: cut (drainer.drain.link); the pipeline may be a new one after it
        self.before_send: Callable[[], None] | None = None
        # successes of a pipelined statement that failed on a row it could not store: written
        # split, never with a claim, once the connection is free (write, with_claim)
        self.split: list[Outcome] = []

    def __len__(self) -> int:
        return len(self.ok) + len(self.failed) + len(self.snoozed) + len(self.split)

    # -- the buffers ----------------------------------------------------------------------------
    def add(self, outcome: Outcome, *, lost: bool = False) -> None:
        """Buffer a finished job's outcome; ``lost``: its lease was lost, nothing to write."""
        if lost:
            self.tally.lost_lease(outcome)
        elif outcome.snooze is not None:
            self.snoozed.append(outcome)
        else:
            (self.ok if outcome.ok else self.failed).append(outcome)

    def take_successes(self) -> list[Outcome]:
        buf, self.ok = self.ok, []
        return buf

    def put_back(self, successes: list[Outcome]) -> None:
        """Successes whose statement rolled back: written again later, first."""
        self.ok = successes + self.ok

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

    # -- alone ----------------------------------------------------------------------------------
    def write(self) -> None:
        """Write every buffered outcome, fenced, one statement per kind."""
        self.write_split()
        if self.ok:
            self._bisect(self.take_successes(), self._complete, self._unstorable)
        self.write_failures()

    def _complete(self, buf: list[Outcome]) -> None:
        self.tally.succeeded(buf, self.q.complete_many(
            [o.job.id for o in buf], [o.job.fence for o in buf], delete=self.delete,
            **self.completion(buf)))

    def write_split(self) -> None:
        """The successes of a statement that could not store one of them: written split."""
        if self.split:
            buf, self.split = self.split, []
            self._bisect(buf, self._complete, self._unstorable)

    def write_failures(self) -> None:
        """Write the buffered snoozes and failures: a retry later, or failed for good."""
        if self.snoozed:
            buf, self.snoozed = self.snoozed, []
            self.tally.snoozed(buf, self.q.snooze_many(
                [o.job.id for o in buf], [o.job.fence for o in buf],
                [o.snooze or 0.0 for o in buf]))
        if self.failed:
            buf, self.failed = self.failed, []
            self._bisect(buf, self._fail, self._unstorable_failure)

    def _fail(self, buf: list[Outcome]) -> None:
        policies = [o.task.retry for o in buf]
        self.tally.failed(buf, self.q.fail_many(
            [o.job.id for o in buf], [o.job.fence for o in buf],
            [o.error or "unknown error" for o in buf],
            [0 if o.discard else o.task.attempts_limit if o.max_attempts is None
             else o.max_attempts for o in buf],
            self.retry_base, self.retry_cap,
            bases=[None if p is None else p.base for p in policies],
            caps=[None if p is None else p.cap for p in policies],
            jitters=[0.0 if p is None else p.jitter for p in policies]))

    # -- with the next claim --------------------------------------------------------------------
    def with_claim(self, claim: Claim) -> list[ClaimedRow] | None:
        """The failures alone, then the successes and ``claim`` in one statement: the rows
        claimed; None when it deadlocked (the successes were written alone then)."""
        self.write_split()
        self.write_failures()
        buf = self.take_successes()
        try:
            sent = time.monotonic()
            written, rows = self.q.complete_many_and_claim(
                [o.job.id for o in buf], [o.job.fence for o in buf], claim.task.queue,
                claim.size, claim.lease, start_now=claim.start_now, run_id=claim.run_id,
                **self.completion(buf))
            self.clock.round_trip(time.monotonic() - sent)
        except psycopg.errors.DeadlockDetected as exc:
            self._deadlocked(buf, exc, "combined completion and claim", again=True)
            return None
        except UNSTORABLE:
            self._bisect(buf, self._complete, self._unstorable)
            self.write_failures()
            return None
        self.tally.succeeded(buf, written)
        return rows

    # -- ahead in the pipeline ------------------------------------------------------------------
    def send_ahead(self, claim: Claim) -> None:
        """The buffered successes and ``claim`` in one statement, not waited for."""
        if not self.ahead and self.before_send is not None:
            self.before_send()
        assert self.pipeline is not None
        buf = self.take_successes()
        self.pipeline.send([o.job.id for o in buf], [o.job.fence for o in buf],
                           claim.task.queue, claim.size, claim.lease, claim.start_now,
                           claim.run_id, *self.completion(buf).values())
        self.ahead.append(_Ahead(buf, claim, time.monotonic()))

    def receive(self) -> tuple[Claim, list[ClaimedRow] | None]:
        """The oldest statement in flight: its claim and the rows it claimed (None: it
        deadlocked, nothing written nor claimed; the successes go again later)."""
        assert self.pipeline is not None
        sent = self.ahead.pop(0)
        try:
            waited = time.monotonic()
            written, rows = self.pipeline.receive()
            now = time.monotonic()
            # a round trip when the read mostly waited for the server (not when the result
            # was back already and the time in flight was the batch in hand running)
            if now - waited >= (now - sent.sent) / 2:
                self.clock.round_trip(now - sent.sent)
        except psycopg.errors.DeadlockDetected as exc:
            self._deadlocked(sent.successes, exc, "pipelined completion and claim")
            return sent.claim, None
        except psycopg.OperationalError as exc:
            if not connection_lost(exc):
                raise
            self._cut(sent.successes, exc)
            return sent.claim, None
        except UNSTORABLE:
            self.split.extend(sent.successes)
            return sent.claim, None
        self.tally.succeeded(sent.successes, written)
        return sent.claim, rows

    def settle(self) -> tuple[list[tuple[Claim, list[ClaimedRow] | None]], BaseException | None]:
        """Read every statement in flight, so that the connection can run another: each
        claim with its rows (None: deadlocked), and the first other error, for the caller
        to raise once the claims are counted."""
        if not self.ahead:
            return [], None
        assert self.pipeline is not None
        sent, self.ahead = self.ahead, []
        out: list[tuple[Claim, list[ClaimedRow] | None]] = []
        error: BaseException | None = None
        for ahead, result in zip(sent, self.pipeline.close(), strict=True):
            if isinstance(result, psycopg.errors.DeadlockDetected):
                self._deadlocked(ahead.successes, result, "pipelined completion and claim")
                out.append((ahead.claim, None))
            elif isinstance(result, psycopg.OperationalError) and connection_lost(result):
                self._cut(ahead.successes, result)
                out.append((ahead.claim, None))
            elif isinstance(result, UNSTORABLE):
                self.split.extend(ahead.successes)
                out.append((ahead.claim, None))
            elif isinstance(result, BaseException):
                error = error or result
            else:
                self.tally.succeeded(ahead.successes, result[0])
                out.append((ahead.claim, result[1]))
        return out, error

    def ahead_size(self) -> int:
        """The jobs the claims in flight may bring."""
        return sum(a.claim.size for a in self.ahead)

    # -- with the end of the run ----------------------------------------------------------------
    def with_finish(self, finish: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
        """The buffered successes and finish_run (``if_drained``: it does the end of the
        run only when no job of the drained queues is due then) in one statement. Returns
        whether it went (False: it deadlocked, the successes were written alone) and
        finish_run's result (None: something was due, it did nothing)."""
        buf = self.take_successes()
        try:
            written, fin = self.q.complete_many_and_finish(
                [o.job.id for o in buf], [o.job.fence for o in buf], finish,
                delete=self.delete, **self.completion(buf))
        except psycopg.errors.DeadlockDetected as exc:
            self._deadlocked(buf, exc, "completions with the end of the run", again=True)
            return False, None
        except UNSTORABLE:
            self._bisect(buf, self._complete, self._unstorable)
            self.write_failures()
            return False, None
        self.tally.succeeded(buf, written)
        return True, fin

    # -- inside a task's transaction ------------------------------------------------------------
    def in_transaction(self, tq: Statements, outcome: Outcome) -> set[int]:
        """A transaction-mode job's success, in its handler's open transaction (its result
        and follow-ups commit with the handler's writes). Counted by :meth:`committed`."""
        return tq.complete_many([outcome.job.id], [outcome.job.fence],
                                **self.completion([outcome]))

    def committed(self, outcome: Outcome, written: set[int]) -> None:
        """The transaction of :meth:`in_transaction` committed."""
        self.tally.succeeded([outcome], written)

    # -- the fallbacks --------------------------------------------------------------------------
    def _cut(self, buf: list[Outcome], exc: BaseException) -> None:
        """The connection went with a statement in flight: whether it committed is not
        known. Its successes go back to be written again (fenced: if they were written,
        the second write is refused and they are counted lost, never written twice); the
        jobs its claim may have taken are left to their lease (next_due_at counts it)."""
        logger.warning("the connection was lost with a completion and claim in flight (%s): "
                       "writing the completions again", one_line(exc),
                       extra={"run_id": self.report.run_id})
        self.put_back(buf)

    def _deadlocked(self, buf: list[Outcome], exc: BaseException, what: str, *,
                    again: bool = False) -> None:
        """A statement carrying ``buf`` rolled back whole on a deadlock: nothing it wrote
        or claimed stays. The successes go back to the buffer, first; ``again``: written
        now, alone (a statement that cannot take part in a cycle)."""
        logger.warning("%s deadlocked, writing the completions again: %s", what,
                       one_line(exc), extra={"run_id": self.report.run_id})
        self.put_back(buf)
        if again:
            self.write()

    # -- what the table cannot store --------------------------------------------------------
    def _bisect(self, buf: list[Outcome], write: Callable[[list[Outcome]], None],
                alone: Callable[[Outcome, BaseException], None]) -> None:
        """``write(buf)``; if one of its rows cannot be stored, each half again, down to
        the job alone, given to ``alone`` (a bad row costs about log2(len(buf)) statements
        more; the others are written)."""
        try:
            write(buf)
        except UNSTORABLE as exc:
            if len(buf) == 1:
                alone(buf[0], exc)
                return
            logger.warning("an outcome of a batch of %d cannot be stored, splitting it: %s",
                           len(buf), one_line(exc), extra={"run_id": self.report.run_id})
            half = len(buf) // 2
            self._bisect(buf[:half], write, alone)
            self._bisect(buf[half:], write, alone)

    def _unstorable(self, o: Outcome, exc: BaseException) -> None:
        """A success the table cannot store (a result or a follow-up): failed for good (it
        would fail the same way at every run), with the database's reason."""
        self.failed.append(Outcome(o.job, o.task, False, _stored(exc, "outcome"),
                                   duration_s=o.duration_s, max_attempts=0))

    def _unstorable_failure(self, o: Outcome, exc: BaseException) -> None:
        """A failure the table cannot store (its retry time): failed for good, its reason
        and the database's kept."""
        self._fail([Outcome(o.job, o.task, False, _stored(exc, "failure") + "\n" +
                            (o.error or ""), duration_s=o.duration_s, max_attempts=0)])


def _stored(exc: BaseException, what: str) -> str:
    return f"UnstorableOutcome: the job's {what} cannot be stored: {one_line(exc)}"[:4000]
