"""Where handlers run: N daemon threads for sync handlers, one event loop on a thread of
its own for async ones (so that a client made once, an ``httpx.AsyncClient`` or an
``asyncio.Lock`` at module level, serves every job of the drain)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections import deque
from collections.abc import Callable

from drainer.drain import calls
from drainer.drain.calls import (
    NO_CONTEXT,
    JobContext,
    Outcome,
    Running,
    raised,
    returned,
)
from drainer.job import DEFAULT_RESULT_MAX_BYTES


class EventLoopThread:
    """One event loop on a daemon thread for the whole drain: async handlers run on it as
    tasks (``asyncio.wait_for`` for their timeouts), at most ``limit`` at once, their
    outcomes handed back through ``done``, those of one turn of the loop as one list, or
    ``hand_back_at`` at a time in a long turn (1,000 tasks whose sleeps end together wake
    the drain loop at most 8 times, the first after an eighth of them, not after the whole
    turn, tens of ms later). Jobs handed over beyond the
    limit wait here (queued ahead, as for the handler threads), start on the loop's thread
    as soon as a task ends, and can be taken back on shutdown.
    Like the handler threads it does not hold up the process's exit: a task still running
    after the grace period is left to its lease."""

    def __init__(self, limit: int, may_start: Callable[[], bool],
                 context: JobContext | None = None) -> None:
        self.limit = limit
        self.job_context = context
        self.may_start = may_start
        self.result_max_bytes = DEFAULT_RESULT_MAX_BYTES  # the Handlers' (result_max_bytes)
        self.active = 0
        self.waiting: deque[tuple[Running, float | None]] = deque()
        # outcomes of this turn of the loop, handed back together at its end (loop's thread)
        self.ended: list[Outcome] = []
        #: ended tasks handed back at once, within a turn (see :meth:`_ended`)
        self.hand_back_at = max(64, limit // 8)
        self.done: Callable[[list[Outcome]], None] = lambda outcomes: None
        self.loop = asyncio.new_event_loop()
        # the task of each Running (by id(): a job retried in the same drain is a new one),
        # touched on the loop's thread only
        self.tasks: dict[int, asyncio.Task[None]] = {}
        # the context each task starts from (a copy a task): the submitting thread's, as
        # captured at the last hand-over, never another job's (a task started in the place
        # of one that ended is made in that one's context otherwise)
        self.context = contextvars.copy_context()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._main, daemon=True,
                                       name="drainer-event-loop")
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def submit(self, r: Running, timeout: float | None,
               done: Callable[[list[Outcome]], None]) -> None:
        """Run ``r``'s handler; ``done`` is given a list of outcomes (``r``'s among them)."""
        self.submit_many([(r, timeout)], done)

    def submit_many(self, jobs: list[tuple[Running, float | None]],
                    done: Callable[[list[Outcome]], None]) -> None:
        """Run the handlers of ``jobs`` (each with its timeout); ``done`` is given the
        outcomes, a list at a time. Jobs handed over together wake the loop once."""
        self.done = done
        self.context = contextvars.copy_context()
        with self.lock:
            wake = not self.waiting and self.active < self.limit
            self.waiting.extend(jobs)
        if wake:
            self.loop.call_soon_threadsafe(self._pump)

    def _pump(self) -> None:
        """Start waiting jobs while fewer than ``limit`` run (on the loop's thread)."""
        while True:
            with self.lock:
                if not self.waiting or self.active >= self.limit or not self.may_start():
                    return
                n = min(len(self.waiting), self.limit - self.active)
                starting = [self.waiting.popleft() for _ in range(n)]
                self.active += n
            for r, timeout in starting:
                self._create(r, timeout)

    def take_back(self) -> list[Running]:
        with self.lock:
            taken = [r for r, _ in self.waiting]
            self.waiting.clear()
        return taken

    async def _run(self, r: Running, timeout: float | None) -> None:
        """One job's task: its handler, its errors, timeout, snooze and result taken as
        :func:`call` takes them (in the job's context: its span is current inside), then
        :meth:`_ended`."""
        task, job = r.task, r.job
        started, before = time.monotonic(), calls.forks
        context = self.job_context
        try:
            if context is None and timeout is None:
                # the common case without a context manager around it (no tracing, no
                # timeout): the same outcomes as below, less interpreter work a job, on the
                # thread every handler shares
                try:
                    value = await task.func(job)
                except BaseException as exc:  # a handler may raise anything
                    outcome = raised(task, job, exc, timeout)
                else:
                    outcome = Outcome(job, task, True) if value is None \
                        and not job.followups else \
                        returned(task, job, value, self.result_max_bytes)
            else:
                with NO_CONTEXT if context is None else context(task, job) as span:
                    try:
                        coro = task.func(job)
                        value = await (coro if timeout is None
                                       else asyncio.wait_for(coro, timeout))
                    except BaseException as exc:  # a handler may raise anything
                        outcome = raised(task, job, exc, timeout)
                    else:
                        outcome = returned(task, job, value, self.result_max_bytes)
                    if span is not None:
                        span.ended(outcome.ok, outcome.error)
        except BaseException as exc:  # a lost outcome would leave the drain waiting forever
            outcome = Outcome(job, task, False, f"{type(exc).__name__} while running the "
                              "handler")
        calls.end_if_forked(before)
        outcome.duration_s = round(time.monotonic() - started, 6)
        self._ended(r, outcome)

    def _ended(self, r: Running, outcome: Outcome) -> None:
        """``r``'s task is over (once: a task cancelled before it began is ended by
        :meth:`cancel`'s callback): its outcome goes back with the others of this turn of
        the loop, and a job waiting starts in its place."""
        if self.tasks.pop(id(r), None) is None:
            return
        if not self.ended:
            self.loop.call_soon(self._hand_back)
        self.ended.append(outcome)
        if len(self.ended) >= self.hand_back_at:
            # a turn that ends hundreds of tasks takes tens of ms: hand back a share of the
            # slots now, so the claim that refills them goes out while the turn goes on
            self._hand_back()
        with self.lock:
            if not self.waiting or not self.may_start():
                self.active -= 1
                return
            nxt, timeout = self.waiting.popleft()
        self._create(nxt, timeout)

    def _create(self, r: Running, timeout: float | None) -> None:
        # Context.run: the task copies the hand-over's context (create_task(context=) is
        # Python 3.11+ and would share one context among tasks)
        # (asyncio.Task itself, as loop.create_task makes it when no task factory is set:
        # one Python call less a job)
        if self.loop.get_task_factory() is None:
            task = self.context.run(asyncio.Task, self._run(r, timeout), loop=self.loop)
        else:
            task = self.context.run(self.loop.create_task, self._run(r, timeout))
        self.tasks[id(r)] = task

    def _hand_back(self) -> None:
        """The outcomes of the tasks that ended in this turn of the loop, as one list."""
        ended, self.ended = self.ended, []
        if ended:
            self.done(ended)

    def cancel(self, r: Running) -> None:
        """Cancel the task of ``r`` (abandoned past its timeout)."""
        def cancel() -> None:
            task = self.tasks.get(id(r))
            if task is not None:
                task.cancel()
                task.add_done_callback(lambda _: self._ended(r, Outcome(
                    r.job, r.task, False, "CancelledError: handler cancelled")))
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(cancel)

    def shutdown(self) -> None:
        """Stop the loop once its tasks are done; tasks still running are left to their
        leases (the thread is a daemon)."""
        async def drain() -> None:
            while self.tasks:
                await asyncio.sleep(0.05)
            self.loop.stop()
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(drain()))


