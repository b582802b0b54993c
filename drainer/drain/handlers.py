"""The jobs handed to handlers and not finished yet, and their outcomes.

Nothing here touches the database: :class:`Handlers` takes jobs to run and hands back
their :class:`~drainer.drain.calls.Outcome`; the drain loop decides what to write. Sync
handlers run on ``concurrency`` threads, async handlers as tasks on one long-lived event
loop per drain (:mod:`drainer.drain.execute`), a job with a timeout on a thread of its own.
"""

from __future__ import annotations

import queue as queue_mod
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from drainer.drain.calls import JobContext, Outcome, Running, call
from drainer.drain.execute import EventLoopThread, HandlerThreads
from drainer.job import DEFAULT_RESULT_MAX_BYTES

if TYPE_CHECKING:
    from drainer.registry import Task

class Handlers:
    """The jobs handed to handlers and not finished yet (``running``), and their outcomes.

    A job with a timeout gets a thread of its own (abandoned, told to stop, when the
    timeout passes); the others go to ``concurrency`` handler threads, queued ahead so
    that those never wait for the drain loop between jobs.
    """

    def __init__(self, concurrency: int, batch_size: int, default_timeout: float | None,
                 may_start: Callable[[], bool], context: JobContext | None = None) -> None:
        self.concurrency = concurrency
        self.context = context  # what each handler call runs in (None: nothing)
        self.batch_size = batch_size
        self.default_timeout = default_timeout
        self.may_start = may_start
        self.lock = threading.Lock()
        self.running: dict[int, Running] = {}
        self.timed: dict[int, Running] = {}  # those of `running` with a timeout
        # outcomes one at a time (handler threads) or a loop iteration's at once (the loop)
        self.done_q: queue_mod.SimpleQueue[Outcome | list[Outcome]] = queue_mod.SimpleQueue()
        #: Outcomes put in done_q and not collected yet (read by the watchdog's estimate).
        self.uncollected = 0
        self.count_lock = threading.Lock()
        self.pool: HandlerThreads | None = None
        self.loop: EventLoopThread | None = None
        self.result_max_bytes = DEFAULT_RESULT_MAX_BYTES

    def in_flight(self) -> int:
        # finish() marks a job done and removes it under the lock, so every job left in
        # `running` is still in flight
        return len(self.running)

    def executing(self) -> int:
        """Handlers executing now (read from another thread, the watchdog's: an estimate):
        in flight, minus the outcomes not collected yet and the jobs queued to threads but
        not started. A drain blocked on a silent database collects nothing: its finished
        handlers do not count."""
        pool, loop = self.pool, self.loop
        queued = (0 if pool is None else len(pool.work)) + \
            (0 if loop is None else len(loop.waiting))
        return max(0, self.in_flight() - self.uncollected - queued)

    def slots(self, r: Running) -> int:
        """How many jobs may be in flight before ``r`` starts.

        Handler threads get jobs queued ahead (one each; the whole batch when sequential);
        queued jobs that have not started are taken back and released on shutdown.
        """
        if r.timeout_at is not None:
            return self.concurrency  # a thread of its own, started at once
        return self.concurrency + (self.batch_size if self.concurrency == 1
                                   else self.concurrency)

    def free(self, task: Task) -> int:
        """How many more jobs of ``task`` could be handed over now (a claim's size follows
        it, so that a claim of 10 does not leave 190 of 200 handlers idle)."""
        return self.room()

    def room(self) -> int:
        """How many more jobs could be handed over now: the handlers and the jobs queued
        ahead of them, less those in flight."""
        queued_ahead = 0 if self.concurrency == 1 else self.concurrency
        return max(0, self.concurrency + queued_ahead - self.in_flight())

    def start(self, r: Running) -> None:
        self.start_many([r])

    def start_many(self, rs: list[Running]) -> None:
        """Hand ``rs`` to their handlers: one lock and one wake-up of the event loop or the
        handler threads for all of them, not one a job."""
        with self.lock:
            for r in rs:
                self.running[r.job.id] = r
                if r.timeout_at is not None:
                    self.timed[r.job.id] = r
        self.ready(rs)
        to_loop: list[tuple[Running, float | None]] = []
        to_pool: list[Running] = []
        for r in rs:
            if r.task.is_async:
                to_loop.append((r, self.timeout(r.task)))
            elif r.timeout_at is not None:
                threading.Thread(target=self._thread_main, args=(r,), daemon=True,
                                 name=f"drainer-job-{r.job.id}").start()
            else:
                to_pool.append(r)
        if to_loop:
            assert self.loop is not None
            self.loop.submit_many(to_loop, self._put)
        if to_pool:
            assert self.pool is not None
            self.pool.submit_many(to_pool)

    def ready(self, rs: list[Running]) -> None:
        """Start the threads ``rs`` will run on (the event loop's, the handler threads),
        once a run: the drain loop calls it before it times a batch, so that a batch's time
        is its jobs' (the first batch's 10 no-op jobs took 3.5 ms, 3.3 of them starting a
        thread on a busy machine, and the claims after it were sized for 350 us a job: 143
        jobs instead of 512, two more round trips before the pipeline was full 10 ms away)."""
        if self.loop is None and any(r.task.is_async for r in rs):
            self.loop = EventLoopThread(self.concurrency, self.may_start, self.context)
            self.loop.result_max_bytes = self.result_max_bytes
        if self.pool is None and any(not r.task.is_async and r.timeout_at is None for r in rs):
            # Never on the main thread: a signal must be able to release the unstarted jobs
            # at once and to cut a handler short after the grace period.
            self.pool = HandlerThreads(self.concurrency, self._thread_main, self.may_start)

    def _thread_main(self, r: Running) -> None:
        try:
            outcome = call(r.task, r.job, self.result_max_bytes, self.context)
        except BaseException as exc:  # a lost outcome would leave the drain waiting forever
            outcome = Outcome(r.job, r.task, False,
                              f"{type(exc).__name__} while running the handler")
        self._put(outcome)

    def _put(self, outcome: Outcome | list[Outcome]) -> None:
        with self.count_lock:
            self.uncollected += len(outcome) if isinstance(outcome, list) else 1
        self.done_q.put(outcome)

    def wait(self, block_for: float, want: int = 1) -> list[tuple[Outcome, Running]]:
        """Outcomes of the handlers that finished (waiting up to ``block_for`` seconds for
        ``want`` of them: one wake-up of the drain loop for many jobs, not one a job), with
        their jobs; handlers past their timeout are abandoned and come back as failures."""
        finished: list[tuple[Outcome, Running]] = []
        until = time.monotonic() + block_for
        got: list[Outcome] = []
        while len(got) < want:
            left = until - time.monotonic()
            if left <= 0:
                break
            try:
                self._got(self.done_q.get(timeout=left), got)
            except queue_mod.Empty:
                continue
        # then what is queued now, not what keeps coming: with 1,000 tasks ending a few a
        # turn of the event loop, "until the queue is empty" held the drain loop (and the
        # claim that refills the handlers) here for as long as they kept ending
        for _ in range(self.done_q.qsize()):
            try:
                self._got(self.done_q.get_nowait(), got)
            except queue_mod.Empty:
                break
        if got:
            with self.count_lock:
                self.uncollected -= len(got)
            with self.lock:
                for outcome in got:
                    self._finish(outcome, finished)
        now = time.monotonic()
        with self.lock:  # only the jobs with a timeout: not every job in flight each step
            expired = [r for r in self.timed.values()
                       if not r.done and r.timeout_at is not None and now >= r.timeout_at]
        for r in expired:
            r.job.cancelled.set()
            if self.loop is not None:
                self.loop.cancel(r)
            with self.lock:
                self._finish(Outcome(r.job, r.task, False,
                                     f"TimeoutError: handler exceeded its timeout of "
                                     f"{self.timeout(r.task)}s (abandoned, told to stop)",
                                     round(now - r.started, 6)), finished)
        return finished

    @staticmethod
    def _got(item: Outcome | list[Outcome], got: list[Outcome]) -> None:
        if isinstance(item, list):
            got.extend(item)
        else:
            got.append(item)

    def wait_sequential(self, block_for: float) -> bool:
        """Sequential handlers: sleep until the handler thread has run all it was given
        (one wake-up a batch, not one a job). False when there is no such wait to do."""
        if self.concurrency != 1 or self.pool is None or self.pool.idle.is_set():
            return False
        self.pool.idle.wait(block_for)
        return True

    def _finish(self, outcome: Outcome, into: list[tuple[Outcome, Running]]) -> None:
        """(Under ``lock``.) Take ``outcome``'s job out of those in flight."""
        r = self.running.get(outcome.job.id)
        if r is None or r.done or r.job is not outcome.job:
            return  # a late result of an abandoned (timed-out) handler
        r.done = True
        del self.running[outcome.job.id]
        self.timed.pop(outcome.job.id, None)
        into.append((outcome, r))

    def timeout(self, task: Task) -> float | None:
        return task.timeout if task.timeout is not None else self.default_timeout

    def take_back(self) -> list[Running]:
        """Jobs queued to handler threads that no thread has picked up: no longer ours to
        run (the caller releases them)."""
        taken = [] if self.pool is None else self.pool.take_back()
        if self.loop is not None:
            taken.extend(self.loop.take_back())
        with self.lock:
            for r in taken:
                r.done = True
                self.running.pop(r.job.id, None)
                self.timed.pop(r.job.id, None)
        return taken

    def still_running(self) -> list[Running]:
        with self.lock:
            return [r for r in self.running.values() if not r.done]

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
        if self.loop is not None:
            self.loop.shutdown()
