"""Claiming: which queue next, how many, and the claims that go out alone.

A claim goes out in step (``claim_batch``, queue after queue, waiting for the rows; under
the queue's lock for max_running and rate-limited queues), or carried by the outcomes
(:mod:`drainer.drain.outcomes`: with the buffered successes in one statement, in step or
ahead in the pipeline), as the drain loop decides. Whichever way it went, a claim is
described by a :class:`Claim` made here and counted here (:meth:`Claims._took`), which
also moves the queue cursor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from drainer.db.queries import ClaimedRow
from drainer.drain.clock import BatchClock

if TYPE_CHECKING:
    from drainer.drain.outcomes import Outcomes
    from drainer.drain.report import RunReport
    from drainer.drain.statements import Statements
    from drainer.registry import Task

#: The most jobs one claim takes when it grows to the free handler slots: no drainer
#: claims more than it can start at once, so none hoards jobs from the others.
MAX_CLAIM = 1024

Batch = list[tuple["Task", ClaimedRow]]


@dataclass(frozen=True, slots=True)
class Claim:
    """One claim, as it goes out: queue ``idx`` of the drain's queues, ``size`` jobs asked,
    the first ``start_now`` of them starting at once (charged their attempt)."""

    idx: int
    task: Task
    size: int
    lease: float
    start_now: int
    run_id: str


def claim_size(batch_size: int, max_jobs: int | None, claimed: int, ahead: int = 0,
               window: int | None = None) -> int:
    """The next claim's size: a batch, or what is left under --max-jobs, within the jobs
    claims in flight may hold (``window``, default one batch) less the sizes of those still
    in flight (``ahead``): with the default window a whole batch in flight leaves no room."""
    size = min(batch_size, (batch_size if window is None else window) - ahead)
    return size if max_jobs is None else min(size, max_jobs - claimed - ahead)


def first_claim_size(batch_size: int, concurrency: int, max_jobs: int | None) -> int:
    """The size of a run's first claim (nothing claimed, nothing measured yet, no handler
    busy): what :meth:`Claims.size` says then of a queue whose claims may go with
    completions (a batch, or the free handler slots and the jobs queued ahead of them when
    more, see :meth:`drainer.drain.handlers.Handlers.room`), within --max-jobs."""
    room = concurrency + (0 if concurrency == 1 else concurrency)
    return claim_size(max(batch_size, min(MAX_CLAIM, room)), max_jobs, 0)


def combinable(task: Task) -> bool:
    """Whether a queue's claims may go with other statements and ahead: not transaction
    mode, not capped by max_running nor rate-limited (its claim takes the queue's lock, in
    its own transaction)."""
    return not task.transaction and task.max_running is None and task.rate_limit is None


def next_queue(idx: int, n: int, size: int, got: int) -> int:
    """Stay on a queue while it fills whole batches; move on when it runs dry."""
    return idx if got == size else (idx + 1) % n


class Claims:
    """Claims for one drain over ``report.queues`` (in turn, starting at ``cursor``)."""

    def __init__(self, statements: Statements, outcomes: Outcomes, report: RunReport,
                 tasks: dict[str, Task], *, batch_size: int, max_jobs: int | None,
                 depth: int, combine: bool, lease: Callable[[Task], float],
                 run_in_transaction: Callable[[Task, int], int],
                 free_slots: Callable[[], int] | None = None,
                 room: Callable[[Task], int] | None = None) -> None:
        self.q = statements
        self.outcomes = outcomes  # read only: what is buffered, what is in flight
        self.report = report
        self.queues = report.queues
        self.tasks = tasks
        self.batch_size = batch_size
        self.max_jobs = max_jobs
        self.depth = depth if outcomes.pipeline is not None else 1  # claims in flight
        self.combine = combine  # successes may be written with a claim (not delete mode)
        self.lease = lease
        self.run_in_transaction = run_in_transaction
        # how many jobs of an in-step claim start at once (charged their attempt); claims
        # sent ahead start none. At least 1, so that a suspect at the head is taken.
        self.free_slots = free_slots or (lambda: batch_size)
        self.room = room  # free handler slots for a task's jobs (None: batch_size only)
        self.cursor = 0  # index in `queues` of the next claim
        # with many queues: those believed to have due jobs (None: ask due_queues), so that
        # a sweep over 300 queues is one statement, not 300 empty claims
        self.due: set[int] | None = None
        self.due_fresh = False  # `due` was just read (the run's first statement): trust it
        self.last_full = False  # the last claim filled its batch: claiming ahead may pay
        self.clock: BatchClock = outcomes.clock  # the drain loop's clock
        self.last_size = batch_size  # the last claim's size (grown to the link or the slots)
        self.limited = Limited(statements, report)

    # -- sizes and queues ---------------------------------------------------------------------
    def size(self, idx: int | None = None) -> int:
        """The next claim's size for queue ``idx`` (default: the cursor's): a batch, or as
        many as there are free handler slots when that is more (up to MAX_CLAIM), so that
        200 handlers are not fed 10 jobs a round trip."""
        task = self._task(self.cursor if idx is None else idx)
        batch = self.batch_size
        if not task.transaction:
            # pipelined: half MAX_CLAIM, so that a claim can go ahead of one in flight (the
            # jobs in flight are at most MAX_CLAIM) and the successes go with it
            batch = self.clock.adapted(batch, MAX_CLAIM // min(2, self.depth))
        if self.room is not None and not task.transaction:
            batch = max(batch, min(MAX_CLAIM, self.room(task)))
        if task.rate_limit is not None:  # only what starts at once: a slot is a start
            batch = min(batch, self.start_now())
        # claims in flight hold at most `depth` claims of this size (one before the round
        # trip and the handlers' speed are measured), MAX_CLAIM jobs or, when more, what
        # the handlers run in half the clock's limit: 10 ms away, 1,024 no-op jobs run
        # out before a claim sent behind them is back and the handlers wait for the link
        most = max(MAX_CLAIM, self.clock.within_half_limit())
        window = max(batch, min(most, batch * self.clock.depth(batch, self.depth)))
        return claim_size(batch, self.max_jobs, self.report.claimed,
                          self.outcomes.ahead_size(), window)

    def start_now(self) -> int:
        """The jobs of an in-step or combined claim that start at once."""
        return max(1, self.free_slots())

    def next(self, *, ahead: bool = False) -> Claim:
        """The next claim, of the queue at the cursor; ``ahead``: sent while the batch in
        hand runs, so none of it starts at once (an expired lease gives their attempts
        back)."""
        task = self._task(self.cursor)
        return Claim(self.cursor, task, self.size(), self.lease(task),
                     0 if ahead else self.start_now(), self.report.run_id)

    def _task(self, idx: int) -> Task:
        return self.tasks[self.queues[idx]]

    def _took(self, idx: int, size: int, got: int, *, in_step: bool = True,
              stay: bool = False) -> None:
        """Count a claim of ``got`` jobs (of ``size`` asked) from queue ``idx`` and move
        the cursor (``stay``: on ``idx``, as after a transaction-mode batch)."""
        self.report.claimed += got
        self.last_size = max(size, got)
        full = got == size
        self.last_full = full if in_step else self.last_full and full
        if got < size:
            self._dry(idx)
        if stay:
            self.cursor = idx
        elif got or in_step:
            self.cursor = next_queue(idx, len(self.queues), size, got)
            if self.cursor != idx and self.due:  # on to the next queue believed due
                n = len(self.queues)
                self.cursor = next((self.cursor + i) % n for i in range(n)
                                   if (self.cursor + i) % n in self.due)

    def known_due(self, names: list[str]) -> None:
        """The queues with due jobs, as read by the run's first statement: the first sweep
        claims only these (none: the run claims nothing), whatever the number of queues."""
        self.due = {i for i, name in enumerate(self.queues) if name in set(names)}
        self.due_fresh = True

    def claimed_first(self, rows: list[ClaimedRow], size: int) -> Batch:
        """The rows of the run's first claim, which went out with the first Query (of
        ``size``): counted as the loop's first in-step claim would have been (the cursor
        moves on, a short claim leaves its queue dry). Call after :meth:`known_due`."""
        idx = self.queues.index(rows[0].queue)
        self.due_fresh = False
        self._took(idx, size, len(rows))
        return self._batch(idx, rows)

    def _batch(self, idx: int, rows: list[ClaimedRow]) -> Batch:
        task = self._task(idx)
        return [(task, r) for r in rows]

    # -- claims carried by the outcomes -------------------------------------------------------
    def can_combine(self) -> bool:
        """Whether the successes can go with the next claim (of the queue at the cursor)."""
        return bool(self.outcomes.ok) and self.combine and self.may_combine(self.cursor)

    def may_combine(self, idx: int) -> bool:
        """A queue whose claims may go with completions and ahead (see :func:`combinable`)."""
        return combinable(self._task(idx))

    def after_combined(self, claim: Claim, rows: list[ClaimedRow] | None) -> tuple[Batch, bool]:
        """Count a claim that went with the successes (``rows`` None: it deadlocked, the
        successes were written alone: claim the queue in step). A claim that found nothing
        there sweeps the other queues in step."""
        if rows is None:
            return self._in_step(claim.idx, len(self.queues))
        if rows:
            self._took(claim.idx, claim.size, len(rows))
            return self._batch(claim.idx, rows), True
        n = len(self.queues)
        return ([], False) if n == 1 else self._in_step((claim.idx + 1) % n, n - 1)

    def can_send_ahead(self) -> bool:
        """Whether a claim may go out now ahead of the batch in hand, with the successes
        (the drain loop also asks whether batches run fast and nothing else is due)."""
        return (self.depth >= 2 and self.last_full and not self.outcomes.failed
                and not self.outcomes.split  # written once the connection is free
                and len(self.outcomes.ahead) < self.depth
                and self.combine and self.may_combine(self.cursor) and self.size() > 0)

    def after_ahead(self, claim: Claim, rows: list[ClaimedRow] | None) -> Batch:
        """Count a claim that went ahead in the pipeline (``rows`` None: it deadlocked)."""
        if rows is None:
            self.last_full = False
            return []
        self._took(claim.idx, claim.size, len(rows), in_step=False)
        return self._batch(claim.idx, rows)

    # -- in step ------------------------------------------------------------------------------
    def claim(self) -> tuple[Batch, bool]:
        """Claim the next batch now, alone. Returns the rows (transaction-mode batches are
        run and recorded right here) and whether anything was claimed (False: nothing due)."""
        assert not self.outcomes.ahead, "claims in flight: receive them first"
        return self._in_step(self.cursor, len(self.queues))

    def _ask_due(self) -> set[int]:
        names = set(self.q.due_queues(self.queues))
        self.due = {i for i, name in enumerate(self.queues) if name in names}
        return self.due

    def _in_step(self, start: int, tries: int) -> tuple[Batch, bool]:
        """Claim from the first queue in turn that has due jobs. With many queues, one
        due_queues statement says which have any; queues found dry since are skipped until
        every one believed due is dry, then due_queues is asked once more."""
        n = len(self.queues)
        order = [(start + i) % n for i in range(tries)]
        if self.due_fresh and self.due is not None:
            self.due_fresh = False
            return self._sweep([i for i in order if i in self.due])
        if n == 1 or tries == 1:
            return self._sweep(order)
        fresh = not self.due
        due = self._ask_due() if fresh or self.due is None else self.due
        batch, got = self._sweep([i for i in order if i in due])
        if got or fresh:
            return batch, got
        due = self._ask_due()
        return self._sweep([i for i in order if i in due])

    def _sweep(self, order: list[int]) -> tuple[Batch, bool]:
        for idx in order:
            task = self._task(idx)
            size = self.size(idx)
            if size <= 0:  # --max-jobs reached: the drain ends
                return [], False
            if task.transaction:
                got = self.run_in_transaction(task, size)
                if got:
                    self._took(idx, size, got, stay=True)
                    return [], True
                self._dry(idx)
                continue
            sent = time.monotonic()
            if combinable(task):
                rows = self.q.claim_batch(task.queue, size, self.lease(task),
                                          start_now=self.start_now(), run_id=self.report.run_id)
            else:
                rows = self.limited.claim(task, size, self.lease(task), self.start_now())
            self.clock.round_trip(time.monotonic() - sent)
            if len(rows) < size:
                self._dry(idx)
            if rows:
                self._took(idx, size, len(rows))
                return self._batch(idx, rows), True
        return [], False

    def _dry(self, idx: int) -> None:
        if self.due is not None:
            self.due.discard(idx)


class Limited:
    """Claims of queues under max_running or a rate limit (each in a transaction of its
    own, under the queue's lock), and what they left for later: slots a max_running queue
    frees as its jobs end, due jobs a full rate window holds until its next slot."""

    def __init__(self, statements: Statements, report: RunReport) -> None:
        self.q = statements
        self.report = report
        # a max_running queue's claim got less than it asked (the cap, or nothing due):
        # the report's finished count then; the drain claims again once it has finished
        # jobs since (it freed slots), instead of taking "nothing claimed" for "drained"
        self.capped_at: int | None = None
        # rate-limited queues whose last claim left due jobs for a later slot: when each
        # window next has room, and how many due jobs its claim left (the report's count)
        self.next_at: dict[str, datetime] = {}
        self.limited: dict[str, int] = {}
        # the next slot each queue was claimed again for (once a slot: a clock running
        # ahead of the database's never turns into a loop of empty claims)
        self.tried: dict[str, datetime] = {}

    def claim(self, task: Task, size: int, lease: float, start_now: int) -> list[ClaimedRow]:
        run_id = self.report.run_id
        if task.rate_limit is not None:
            rows, next_at, limited = self.q.claim_batch_rated(
                task.queue, size, lease, task.max_running, task.rate_limit,
                start_now=start_now, run_id=run_id)
            if task.max_running is not None and len(rows) < size and not limited:
                self.capped_at = self.report.finished  # short by the cap: slots free later
            self._rated(task.queue, next_at, limited)
            return rows
        assert task.max_running is not None, "a queue with neither limit claims alone"
        rows = self.q.claim_batch_capped(task.queue, size, lease, task.max_running,
                                         start_now=start_now, run_id=run_id)
        if len(rows) < size:
            self.capped_at = self.report.finished
        return rows

    def freed_slots(self) -> bool:
        """Whether a max_running queue came back short and jobs finished since: claim
        again (once per short claim)."""
        if self.capped_at is None or self.report.finished <= self.capped_at:
            return False
        self.capped_at = None
        return True

    def _rated(self, queue: str, next_at: datetime | None, limited: int) -> None:
        if limited and next_at is not None:
            self.next_at[queue] = next_at
            self.limited[queue] = limited
        else:
            self.next_at.pop(queue, None)
            self.limited.pop(queue, None)
        self.report.rate_limited = sum(self.limited.values())

    def next_slot(self, now: datetime) -> datetime | None:
        """The earliest next slot of a rate-limited queue whose last claim left due jobs."""
        return min((t for t in self.next_at.values() if t > now), default=None)

    def slot_open(self, now: datetime) -> bool:
        """A rate-limited queue left due jobs and its window has room again by now: claim
        again (once for each next slot)."""
        opened = {q: t for q, t in self.next_at.items() if t <= now and self.tried.get(q) != t}
        self.tried.update(opened)
        return bool(opened)
