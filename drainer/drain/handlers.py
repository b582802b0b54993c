"""Calling handlers: sync and async, timeouts, errors as stored text, the handler threads.

Nothing here touches the database: :class:`Handlers` takes jobs to run and hands back
their :class:`Outcome`; the drain loop decides what to write. The loop uses only
``start``, ``wait``, ``in_flight``, ``has_room``/``slots``, ``take_back`` and
``still_running``, so async handlers on one long-lived event loop can be another class
with those methods (today each async handler gets its own ``asyncio.run``).
"""

from __future__ import annotations

import asyncio
import json
import queue as queue_mod
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from drainer.registry import Job, Snooze, Task

if TYPE_CHECKING:
    from drainer.db import ClaimedRow

#: Longest error text kept in last_error.
MAX_ERROR_CHARS = 4000

#: Largest handler result kept (its JSON text, in bytes): the ``result_max_bytes`` setting.
DEFAULT_RESULT_MAX_BYTES = 64 * 1024


@dataclass
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
              fence=row.attempts if row.fence is None else row.fence)
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


def call(task: Task, job: Job, result_max_bytes: int = DEFAULT_RESULT_MAX_BYTES) -> Outcome:
    """Run one handler and catch whatever it raises."""
    started = time.monotonic()
    outcome = _call_handler(task, job, result_max_bytes)
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
    except Snooze as snooze:
        return Outcome(job, task, False, str(snooze), snooze=snooze.seconds)
    except asyncio.TimeoutError:
        return Outcome(job, task, False, f"TimeoutError: handler exceeded its timeout of "
                       f"{task.timeout}s")
    except BaseException as exc:  # a handler may raise anything, SystemExit included
        return Outcome(job, task, False, format_error(exc), discard=task.discards(exc))
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
        self.done_q: queue_mod.SimpleQueue[Outcome] = queue_mod.SimpleQueue()
        self.pool: HandlerThreads | None = None
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
            return self.concurrency
        return self.concurrency + (self.batch_size if self.concurrency == 1
                                   else self.concurrency)

    def has_room(self, r: Running) -> bool:
        return self.in_flight() < self.slots(r)

    def start(self, r: Running) -> None:
        with self.lock:
            self.running[r.job.id] = r
        if r.timeout_at is not None:
            threading.Thread(target=self._thread_main, args=(r,), daemon=True,
                             name=f"drainer-job-{r.job.id}").start()
            return
        # Never on the main thread: a signal must be able to release the unstarted jobs
        # at once and to cut a handler short after the grace period.
        if self.pool is None:
            self.pool = HandlerThreads(self.concurrency, self._thread_main, self.may_start)
        self.pool.submit(r)

    def _thread_main(self, r: Running) -> None:
        try:
            outcome = call(r.task, r.job, self.result_max_bytes)
        except BaseException as exc:  # a lost outcome would leave the drain waiting forever
            outcome = Outcome(r.job, r.task, False,
                              f"{type(exc).__name__} while running the handler")
        self.done_q.put(outcome)

    def wait(self, block_for: float) -> list[tuple[Outcome, Running]]:
        """Outcomes of the handlers that finished (waiting up to ``block_for`` seconds for
        the first), with their jobs; handlers past their timeout are abandoned and come
        back as failures."""
        finished: list[tuple[Outcome, Running]] = []
        try:
            outcome: Outcome | None = self.done_q.get(timeout=block_for) if block_for > 0 \
                else self.done_q.get_nowait()
        except queue_mod.Empty:
            outcome = None
        while outcome is not None:
            self._finish(outcome, finished)
            try:
                outcome = self.done_q.get_nowait()
            except queue_mod.Empty:
                outcome = None
        now = time.monotonic()
        with self.lock:
            expired = [r for r in self.running.values()
                       if not r.done and r.timeout_at is not None and now >= r.timeout_at]
        for r in expired:
            r.job.cancelled.set()
            self._finish(Outcome(r.job, r.task, False,
                                 f"TimeoutError: handler exceeded its timeout of "
                                 f"{self.timeout(r.task)}s (abandoned, told to stop)",
                                 round(now - r.started, 6)), finished)
        return finished

    def wait_sequential(self, block_for: float) -> bool:
        """Sequential handlers: sleep until the handler thread has run all it was given
        (one wake-up a batch, not one a job). False when there is no such wait to do."""
        if self.concurrency != 1 or self.pool is None or self.pool.idle.is_set():
            return False
        self.pool.idle.wait(block_for)
        return True

    def _finish(self, outcome: Outcome, into: list[tuple[Outcome, Running]]) -> None:
        with self.lock:
            r = self.running.get(outcome.job.id)
            if r is None or r.done or r.job is not outcome.job:
                return  # a late result of an abandoned (timed-out) handler
            r.done = True
            del self.running[outcome.job.id]
        into.append((outcome, r))

    def timeout(self, task: Task) -> float | None:
        return task.timeout if task.timeout is not None else self.default_timeout

    def take_back(self) -> list[Running]:
        """Jobs queued to handler threads that no thread has picked up: no longer ours to
        run (the caller releases them)."""
        if self.pool is None:
            return []
        taken = self.pool.take_back()
        with self.lock:
            for r in taken:
                r.done = True
                self.running.pop(r.job.id, None)
        return taken

    def still_running(self) -> list[Running]:
        with self.lock:
            return [r for r in self.running.values() if not r.done]

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


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
        with self.cond:
            self.work.append(r)
            self.idle.clear()
            self.cond.notify()

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