class HandlerThreads:
    """N daemon threads running handlers, fed from a queue the drain loop can take back.

    Daemon threads, unlike ThreadPoolExecutor's, do not hold up the process's exit: a
    handler still running after the grace period is left to its lease, as promised.
    Jobs queued but not picked up yet can be taken back and released on shutdown.
    """

    def __init__(self, n: int, target: Callable[[Running], None],
                 may_start: Callable[[], bool]) -> None:
        self.may_start = may_start
        self.cond = threading.Condition()
        self.work: deque[Running] = deque()
        self.active = 0  # jobs taken from `work` whose handler has not returned
        self.idle = threading.Event()  # set when nothing is queued or running
        self.idle.set()
        self.closed = False
        self.target = target
        self.threads = [threading.Thread(target=self._main, daemon=True,
                                         name=f"drainer-handler-{i}") for i in range(n)]
        for t in self.threads:
            t.start()

    def submit(self, r: Running) -> None:
        self.submit_many([r])

    def submit_many(self, rs: list[Running]) -> None:
        with self.cond:
            self.work.extend(rs)
            self.idle.clear()
            self.cond.notify(len(rs))

    def take_back(self) -> list[Running]:
        with self.cond:
            taken = list(self.work)
            self.work.clear()
            if not self.active:
                self.idle.set()
        return taken

    def _main(self) -> None:
        while True:
            with self.cond:
                # after a stop, queued-ahead jobs stay put for take_back() to release
                while (not self.work or not self.may_start()) and not self.closed:
                    self.cond.wait(0.05 if self.work else None)
                if not self.work:
                    return
                r = self.work.popleft()
                self.active += 1
            try:
                self.target(r)
            finally:
                with self.cond:
                    self.active -= 1
                    if not self.work and not self.active:
                        self.idle.set()

    def shutdown(self) -> None:
        with self.cond:
            self.closed = True
            self.work.clear()
            self.cond.notify_all()
