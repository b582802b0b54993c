"""Calling handlers: sync and async, timeouts, errors as stored text, the handler threads.

Nothing here touches the database: :class:`Handlers` takes jobs to run and hands back
their :class:`Outcome`; the drain loop decides what to write. The loop uses only
``start_many``, ``wait``, ``in_flight``, ``slots``, ``room``/``free``, ``take_back`` and
``still_running``.

Sync handlers run on ``concurrency`` threads; async handlers run as tasks on ONE
long-lived event loop per drain (:class:`EventLoopThread`), ``concurrency`` of them in
flight, so that a client made once (an ``httpx.AsyncClient``, an ``asyncio.Lock`` at module
level) serves every job of the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import queue as queue_mod
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from drainer.job import DEFAULT_RESULT_MAX_BYTES, Job, Snooze
from drainer.registry import Task

if TYPE_CHECKING:
    from drainer.db import ClaimedRow

#: Longest error text kept in last_error.
MAX_ERROR_CHARS = 4000


@dataclass(slots=True)
class Outcome:
    """What running one job came to. ``ok``: it succeeded; else ``error`` says why.

    (New kinds of outcome, such as a snooze or a result, are new fields here and new
    buffers in :mod:`drainer.drain.outcomes`.)
    """

    job: Job
    task: Task
    ok: bool
    error: str | None = None
    duration_s: float = 0.0
    result: str | None = None
    """What the handler returned, as JSON text (None: it returned None)."""
    snooze: float | None = None
    """The handler raised Snooze(seconds): back to queued, no attempt used."""
    discard: bool = False
    """The failure is one the task discards (``discard_on``/``retry_on``): failed at once."""
    max_attempts: int | None = None
    """Overrides the task's max_attempts for this failure (0: failed at once)."""


@dataclass
class Running:
    """A claimed job from its claim to its outcome: its lease and its timeout."""

    job: Job
    task: Task
    lease: float
    started: float  # when it was claimed (time.monotonic())
    timeout_at: float | None
    lease_expires: float
    lost: bool = False
    done: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def make_running(task: Task, row: ClaimedRow, lease: float, timeout: float | None) -> Running:
    """The job a handler gets for a claimed row, with its lease and timeout clocks.

    (Recording when a handler starts is one more field here, set by :meth:`Handlers.start`.)
    """
    now = time.monotonic()
    deadline = row.locked_until if timeout is None else (
        datetime.now(timezone.utc) + timedelta(seconds=timeout))
    job = Job(row.id, row.queue, row.payload, row.attempts,
              task.max_attempts or row.max_attempts, deadline,
              fence=row.attempts if row.fence is None else row.fence,
              trace_context=row.trace_context)
    return Running(job, task, lease, now, None if timeout is None else now + timeout,
                   now + lease)


