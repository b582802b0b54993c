"""Calling one handler: its outcome (success with a result, an error as stored text, a
snooze, a timeout), the job it ran as and its clocks. Nothing here touches the database or
a thread."""

from __future__ import annotations

import asyncio
import os
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from drainer.job import DEFAULT_RESULT_MAX_BYTES, Job, Snooze, storable_json

if TYPE_CHECKING:
    from drainer.db.queries import ClaimedRow
    from drainer.registry import Task

#: Longest error text kept in last_error.
MAX_ERROR_CHARS = 4000

#: How many times this process was forked into the child it is (os.register_at_fork): a
#: handler that forks and returns in both processes is seen by a count that changed across
#: the call, and its child ends there (:func:`end_if_forked`).
forks = 0


def _forked() -> None:
    global forks
    forks += 1


os.register_at_fork(after_in_child=_forked)


def end_if_forked(before: int) -> None:
    """In the child of a handler that forked (``forks`` changed since ``before``, taken when
    the handler was called), end the process at once: a copy of the drain must never run
    (it would run the rest of the batch again, under the parent's fences, and hold the
    parent's stdout open). ``os._exit``: no outcome, no buffered output, no atexit."""
    if forks != before:
        os._exit(0)



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


#: What a handler call runs in: a context manager given the task and the job, whose value
#: (when not None) is told how the handler ended (drainer.otel.JobSpan: the job's span,
#: for a traced run). None: nothing around the call.
JobContext = Callable[["Task", Job], AbstractContextManager[Any]]

NO_CONTEXT: AbstractContextManager[None] = nullcontext()


def call(task: Task, job: Job, result_max_bytes: int = DEFAULT_RESULT_MAX_BYTES,
         context: JobContext | None = None) -> Outcome:
    """Run one handler and catch whatever it raises."""
    started, before = time.monotonic(), forks
    with NO_CONTEXT if context is None else context(task, job) as span:
        outcome = _call_handler(task, job, result_max_bytes)
        end_if_forked(before)
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
    """The outcome of a handler that returned ``value`` (kept as the job's result), once
    what it hands back (the result, the follow-ups, also those appended past
    ``job.enqueue``) is known to be storable: one that is not fails this job alone, not
    the batch statement it would have joined."""
    for followup in job.followups:
        try:
            followup.check()
        except (TypeError, ValueError) as exc:
            return Outcome(job, task, False, f"FollowUpError: {exc}")
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
    what = "the handler's return value"
    try:
        text = storable_json(value, what)
    except TypeError as exc:
        raise ResultError(f"{exc}; return None, or a dict/list/str/number") from None
    except ValueError as exc:
        raise ResultError(str(exc)) from None
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise ResultError(f"the handler's return value is {size} bytes of JSON, more than "
                          f"result_max_bytes ({max_bytes}): store it elsewhere and return a "
                          "reference") from None
    return text
