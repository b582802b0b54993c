"""Claiming: which queue next, how many, and the three ways a claim goes out.

- in step: ``claim_batch``, queue after queue, waiting for the rows;
- combined: the buffered successes and the claim in one statement
  (``complete_many_and_claim``: one round trip and one commit a batch);
- ahead: the same combined statement sent while the batch in hand runs, read later
  (:class:`drainer.db.ClaimPipeline`).

:class:`Claims` is the one interface over the three; every claim, whichever way it went,
is counted in one place (:meth:`Claims._took`), which also moves the queue cursor. A
claim across many queues in one statement, or a claim size that adapts to the batch
time, fits behind the same methods.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import psycopg

from drainer import db
from drainer.drain.outcomes import Outcomes
from drainer.drain.report import RunReport
from drainer.drain.statements import Pipeline, Statements

if TYPE_CHECKING:
    from drainer.drain.handlers import Outcome
    from drainer.registry import Task

logger = logging.getLogger("drainer.drain")

#: Statements are sent ahead (the next batch claimed while this one runs) only while a batch
#: takes at most this long.
PIPELINE_MAX_BATCH_S = 0.1

#: The most jobs one claim takes when it grows to the free handler slots: no drainer
#: claims more than it can start at once, so none hoards jobs from the others.
MAX_CLAIM = 1024

#: A claim grows with the round trip once ADAPT_SAMPLES claims have been timed and the
#: database is across a link (see BatchClock.far): locally the configured batch size stays.
ADAPT_SAMPLES = 5

#: Claims whose fastest round trip (of ADAPT_SAMPLES) took this long, in seconds, are taken
#: for a link at once (a database 8 ms or more away).
ADAPT_MIN_RTT_S = 0.008

#: Faster claims, but LINK_MIN_S or more, may be a link 1-5 ms away or a local database on
#: a busy disk (there a claim's commit waits 5-15 ms for its WAL flush behind the other
#: writers): a Sync alone then tells which, as it costs no statement and no commit. It is a
#: link when LINK_PROBES Syncs in a row, timed while nothing else runs in the drain, all
#: took LINK_MIN_S or more. Locally a Sync takes 0.03-0.1 ms, on a loaded machine too:
#: measured at load 6.6 on 2 cores, one in 60 took a few ms, none of 1,000 sets of three
#: in a row all did (in a drain, the first after a batch took 0.1-1 ms, the next 0.03-0.3).
LINK_MIN_S = 0.0005
LINK_PROBES = 3

Batch = list[tuple["Task", db.ClaimedRow]]


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


class BatchClock:
    """How long batches take: claims go ahead only while a batch takes at most
    PIPELINE_MAX_BATCH_S (then a round trip is a large share of a batch, and claiming
    ahead holds few jobs away from other drainers for little time)."""

    def __init__(self, limit: float = PIPELINE_MAX_BATCH_S) -> None:
        self.limit = limit
        self.started: float | None = None  # when the batch in hand was handed over
        self.last: float | None = None  # how long the last batch took to run
        self.count = 0  # jobs handed over in the batch in hand
        self.per_job: float | None = None  # the last batch's time a job
        self.rtt: float | None = None  # the fastest claim's round trip (server time included)
        self.samples = 0
        self.probing = False  # a Sync alone can be timed (see Claims.probe)
        self.link: float | None = None  # the fastest Sync alone timed
        self.linked: bool | None = None  # what the Syncs said: a link, local; None: not yet
        self.probes = 0  # Syncs timed

    def start(self, now: float, jobs: int = 1) -> None:
        """``jobs`` handed over at ``now``."""
        if self.started is None:
            self.started = now
        self.count += jobs

    def finish(self, now: float) -> None:
        if self.started is not None:
            self.last = now - self.started
            self.per_job = self.last / max(1, self.count)
            self.started = None
            self.count = 0

    def round_trip(self, seconds: float) -> None:
        self.rtt = seconds if self.rtt is None else min(self.rtt, seconds)
        self.samples += 1

    def wants_probe(self) -> bool:
        """Whether to time a Sync alone now (the connection is idle): ADAPT_SAMPLES claims
        timed, the fastest between LINK_MIN_S (faster: no link that long is there) and
        ADAPT_MIN_RTT_S (slower: a link already), and the Syncs have not decided yet."""
        return self.probing and self.linked is None and self.samples >= ADAPT_SAMPLES \
            and self.rtt is not None and LINK_MIN_S <= self.rtt < ADAPT_MIN_RTT_S

    def link_round_trip(self, seconds: float) -> None:
        """A Sync alone took ``seconds``: under LINK_MIN_S says local, LINK_PROBES in a row
        that long say a link (either for the rest of the drain)."""
        self.link = seconds if self.link is None else min(self.link, seconds)
        self.probes += 1
        if seconds < LINK_MIN_S:
            self.linked = False
        elif self.probes >= LINK_PROBES:
            self.linked = True

    def far(self) -> bool:
        """Whether claims grow with the round trip: ADAPT_SAMPLES claims timed, and the
        fastest took ADAPT_MIN_RTT_S or more, or the Syncs timed said a link (a database
        1-5 ms away; not a local one, loaded or not)."""
        if self.rtt is None or self.samples < ADAPT_SAMPLES:
            return False
        return self.rtt >= ADAPT_MIN_RTT_S or bool(self.linked)

    def adapted(self, batch_size: int, most: int) -> int:
        """A claim size for the measured link: with the database across one (:meth:`far`),
        large enough that a batch runs for two round trips (so the claim sent ahead is back
        before the batch in hand is done; a batch of slow handlers that already does stays
        at ``batch_size``), but at most ``most``, and no larger than runs within half the
        ``limit`` (so that batches stay fast enough to claim ahead, and a claimed job waits
        at most that long for its handler)."""
        if not self.per_job or not self.far():
            return batch_size
        assert self.rtt is not None
        want = int(2 * self.rtt / self.per_job) + 1
        # half the limit: a batch sized right at it would be "slow" every other time
        return max(batch_size, min(most, want, int(self.limit / 2 / self.per_job)))

    def depth(self, size: int, most: int) -> int:
        """How many claims of ``size`` to keep in flight, at most ``most`` (the pipeline
        depth): enough that they hold the jobs the handlers run in two measured round trips
        (so that the next claim is back before the batches in hand are done), but no more
        than run within the ``limit`` (a job claimed ahead waits at most that long for its
        handler, so no drainer hoards jobs). Before ADAPT_SAMPLES round trips, and while
        Syncs are still to be timed (they go out when nothing is in flight): one."""
        if most <= 1 or self.rtt is None or not self.per_job or self.samples < ADAPT_SAMPLES \
                or size <= 0 or self.wants_probe():
            return min(1, most)
        batch_s = size * self.per_job
        want = math.ceil(2 * self.rtt / batch_s)
        return max(1, min(most, want, int(self.limit / batch_s)))

    def runs_out(self, waiting: int) -> bool:
        """Whether ``waiting`` jobs (claimed, not started) run out within two measured round
        trips: a claim sent now is then back about when they are done (none waiting: yes;
        nothing measured yet: no, the batch is handed over first)."""
        if not waiting:
            return True
        return self.rtt is not None and bool(self.per_job) and \
            self.samples >= ADAPT_SAMPLES and waiting * (self.per_job or 0) <= 2 * self.rtt

    def fast(self) -> bool:
        """The last batch ran fast enough to claim the next ahead of it."""
        return self.last is not None and self.last <= self.limit

    def slow_now(self, now: float) -> bool:
        """The batch in hand has run too long to keep claims ahead in the socket."""
        return self.started is not None and now - self.started > self.limit


@dataclass
class _Ahead:
    """A combined statement in flight: the successes it writes, its claim."""

    successes: list[Outcome]
    idx: int
    size: int
    sent: float = 0.0  # time.monotonic() when it went out


class Claims:
    """Claims for one drain over ``queues`` (in turn, starting at ``cursor``)."""

    def __init__(self, statements: Statements, pipeline: Pipeline | None, outcomes: Outcomes,
                 report: RunReport, tasks: dict[str, Task], *, batch_size: int,
                 max_jobs: int | None, depth: int, combine: bool,
                 lease: Callable[[Task], float],
                 run_in_transaction: Callable[[Task, int], int],
                 free_slots: Callable[[], int] | None = None,
                 room: Callable[[Task], int] | None = None,
                 probe: Callable[[], float | None] | None = None) -> None:
        self.q = statements
        self.pipeline = pipeline
        self.outcomes = outcomes
        self.report = report
        self.queues = report.queues
        self.tasks = tasks
        self.batch_size = batch_size
        self.max_jobs = max_jobs
        self.depth = depth if pipeline is not None else 1
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
        self.ahead: list[_Ahead] = []
        self.clock = BatchClock()  # batch times and round trips (the drain loop's clock)
        # times a Sync alone on the idle connection (None: it cannot be), so that the clock
        # tells a database across a link from a local one on a busy disk (see time_link)
        self.probe = probe
        self.clock.probing = probe is not None
        self.last_size = batch_size  # the last claim's size (grown to the link or the slots)
        # a max_running queue's claim got less than it asked (the cap, or nothing due):
        # the report's finished count then; the drain claims again once it has finished
        # jobs since (it freed slots), instead of taking "nothing claimed" for "drained"
        self.capped_at: int | None = None
        # rate-limited queues whose last claim left due jobs for a later slot: when the
        # window next has room, and how many due jobs the claim left (the report's count)
        self.rate_next: dict[str, datetime] = {}
        self.rate_limited: dict[str, int] = {}
        # the next slot each queue was claimed again for (once a slot: a clock running
        # ahead of the database's never turns into a loop of empty claims)
        self.rate_tried: dict[str, datetime] = {}

    # -- sizes and queues ---------------------------------------------------------------------
    def size(self, idx: int | None = None) -> int:
        """The next claim's size for queue ``idx`` (default: the cursor's): a batch, or as
        many as there are free handler slots when that is more (up to MAX_CLAIM), so that
        200 handlers are not fed 10 jobs a round trip."""
        task = self._task(self.cursor if idx is None else idx)
        batch = self.batch_size
        if not task.transaction:
            batch = self.clock.adapted(batch, MAX_CLAIM)
        if self.room is not None and not task.transaction:
            batch = max(batch, min(MAX_CLAIM, self.room(task)))
        if task.rate_limit is not None:  # only what starts at once: a slot is a start
            batch = min(batch, self.start_now())
        # claims in flight hold at most `depth` claims of this size (one before the round
        # trip and the handlers' speed are measured), and never more than MAX_CLAIM jobs
        window = max(batch, min(MAX_CLAIM, batch * self.clock.depth(batch, self.depth)))
        return claim_size(batch, self.max_jobs, self.report.claimed,
                          sum(a.size for a in self.ahead), window)

    def start_now(self) -> int:
        """The jobs of an in-step or combined claim that start at once."""
        return max(1, self.free_slots())

    def _task(self, idx: int) -> Task:
        return self.tasks[self.queues[idx]]

    def time_link(self) -> None:
        """Time Syncs alone, back to back, while the clock wants them (LINK_PROBES across a
        link, locally one or two: the first after a batch can be slow). The drain loop calls
        it when nothing else runs: no claim in flight, no handler (a handler thread holding
        the GIL when the answer comes would be timed too)."""
        while self.probe is not None and self.clock.wants_probe():
            assert not self.ahead, "claims in flight: receive them first"
            seconds = self.probe()
            if seconds is None:  # the connection could not take one: claims' times only
                self.clock.probing = False
                return
            self.clock.link_round_trip(seconds)

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

    # -- in step ------------------------------------------------------------------------------
    def claim(self, *, with_successes: bool = False) -> tuple[Batch, bool]:
        """Claim the next batch now. Returns the rows (transaction-mode batches are run and
        recorded right here) and whether anything was claimed (False: nothing due).

        ``with_successes``: the buffered successes go in the same statement when the next
        queue allows it (failures are written first, on their own).
        """
        assert not self.ahead, "claims in flight: receive them first"
        start = self.cursor
        if with_successes and self.can_combine():
            if self.size() <= 0:
                self.outcomes.write()
                return [], False
            self.outcomes.write_failures()
            combined = self._combined(start)
            if combined is not None:
                return combined
            if len(self.queues) == 1:
                return [], False
            return self._in_step((start + 1) % len(self.queues), len(self.queues) - 1)
        return self._in_step(start, len(self.queues))

    def can_combine(self) -> bool:
        """Whether the successes can go with the next claim (of the queue at the cursor)."""
        return bool(self.outcomes.ok) and self.combine and self._may_combine(self.cursor)

    def _may_combine(self, idx: int) -> bool:
        """A queue whose claims may go with completions and ahead (see :func:`combinable`)."""
        return combinable(self._task(idx))

    def known_due(self, names: list[str]) -> None:
        """The queues with due jobs, as read by the run's first statement: the first sweep
        claims only these (none: the run claims nothing), whatever the number of queues."""
        self.due = {i for i, name in enumerate(self.queues) if name in set(names)}
        self.due_fresh = True

    def claimed_first(self, rows: list[db.ClaimedRow], size: int) -> Batch:
        """The rows of the run's first claim, which went out with run_start (claim_first,
        of ``size``): counted as the loop's first in-step claim would have been (the cursor
        moves on, a short claim leaves its queue dry). Call after :meth:`known_due`."""
        idx = self.queues.index(rows[0].queue)
        task = self._task(idx)
        self.due_fresh = False
        self._took(idx, size, len(rows))
        return [(task, r) for r in rows]

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
            if task.rate_limit is not None:
                rows = self._claim_rated(task, size)
            elif task.max_running is not None:
                rows = self.q.claim_batch_capped(task.queue, size, self.lease(task),
                                                 task.max_running, start_now=self.start_now(),
                                                 run_id=self.report.run_id)
                if len(rows) < size:
                    self.capped_at = self.report.finished
            else:
                rows = self.q.claim_batch(task.queue, size, self.lease(task),
                                          start_now=self.start_now(),
                                          run_id=self.report.run_id)
            self.clock.round_trip(time.monotonic() - sent)
            if len(rows) < size:
                self._dry(idx)
            if rows:
                self._took(idx, size, len(rows))
                return [(task, r) for r in rows], True
        return [], False

    def _claim_rated(self, task: Task, size: int) -> list[db.ClaimedRow]:
        """A rate-limited queue's claim; notes when its window next has room."""
        assert task.rate_limit is not None
        rows, next_at, limited = self.q.claim_batch_rated(
            task.queue, size, self.lease(task), task.max_running, task.rate_limit,
            start_now=self.start_now(), run_id=self.report.run_id)
        if task.max_running is not None and len(rows) < size and not limited:
            self.capped_at = self.report.finished  # short by the cap: slots free as jobs end
        if limited and next_at is not None:
            self.rate_next[task.queue] = next_at
            self.rate_limited[task.queue] = limited
        else:
            self.rate_next.pop(task.queue, None)
            self.rate_limited.pop(task.queue, None)
        self.report.rate_limited = sum(self.rate_limited.values())
        return rows

    def next_rate_slot(self, now: datetime) -> datetime | None:
        """The earliest next slot of a rate-limited queue whose last claim left due jobs."""
        return min((t for t in self.rate_next.values() if t > now), default=None)

    def rate_slot_open(self, now: datetime) -> bool:
        """A rate-limited queue left due jobs and its window has room again by now: claim
        again (once for each next slot)."""
        opened = {q: t for q, t in self.rate_next.items()
                  if t <= now and self.rate_tried.get(q) != t}
        self.rate_tried.update(opened)
        return bool(opened)

    def _dry(self, idx: int) -> None:
        if self.due is not None:
            self.due.discard(idx)

    def _combined(self, idx: int) -> tuple[Batch, bool] | None:
        """Successes + claim of queue ``idx`` in one statement; None: nothing claimed there."""
        task = self._task(idx)
        size = self.size(idx)
        buf = self.outcomes.take_successes()
        try:
            sent = time.monotonic()
            written, rows = self.q.complete_many_and_claim(
                [o.job.id for o in buf], [o.job.fence for o in buf], task.queue, size,
                self.lease(task), start_now=self.start_now(), run_id=self.report.run_id,
                **self.outcomes.completion(buf))
            self.clock.round_trip(time.monotonic() - sent)
        except psycopg.errors.DeadlockDetected as exc:
            # the statement rolled back whole (nothing completed, nothing claimed): write
            # and claim in two statements instead, which cannot take part in a cycle
            logger.warning("combined completion and claim deadlocked, retrying as two "
                           "statements: %s", db.one_line(exc),
                           extra={"run_id": self.report.run_id})
            self.outcomes.put_back(buf)
            self.outcomes.write()
            return self._in_step(idx, len(self.queues))
        self.outcomes.written(buf, written)
        if not rows:
            return None
        self._took(idx, size, len(rows))
        return [(task, r) for r in rows], True

    def freed_capped_slots(self) -> bool:
        """Whether a max_running queue came back short and jobs finished since: claim
        again (once per short claim)."""
        if self.capped_at is None or self.report.finished <= self.capped_at:
            return False
        self.capped_at = None
        return True

    # -- ahead --------------------------------------------------------------------------------
    def can_send_ahead(self) -> bool:
        """Whether a combined statement may go out now, ahead of the batch in hand (the
        drain loop also asks whether batches run fast and nothing else is due)."""
        # while Syncs are to be timed, one claim at a time: the drain then has moments with
        # none in flight, when a Sync is timed (claims grown to the free handler slots
        # would otherwise keep one in flight throughout)
        return (self.depth >= 2 and self.last_full and not self.outcomes.failed
                and len(self.ahead) < (1 if self.clock.wants_probe() else self.depth)
                and self.combine
                and self._may_combine(self.cursor) and self.size() > 0)

    def send_ahead(self) -> None:
        """Send the buffered successes and the next claim without waiting for the result."""
        assert self.pipeline is not None
        task = self._task(self.cursor)
        size = self.size()
        buf = self.outcomes.take_successes()
        # claimed ahead: none starts at once (an expired lease gives their attempts back)
        self.pipeline.send([o.job.id for o in buf], [o.job.fence for o in buf], task.queue,
                           size, self.lease(task), 0, self.report.run_id,
                           *self.outcomes.completion(buf).values())
        self.ahead.append(_Ahead(buf, self.cursor, size, time.monotonic()))

    def receive(self) -> Batch:
        """Read the oldest statement in flight: count what it wrote, return what it claimed."""
        assert self.pipeline is not None
        sent = self.ahead.pop(0)
        try:
            waited = time.monotonic()
            result = self.pipeline.receive()
            now = time.monotonic()
            # a round trip when the read mostly waited for the server (not when the result
            # was back already and the time in flight was the batch in hand running)
            if now - waited >= (now - sent.sent) / 2:
                self.clock.round_trip(now - sent.sent)
        except psycopg.errors.DeadlockDetected as exc:
            return self._deadlocked(sent, exc)
        return self._received(sent, result)

    def settle(self) -> Batch:
        """Read every statement in flight, so that the connection can run another; an
        error is raised once all are read (their results count)."""
        if not self.ahead:
            return []
        assert self.pipeline is not None
        sent, self.ahead = self.ahead, []
        batch: Batch = []
        error: BaseException | None = None
        for ahead, result in zip(sent, self.pipeline.close(), strict=True):
            if isinstance(result, psycopg.errors.DeadlockDetected):
                self._deadlocked(ahead, result)
            elif isinstance(result, BaseException):
                error = error or result
            else:
                batch.extend(self._received(ahead, result))
        if error is not None:
            raise error
        return batch

    def _received(self, sent: _Ahead, result: tuple[set[int], list[db.ClaimedRow]]) -> Batch:
        written, rows = result
        self.outcomes.written(sent.successes, written)
        self._took(sent.idx, sent.size, len(rows), in_step=False)
        task = self._task(sent.idx)
        return [(task, r) for r in rows]

    def _deadlocked(self, sent: _Ahead, exc: BaseException) -> Batch:
        # it rolled back whole: nothing written, nothing claimed; write them again later
        logger.warning("pipelined completion and claim deadlocked, writing again: %s",
                       db.one_line(exc), extra={"run_id": self.report.run_id})
        self.outcomes.put_back(sent.successes)
        self.last_full = False
        return []