def format_error(exc: BaseException, limit: int = MAX_ERROR_CHARS) -> str:
    """``Type: message`` and the end of the traceback, as kept in last_error.

    Never raises, and returns text PostgreSQL can store: an exception whose ``str()``
    fails, a NUL byte or a lone surrogate in the message must not crash the run.
    """
    try:
        message = str(exc)
    except Exception:
        message = f"<unprintable {type(exc).__name__}>"
    head = f"{type(exc).__name__}: {message}".strip()
    try:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:
        tb = ""
    text = head + "\n" + tb
    if len(text) > limit:
        text = head[: limit // 2] + "\n...\n" + tb[-(limit // 2):]
    return _storable(text)


def _storable(text: str) -> str:
    """``text`` without what a PostgreSQL text column refuses (NUL, invalid UTF-8)."""
    text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


_NO_CONTEXT: AbstractContextManager[None] = nullcontext()


def _no_context(task: Task, job: Job) -> AbstractContextManager[Any]:
    return _NO_CONTEXT


#: What every handler call runs in: a context manager given the task and the job, whose
#: value (when not None) is told how the handler ended (drainer.otel sets it to the job's
#: span for a traced run).
job_context: Callable[[Task, Job], AbstractContextManager[Any]] = _no_context


def call(task: Task, job: Job, result_max_bytes: int = DEFAULT_RESULT_MAX_BYTES) -> Outcome:
    """Run one handler and catch whatever it raises."""
    started = time.monotonic()
    with job_context(task, job) as span:
        outcome = _call_handler(task, job, result_max_bytes)
        if span is not None:
            span.ended(outcome.ok, outcome.error)
    outcome.duration_s = round(time.monotonic() - started, 6)
    return outcome


def _call_handler(task: Task, job: Job, result_max_bytes: int) -> Outcome:
    try:
        if task.is_async:
            coro = task.func(job)
            if task.timeout is not None:
                value = asyncio.run(asyncio.wait_for(coro, task.timeout))
            else:
                value = asyncio.run(coro)
        else:
            value = task.func(job)
    except BaseException as exc:  # a handler may raise anything, SystemExit included
        return raised(task, job, exc, task.timeout)
    return returned(task, job, value, result_max_bytes)


def raised(task: Task, job: Job, exc: BaseException, timeout: float | None) -> Outcome:
    """The outcome of a handler that raised ``exc`` (Snooze, a timeout, anything else)."""
    if isinstance(exc, Snooze):
        return Outcome(job, task, False, str(exc), snooze=exc.seconds)
    if isinstance(exc, asyncio.TimeoutError):
        return Outcome(job, task, False, f"TimeoutError: handler exceeded its timeout of "
                       f"{timeout}s")
    if isinstance(exc, asyncio.CancelledError):
        return Outcome(job, task, False, "CancelledError: handler cancelled")
    return Outcome(job, task, False, format_error(exc), discard=task.discards(exc))


def returned(task: Task, job: Job, value: Any, result_max_bytes: int) -> Outcome:
    """The outcome of a handler that returned ``value`` (kept as the job's result)."""
    if value is None:
        return Outcome(job, task, True)
    try:
        result = result_json(value, result_max_bytes)
    except ResultError as exc:
        return Outcome(job, task, False, f"ResultError: {exc}")
    return Outcome(job, task, True, result=result)


class ResultError(ValueError):
    """A handler's return value that cannot be kept: not JSON-serialisable, or too big."""


def result_json(value: Any, max_bytes: int) -> str:
    """A handler's return value as the JSON text kept in ``result``; ResultError if it
    cannot be serialised or is larger than ``max_bytes``."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ResultError(f"the handler's return value is not JSON-serialisable ({exc}); "
                          "return None, or a dict/list/str/number") from None
    if "\\u0000" in text:
        raise ResultError("the handler's return value contains a NUL character, which "
                          "PostgreSQL's jsonb refuses") from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ResultError("the handler's return value has text that is not valid UTF-8 "
                          "(a lone surrogate)") from None
    if size > max_bytes:
        raise ResultError(f"the handler's return value is {size} bytes of JSON, more than "
                          f"result_max_bytes ({max_bytes}): store it elsewhere and return a "
                          "reference") from None
    return text


class Handlers:
    """The jobs handed to handlers and not finished yet (``running``), and their outcomes.

    A job with a timeout gets a thread of its own (abandoned, told to stop, when the
    timeout passes); the others go to ``concurrency`` handler threads, queued ahead so
    that those never wait for the drain loop between jobs.
    """

    def __init__(self, concurrency: int, batch_size: int, default_timeout: float | None,
                 may_start: Callable[[], bool]) -> None:
        self.concurrency = concurrency
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

    def slots(self, r: Running) -> int:
        """How many jobs may be in flight before ``r`` starts.

        Handler threads get jobs queued ahead (one each; the whole batch when sequential);
        queued jobs that have not started are taken back and released on shutdown.
        """
        if r.timeout_at is not None:
            return self.concurrency  # a thread of its own, started at once
        return self.concurrency + (self.batch_size if self.concurrency == 1
                                   else self.concurrency)

    def has_room(self, r: Running) -> bool:
        return self.in_flight() < self.slots(r)

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
            if self.loop is None:
                self.loop = EventLoopThread(self.concurrency, self.may_start)
                self.loop.result_max_bytes = self.result_max_bytes
            self.loop.submit_many(to_loop, self._put)
        if to_pool:
            # Never on the main thread: a signal must be able to release the unstarted jobs
            # at once and to cut a handler short after the grace period.
            if self.pool is None:
                self.pool = HandlerThreads(self.concurrency, self._thread_main,
                                           self.may_start)
            self.pool.submit_many(to_pool)

    def _thread_main(self, r: Running) -> None:
        try:
            outcome = call(r.task, r.job, self.result_max_bytes)
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

    def __init__(self, limit: int, may_start: Callable[[], bool]) -> None:
        self.limit = limit
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
        """One job's task: its handler (as :func:`_run_async`, inlined: this runs for every
        job), then :meth:`_ended`."""
        task, job = r.task, r.job
        started = time.monotonic()
        try:
            if job_context is _no_context and timeout is None:
                # the common case without a context manager around it (no tracing, no
                # timeout): the same outcomes as below, less interpreter work a job, on the
                # thread every handler shares
                try:
                    value = await task.func(job)
                except BaseException as exc:  # a handler may raise anything
                    outcome = raised(task, job, exc, timeout)
                else:
                    outcome = Outcome(job, task, True) if value is None else \
                        returned(task, job, value, self.result_max_bytes)
            else:
                with job_context(task, job) as span:
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


async def _run_async(task: Task, job: Job, timeout: float | None,
                     result_max_bytes: int = DEFAULT_RESULT_MAX_BYTES) -> Outcome:
    """One async handler on the drain's loop, its errors, timeout, snooze and result taken
    like :func:`call`'s (and in the same job context: the span is current inside it)."""
    started = time.monotonic()
    with job_context(task, job) as span:
        try:
            coro = task.func(job)
            if timeout is not None:
                value = await asyncio.wait_for(coro, timeout)
            else:
                value = await coro
        except BaseException as exc:  # a handler may raise anything, SystemExit included
            outcome = raised(task, job, exc, timeout)
        else:
            outcome = returned(task, job, value, result_max_bytes)
        if span is not None:
            span.ended(outcome.ok, outcome.error)
    outcome.duration_s = round(time.monotonic() - started, 6)
    return outcome


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
