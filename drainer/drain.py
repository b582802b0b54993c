"""The drain cycle: connect, reap, claim and run until nothing is due, archive, vacuum, exit."""

from __future__ import annotations

import asyncio
import logging
import queue as queue_mod
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.pq import TransactionStatus

from drainer import db
from drainer._signals import on_stop_signals
from drainer.maintenance import archiver, reaper, vacuum
from drainer.migrate import check_schema
from drainer.recurring import DrainSync
from drainer.registry import Job, Registry, Task, default_registry, load_app

if TYPE_CHECKING:
    import psycopg

    from drainer.settings import Settings

logger = logging.getLogger(__name__)

#: A heartbeat extends leases every lease * HEARTBEAT_FRACTION seconds.
HEARTBEAT_FRACTION = 1 / 3
#: Longest error text kept in last_error.
MAX_ERROR_CHARS = 4000
#: With a progress line (a terminal), remaining due jobs are counted at most this often.
PROGRESS_DUE_INTERVAL_S = 1.0
#: Statements are pipelined (the next batch claimed while this one runs) only while a batch
#: takes at most this long: then a round trip is a large share of a batch, and claiming ahead
#: holds few jobs away from other drainers for little time.
PIPELINE_MAX_BATCH_S = 0.1


@dataclass
class RunReport:
    """What one drain did; printed as one JSON object by ``drainer run-once``."""

    run_id: str
    queues: list[str]
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    released: int = 0
    reaped: int = 0
    archived: int = 0
    vacuumed: bool = False
    lost: int = 0
    remaining_due: int = 0
    next_due_at: str | None = None
    duration_s: float = 0.0
    connected_s: float = 0.0
    deadline_hit: bool = False
    stopped_by: str | None = None
    n_dead_tup: int | None = None
    last_autovacuum: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Outcome:
    job: Job
    task: Task
    ok: bool
    error: str | None = None
    duration_s: float = 0.0


@dataclass
class _Running:
    job: Job
    task: Task
    lease: float
    started: float
    timeout_at: float | None
    lease_expires: float
    lost: bool = False
    done: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


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


def _call(task: Task, job: Job) -> _Outcome:
    """Run one handler and catch whatever it raises."""
    started = time.monotonic()
    outcome = _call_handler(task, job)
    outcome.duration_s = round(time.monotonic() - started, 6)
    return outcome


def _call_handler(task: Task, job: Job) -> _Outcome:
    try:
        if task.is_async:
            coro = task.func(job)
            if task.timeout is not None:
                asyncio.run(asyncio.wait_for(coro, task.timeout))
            else:
                asyncio.run(coro)
        else:
            task.func(job)
    except asyncio.TimeoutError:
        return _Outcome(job, task, False, f"TimeoutError: handler exceeded its timeout of "
                        f"{task.timeout}s")
    except BaseException as exc:  # a handler may raise anything, SystemExit included
        return _Outcome(job, task, False, format_error(exc))
    return _Outcome(job, task, True)


class _Heartbeat(threading.Thread):
    """Extends the leases of running jobs on a second connection opened only when needed."""

    def __init__(self, drain: _Drain, interval: float) -> None:
        super().__init__(name="drainer-heartbeat", daemon=True)
        self.drain = drain
        self.interval = interval
        self.stopped = threading.Event()
        self.conn: psycopg.Connection[Any] | None = None
        self.queries: db.Queries | None = None
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.beat()
            except Exception as exc:  # keep beating: the next tick may reconnect
                logger.warning("heartbeat failed: %s", db._one_line(exc))
                self._close()

    def beat(self, only: list[_Running] | None = None, seconds: float | None = None) -> set[int]:
        """Extend leases about to run low (or ``only`` those given); return ids still ours."""
        now = time.monotonic()
        with self.drain.lock:
            candidates = only if only is not None else [
                r for r in [*self.drain.running.values(), *self.drain.pending]
                if not r.done and not r.lost and r.lease_expires - now < r.lease * (
                    1 - HEARTBEAT_FRACTION)
            ]
        if not candidates:
            return set()
        with self.lock:
            if self.stopped.is_set():
                return set()  # the drain is over: never open a connection after it
            if self.conn is None or self.conn.closed:
                self.conn = db.connect(self.drain.settings, purpose="heartbeat")
                self.queries = db.Queries(self.conn, self.drain.settings.schema_name,
                                          self.drain.settings.table)
            assert self.queries is not None
            leases = [seconds if seconds is not None else r.lease for r in candidates]
            kept = self.queries.extend_many(
                [r.job.id for r in candidates], [r.job.attempt for r in candidates], leases)
        now = time.monotonic()
        for r, lease in zip(candidates, leases, strict=True):
            if r.job.id in kept:
                r.lease_expires = now + lease
                if r.timeout_at is None:
                    r.job.deadline = kept[r.job.id]
            else:
                r.lost = True
                r.job.cancelled.set()
                logger.warning("job %d is no longer ours (lease lost or cancelled): its "
                               "handler was told to stop and its outcome will not be "
                               "written", r.job.id, extra=self.drain.job_extra(r.job))
        return set(kept)

    def _close(self) -> None:
        with self.lock:
            if self.conn is not None:
                try:
                    self.conn.close()
                finally:
                    self.conn = None
                    self.queries = None

    def stop(self) -> None:
        with self.lock:
            self.stopped.set()
        if self.is_alive():
            self.join(timeout=5)
        self._close()


class _Drain:
    """One drain over one connection; see :func:`run_once`."""

    def __init__(self, settings: Settings, registry: Registry, conn: psycopg.Connection[Any],
                 queues: list[str], report: RunReport, stop: threading.Event,
                 deadline: float | None, hurry: threading.Event) -> None:
        self.settings = settings
        self.registry = registry
        self.conn = conn
        self.q = db.Queries(conn, settings.schema_name, settings.table)
        self.queues = queues
        self.report = report
        self.stop = stop
        self.hurry = hurry
        self.deadline = deadline
        self.lock = threading.Lock()
        self.running: dict[int, _Running] = {}
        self.done_q: queue_mod.SimpleQueue[_Outcome] = queue_mod.SimpleQueue()
        self.ok_buf: list[_Outcome] = []
        self.fail_buf: list[_Outcome] = []
        self.pool: _HandlerThreads | None = None
        leases = [self._lease(registry.tasks[q]) for q in queues]
        self.heartbeat = _Heartbeat(self, max(0.05, min(leases) * HEARTBEAT_FRACTION))
        self.progress: Callable[[RunReport], None] | None = None
        self._due_checked = time.monotonic()
        self._due_base: tuple[int, int] | None = None
        self.vacuumed_at = 0  # finished jobs at the last VACUUM during this drain
        self.may_vacuum: bool | None = None  # unknown until the first one is due
        # claimed jobs that have not started (the heartbeat extends their leases too)
        self.pending: deque[_Running] = deque()
        self.cursor = 0  # index in `queues` of the next claim
        self.exhausted = False  # nothing due was left at the last claim
        # statements in flight (libpq pipeline mode): what each completes, claims, from where
        self.pipe = db.ClaimPipeline(self.q)
        self.pipe_depth = settings.pipeline_depth if db.ClaimPipeline.supported() else 1
        self.sent: deque[tuple[list[_Outcome], int, int]] = deque()
        self.pipe_stopped = False  # a pipelined claim came back short: claim in step again
        self.batch_started: float | None = None  # when the batch in hand was handed over
        self.last_batch_s: float | None = None  # how long the last batch took to run

    # -- logs -------------------------------------------------------------------------------------
    def job_extra(self, job: Job, **fields: Any) -> dict[str, Any]:
        """The fields every job log line carries (JSON keys, or key=value on a TTY)."""
        return {"run_id": self.report.run_id, "job_id": job.id, "queue": job.queue,
                "attempt": job.attempt, **fields}

    # -- options ----------------------------------------------------------------------------------
    def _lease(self, task: Task) -> float:
        return task.lease if task.lease is not None else self.settings.lease

    def _timeout(self, task: Task) -> float | None:
        return task.timeout if task.timeout is not None else self.settings.job_timeout

    # -- limits -----------------------------------------------------------------------------------
    def limit_reached(self) -> bool:
        if self.stop.is_set():
            self.report.stopped_by = self.report.stopped_by or "signal"
            return True
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.report.stopped_by = self.report.stopped_by or "max_runtime"
            self.report.deadline_hit = True
            return True
        max_jobs = self.settings.max_jobs
        if max_jobs is not None and self.report.claimed >= max_jobs:
            self.report.stopped_by = self.report.stopped_by or "max_jobs"
            self.report.deadline_hit = True
            return True
        return False

    # -- claiming ---------------------------------------------------------------------------------
    def _claim_size(self) -> int:
        """The next claim's size: a batch, or what is left under --max-jobs."""
        if self.settings.max_jobs is None:
            return self.settings.batch_size
        return min(self.settings.batch_size, self.settings.max_jobs - self.report.claimed)

    def claim_round(self, start: int, tries: int | None = None
                    ) -> tuple[list[tuple[Task, db.ClaimedRow]], int, bool]:
        """Claim from the queues in turn, starting at ``start`` (``tries`` queues at most).

        Returns the claimed rows, where the next round starts, and whether anything was
        claimed (transaction-mode batches are run and recorded right here).
        """
        self.settle_pipeline()
        n = len(self.queues)
        for i in range(n if tries is None else tries):
            idx = (start + i) % n
            queue = self.queues[idx]
            task = self.registry.tasks[queue]
            size = self._claim_size()
            if size <= 0:
                return [], idx, False
            if task.transaction:
                if self.run_transaction_batch(task, size):
                    return [], idx, True
                continue
            rows = self.q.claim_batch(queue, size, self._lease(task))
            if rows:
                self.report.claimed += len(rows)
                self.pipe_stopped = len(rows) < size
                # stay on a queue while it fills whole batches; move on when it runs dry
                nxt = idx if len(rows) == size else (idx + 1) % n
                return [(task, r) for r in rows], nxt, True
        return [], start, False

    def can_flush_and_claim(self, start: int) -> bool:
        """Whether the next claim (of queue ``start``) can go with the completions."""
        return (bool(self.ok_buf) and not self.settings.delete_on_complete
                and not self.registry.tasks[self.queues[start]].transaction)

    def flush_and_claim(self, start: int) -> tuple[list[tuple[Task, db.ClaimedRow]], int, bool]:
        """Write the buffered outcomes and claim the next batch, successes and the claim in
        one statement (one round trip and one commit a batch); see :meth:`claim_round`."""
        self.settle_pipeline()
        if self.fail_buf:
            self._write_failed()
        n = len(self.queues)
        queue = self.queues[start]
        task = self.registry.tasks[queue]
        size = self._claim_size()
        if size <= 0:
            self.flush()
            return [], start, False
        buf, self.ok_buf = self.ok_buf, []
        try:
            written, rows = self.q.complete_many_and_claim(
                [o.job.id for o in buf], [o.job.attempt for o in buf], queue, size,
                self._lease(task))
        except psycopg.errors.DeadlockDetected as exc:
            # the statement rolled back whole (nothing completed, nothing claimed): write
            # and claim in two statements instead, which cannot take part in a cycle
            logger.warning("combined completion and claim deadlocked, retrying as two "
                           "statements: %s", db._one_line(exc),
                           extra={"run_id": self.report.run_id})
            self.ok_buf = buf + self.ok_buf
            self.flush()
            return self.claim_round(start)
        self._count_written(buf, written)
        self._show_progress()
        if rows:
            self.report.claimed += len(rows)
            self.pipe_stopped = len(rows) < size
            nxt = start if len(rows) == size else (start + 1) % n
            return [(task, r) for r in rows], nxt, True
        if n == 1:
            return [], start, False
        return self.claim_round((start + 1) % n, n - 1)

    # -- pipelining -------------------------------------------------------------------------------
    def may_send(self) -> bool:
        """Whether a completion + claim may go out now, ahead of the batch in hand."""
        if (self.pipe_depth < 2 or self.pipe_stopped or self.exhausted or self.fail_buf
                or len(self.sent) >= self.pipe_depth or self.settings.delete_on_complete
                or self.registry.tasks[self.queues[self.cursor]].transaction
                or self.last_batch_s is None or self.last_batch_s > PIPELINE_MAX_BATCH_S
                or self.vacuum_due() or self.limit_reached()):
            return False
        return self._claim_room() > 0

    def _claim_room(self) -> int:
        """The next claim's size once the claims in flight are counted (see _claim_size)."""
        return self._claim_size() - sum(size for _, size, _ in self.sent)

    def send(self) -> None:
        """Send the buffered successes and the next claim without waiting for the result."""
        queue = self.queues[self.cursor]
        task = self.registry.tasks[queue]
        size = self._claim_room()
        buf, self.ok_buf = self.ok_buf, []
        self.pipe.send([o.job.id for o in buf], [o.job.attempt for o in buf], queue, size,
                       self._lease(task))
        self.sent.append((buf, size, self.cursor))

    def receive(self) -> None:
        """Read the oldest statement in flight: count what it wrote, queue what it claimed."""
        buf, size, idx = self.sent.popleft()
        try:
            written, rows = self.pipe.receive()
        except psycopg.errors.DeadlockDetected as exc:
            # it rolled back whole: nothing written, nothing claimed; write them again later
            logger.warning("pipelined completion and claim deadlocked, writing again: %s",
                           db._one_line(exc), extra={"run_id": self.report.run_id})
            self.ok_buf = buf + self.ok_buf
            self.pipe_stopped = True
            return
        self._count_written(buf, written)
        task = self.registry.tasks[self.queues[idx]]
        if rows:
            self.report.claimed += len(rows)
            self.pending.extend(self.make_job(task, r) for r in rows)
        if len(rows) < size:
            self.pipe_stopped = True  # the queue ran dry: the next claim goes in step
        self._show_progress()

    def settle_pipeline(self) -> None:
        """Read every statement in flight, so that the connection can run another."""
        error: psycopg.Error | None = None
        while self.sent:
            try:
                self.receive()
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:  # read the rest first: their results count
                error = error or exc
        if error is not None:
            raise error

    # -- vacuum during long drains ----------------------------------------------------------------
    def vacuum_due(self) -> bool:
        every = self.settings.vacuum_every
        if not every or self.may_vacuum is False:
            return False
        r = self.report
        return r.succeeded + r.retried + r.failed - self.vacuumed_at >= every

    def vacuum_between_batches(self) -> None:
        """VACUUM between batches (no transaction open): claimed jobs leave dead entries at the
        head of the claim index, which every later claim walks until a VACUUM clears them
        (measured: the last 10% of a 200,000-job drain ran at half the rate of the first)."""
        self.settle_pipeline()
        r = self.report
        self.vacuumed_at = r.succeeded + r.retried + r.failed
        if self.may_vacuum is None:
            self.may_vacuum = bool(self.q.table_health().get("can_vacuum"))
            if not self.may_vacuum:
                logger.info("not vacuuming during the drain: drainer's role does not own the "
                            "jobs table")
                return
        started = time.monotonic()
        try:
            self.q.vacuum_during_drain()
        except Exception as exc:  # a maintenance nicety: never fail the drain for it
            self.may_vacuum = False
            logger.warning("VACUUM during the drain failed, not trying again this run: %s",
                           db._one_line(exc))
            return
        logger.debug("vacuumed the jobs table after %d finished jobs in %.3fs",
                     self.vacuumed_at, time.monotonic() - started)

    def make_job(self, task: Task, row: db.ClaimedRow) -> _Running:
        lease = self._lease(task)
        timeout = self._timeout(task)
        now = time.monotonic()
        deadline = row.locked_until if timeout is None else (
            datetime.now(timezone.utc) + timedelta(seconds=timeout))
        job = Job(row.id, row.queue, row.payload, row.attempts,
                  task.max_attempts or row.max_attempts, deadline)
        running = _Running(job, task, lease, now, None if timeout is None else now + timeout,
                           now + lease)
        job._extend = self._extend_one
        return running

    def _extend_one(self, job: Job, seconds: float | None) -> bool:
        with self.lock:
            r = self.running.get(job.id)
        if r is None or r.lost:
            return False
        kept = self.heartbeat.beat([r], seconds)
        return job.id in kept

    # -- running ----------------------------------------------------------------------------------
    def start(self, r: _Running) -> None:
        if self.batch_started is None:
            self.batch_started = time.monotonic()
        with self.lock:
            self.running[r.job.id] = r
        if r.timeout_at is not None:
            t = threading.Thread(target=self._thread_main, args=(r,), daemon=True,
                                 name=f"drainer-job-{r.job.id}")
            t.start()
        else:
            # Never on the main thread: a signal must be able to release the unstarted
            # jobs at once and to cut a handler short after the grace period.
            if self.pool is None:
                self.pool = _HandlerThreads(self.settings.concurrency, self._thread_main,
                                            lambda: not self.must_release())
            self.pool.submit(r)

    def _thread_main(self, r: _Running) -> None:
        try:
            outcome = _call(r.task, r.job)
        except BaseException as exc:  # a lost outcome would leave the drain waiting forever
            outcome = _Outcome(r.job, r.task, False,
                               f"{type(exc).__name__} while running the handler")
        self.done_q.put(outcome)

    def collect(self, block_for: float) -> None:
        """Move finished handlers' outcomes to the write buffers; enforce timeouts."""
        try:
            outcome = self.done_q.get(timeout=block_for) if block_for > 0 else \
                self.done_q.get_nowait()
        except queue_mod.Empty:
            outcome = None
        while outcome is not None:
            self._settle(outcome)
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
            self._settle(_Outcome(r.job, r.task, False,
                                  f"TimeoutError: handler exceeded its timeout of "
                                  f"{self._timeout(r.task)}s (abandoned, told to stop)",
                                  round(now - r.started, 6)))

    def _settle(self, outcome: _Outcome) -> None:
        with self.lock:
            r = self.running.get(outcome.job.id)
            if r is None or r.done or r.job is not outcome.job:
                return  # a late result of an abandoned (timed-out) handler
            r.done = True
            del self.running[outcome.job.id]
        if r.lost:
            self.report.lost += 1
            logger.warning("job %d finished after its lease was lost: outcome not written",
                           r.job.id, extra=self.job_extra(r.job, outcome="lost",
                                                          duration_s=outcome.duration_s))
            return
        (self.ok_buf if outcome.ok else self.fail_buf).append(outcome)

    def in_flight(self) -> int:
        # _settle marks a job done and removes it under the lock, so every job left in
        # `running` is still in flight
        return len(self.running)

    def flush(self) -> None:
        """Write buffered outcomes, fenced, one statement per kind."""
        self.settle_pipeline()
        if self.ok_buf:
            buf, self.ok_buf = self.ok_buf, []
            written = self.q.complete_many([o.job.id for o in buf], [o.job.attempt for o in buf],
                                           delete=self.settings.delete_on_complete)
            self._count_written(buf, written)
        if self.fail_buf:
            self._write_failed()
        self._show_progress()

    def _count_written(self, buf: list[_Outcome], written: set[int]) -> None:
        """Count (and at debug level log) the successes written; the rest were lost."""
        self.report.succeeded += len(written)
        if logger.isEnabledFor(logging.DEBUG):
            for o in buf:
                if o.job.id in written:
                    logger.debug("job %d succeeded", o.job.id, extra=self.job_extra(
                        o.job, outcome="succeeded", duration_s=o.duration_s))
        self._count_lost(buf, written)

    def _show_progress(self) -> None:
        """Redraw the progress line (a terminal only), with a fresh due count each second."""
        if self.progress is not None:
            now = time.monotonic()
            if now - self._due_checked >= PROGRESS_DUE_INTERVAL_S and not self.sent:
                self._due_checked = now
                self._due_base = self.q.queue_summary(self.queues)[0], self.report.claimed
            if self._due_base is not None:  # between counts: minus what was claimed since
                due, claimed = self._due_base
                self.report.remaining_due = max(0, due - (self.report.claimed - claimed))
            self.progress(self.report)

    def _write_failed(self) -> None:
        self.settle_pipeline()
        if self.fail_buf:
            buf, self.fail_buf = self.fail_buf, []
            rows = self.q.fail_many(
                [o.job.id for o in buf], [o.job.attempt for o in buf],
                [o.error or "unknown error" for o in buf],
                [o.task.max_attempts for o in buf],
                self.settings.retry_base, self.settings.retry_cap)
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
                            extra=self.job_extra(o.job, outcome="failed" if status == "failed"
                                                 else "retried", duration_s=o.duration_s,
                                                 error=first))
            self._count_lost(buf, {r[0] for r in rows})

    def _count_lost(self, buf: list[_Outcome], written: set[int]) -> None:
        for o in buf:
            if o.job.id not in written:
                self.report.lost += 1
                logger.warning(
                    "job %d: outcome not written (UPDATE 0): it is no longer ours, another "
                    "worker owns it, it was reaped or cancelled", o.job.id,
                    extra=self.job_extra(o.job, outcome="lost", duration_s=o.duration_s))

    # -- transaction mode -------------------------------------------------------------------------
    def run_transaction_batch(self, task: Task, size: int) -> int:
        """Claim, run and record a batch inside one transaction (lock for the whole job)."""
        conn = self.conn
        with conn.transaction():
            rows = self.q.claim_batch(task.queue, size, self._lease(task))
            self.report.claimed += len(rows)
            for row in rows:
                r = self.make_job(task, row)
                r.job.conn = conn
                r.job._extend = None  # the claim's transaction holds the row lock
                try:
                    with conn.transaction():
                        outcome = _call(task, r.job)
                        if not outcome.ok:
                            raise _HandlerFailed(outcome)
                except _HandlerFailed as failed:
                    self.fail_buf.append(failed.outcome)
                else:
                    self.ok_buf.append(outcome)
                finally:
                    r.job.conn = None
            self.flush()
        return len(rows)

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        pending = self.pending
        concurrency = self.settings.concurrency
        self.heartbeat.start()
        try:
            while True:
                limited = self.limit_reached()
                if not limited and not self.exhausted and not pending and not self.sent:
                    claimed, self.cursor, progressed = self.claim_round(self.cursor)
                    pending.extend(self.make_job(t, r) for t, r in claimed)
                    self.exhausted = not progressed
                if self.must_release():
                    # shutdown, or past the deadline: claimed jobs that have not started go
                    # back at once (running a whole batch could overrun a platform limit)
                    self.release(take_back=True)
                while pending and self.in_flight() < self._slots(pending[0]):
                    self.start(pending.popleft())
                if not pending and self.in_flight() and not self.sent and self.may_send():
                    # the batch is handed over: claim the next while it runs
                    self.send()
                busy = self.in_flight()
                full = not pending or busy >= self._slots(pending[0])
                if busy and full and concurrency == 1 and self.pool is not None \
                        and not self.pool.idle.is_set():
                    # sequential: sleep until the handler thread has run all it was given
                    # (one wake-up a batch, not one a job)
                    self.pool.idle.wait(0.05)
                    self.collect(0)
                else:
                    self.collect(0.05 if busy and full else 0)
                idle = not pending and not self.in_flight()
                if idle and self.batch_started is not None:
                    self.last_batch_s = time.monotonic() - self.batch_started
                    self.batch_started = None
                if self.sent and not idle and self.batch_started is not None and \
                        time.monotonic() - self.batch_started > PIPELINE_MAX_BATCH_S:
                    # a slow batch: take the jobs claimed ahead out of the socket, where
                    # the heartbeat could not extend their leases
                    self.settle_pipeline()
                if self.sent:
                    if idle:
                        # the batch in hand is done and the next was claimed while it ran:
                        # send its successes (with another claim), then take the next batch
                        if self.may_send():
                            self.send()
                        self.receive()
                    continue
                buffered = len(self.ok_buf) + len(self.fail_buf)
                if buffered and (not pending or buffered >= self.settings.batch_size):
                    if (idle and not self.exhausted and self.can_flush_and_claim(self.cursor)
                            and not self.vacuum_due() and not self.limit_reached()):
                        # the batch is finished and the next claim is due: one round trip
                        claimed, self.cursor, progressed = self.flush_and_claim(self.cursor)
                        pending.extend(self.make_job(t, r) for t, r in claimed)
                        self.exhausted = not progressed
                        continue
                    self.flush()
                    if idle and not self.exhausted and self.vacuum_due() and \
                            self.conn.info.transaction_status == TransactionStatus.IDLE:
                        self.vacuum_between_batches()
                if pending or self.in_flight():
                    if (self.must_release() or (limited and not pending)) and self.in_flight():
                        self.limit_reached()  # a signal may have come since the loop's top
                        self.release(take_back=self.must_release())
                        self.wait_grace()
                        break
                    continue
                if self.exhausted or limited:
                    break
        finally:
            self.flush()
            self.heartbeat.stop()
            if self.pool is not None:
                self.pool.shutdown()

    def must_release(self) -> bool:
        """Shutdown or the deadline: claimed jobs that have not started go back at once.

        (--max-jobs only stops claiming: what was claimed within the limit still runs.)
        """
        return self.stop.is_set() or (
            self.deadline is not None and time.monotonic() >= self.deadline)

    def _slots(self, r: _Running) -> int:
        """How many jobs may be in flight before ``r`` starts.

        Handler threads get jobs queued ahead (one each; the whole batch when sequential),
        so that they never wait for this loop between jobs; queued jobs that have not
        started are taken back and released on shutdown.
        """
        concurrency = self.settings.concurrency
        if r.timeout_at is not None:
            return concurrency
        return concurrency + (self.settings.batch_size if concurrency == 1 else concurrency)

    def release(self, take_back: bool = False) -> None:
        """Give back the claimed jobs that did not start (with ``take_back``, also those
        queued to handler threads but not picked up yet), without using up an attempt."""
        self.settle_pipeline()
        jobs = list(self.pending)
        self.pending.clear()
        if self.pool is not None and take_back:
            taken = self.pool.take_back()
            with self.lock:
                for r in taken:
                    r.done = True
                    self.running.pop(r.job.id, None)
            jobs.extend(taken)
        if not jobs:
            return
        released = self.q.release_many([r.job.id for r in jobs], [r.job.attempt for r in jobs])
        self.report.released += len(released)
        logger.info("released %d claimed jobs that had not started", len(released),
                    extra={"run_id": self.report.run_id})

    def wait_grace(self) -> None:
        """Give running handlers the grace period, then leave them to their lease."""
        until = time.monotonic() + self.settings.grace
        while self.in_flight() and time.monotonic() < until and not self.hurry.is_set():
            self.collect(min(0.1, max(0.0, until - time.monotonic())))
            if self.ok_buf or self.fail_buf:
                self.flush()
        self.release(take_back=True)
        with self.lock:
            left = [r for r in self.running.values() if not r.done]
        for r in left:
            r.job.cancelled.set()
            logger.warning("job %d still running after the %.0fs grace period: left to its "
                           "lease", r.job.id, self.settings.grace,
                           extra=self.job_extra(r.job, outcome="abandoned"))


class _HandlerThreads:
    """N daemon threads running handlers, fed from a queue the drain loop can take back.

    Daemon threads, unlike ThreadPoolExecutor's, do not hold up the process's exit: a
    handler still running after the grace period is left to its lease, as promised.
    Jobs queued but not picked up yet can be taken back and released on shutdown.
    """

    def __init__(self, n: int, target: Callable[[_Running], None],
                 may_start: Callable[[], bool]) -> None:
        self.may_start = may_start
        self.cond = threading.Condition()
        self.work: deque[_Running] = deque()
        self.active = 0  # jobs taken from `work` whose handler has not returned
        self.idle = threading.Event()  # set when nothing is queued or running
        self.idle.set()
        self.closed = False
        self.target = target
        self.threads = [threading.Thread(target=self._main, daemon=True,
                                         name=f"drainer-handler-{i}") for i in range(n)]
        for t in self.threads:
            t.start()

    def submit(self, r: _Running) -> None:
        with self.cond:
            self.work.append(r)
            self.idle.clear()
            self.cond.notify()

    def take_back(self) -> list[_Running]:
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


class _HandlerFailed(Exception):
    def __init__(self, outcome: _Outcome) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome


def resolve_queues(settings: Settings, registry: Registry) -> list[str]:
    """The queues this drain claims: those with handlers, or the --queue subset of them."""
    from drainer.errors import ConfigError

    if settings.app:
        load_app(settings.app)
    known = registry.queues()
    if not known:
        raise ConfigError(
            "no handlers registered: name the module with your @task functions in "
            "DRAINER_APP or --app"
        )
    if not settings.queues:
        return known
    missing = [q for q in settings.queues if q not in registry.tasks]
    if missing:
        raise ConfigError(
            f"no handler for queue {', '.join(map(repr, missing))} (handlers exist for: "
            f"{', '.join(known)})"
        )
    return list(dict.fromkeys(settings.queues))


def _stop_on_signal(stop: threading.Event, hurry: threading.Event) -> Callable[[str], None]:
    """SIGTERM/SIGINT: stop claiming; a second signal cuts the grace period short."""

    def handler(name: str) -> None:
        if stop.is_set():
            logger.warning("received %s again: not waiting for running jobs (they are left "
                           "to their lease)", name)
            hurry.set()
            return
        logger.info("received %s: stopping (no new claims; claimed jobs that did not start "
                    "are released; running jobs get the grace period)", name)
        stop.set()

    return handler


def run_once(
    settings: Settings,
    *,
    registry: Registry | None = None,
    stop: threading.Event | None = None,
    deadline: float | None = None,
    handle_signals: bool = False,
    progress: Callable[[RunReport], None] | None = None,
) -> RunReport:
    """Drain once: the cycle every entry point (CLI, scheduler, serve, serverless) uses.

    ``deadline`` is a ``time.monotonic()`` instant after which no more jobs are claimed
    (the earlier of it and ``settings.max_runtime`` wins). ``stop`` is an event that asks
    for a graceful shutdown, as SIGTERM does with ``handle_signals``.
    """
    registry = registry or default_registry
    started = time.monotonic()
    stop = stop or threading.Event()
    queues = resolve_queues(settings, registry)
    if settings.max_runtime is not None:
        limit = started + settings.max_runtime
        deadline = limit if deadline is None else min(deadline, limit)
    report = RunReport(run_id=uuid.uuid4().hex[:12], queues=queues)
    hurry = threading.Event()
    ctx = on_stop_signals(_stop_on_signal(stop, hurry)) if handle_signals \
        else _nullcontext()
    with ctx:
        conn = db.connect(settings)
        connected_at = time.monotonic()
        try:
            drain = _Drain(settings, registry, conn, queues, report, stop, deadline, hurry)
            drain.progress = progress
            check_schema(drain.q)
            logger.debug("drain started", extra={"run_id": report.run_id, "queues": queues})
            # the reaper's statement also syncs the recurring definitions (drainer.recurring)
            schedules = DrainSync(registry.schedules.values(), queues)
            report.reaped = reaper.result_of(schedules.start(drain.q)).reaped
            drain.run()
            report.reaped += len(schedules.finish(drain.q))
            if not stop.is_set() and settings.archive_mode == "delete":
                # archive, table health and what is left in one statement
                fin = drain.q.finish_run(queues, settings.archive_after,
                                         settings.failed_retention, settings.archive_batch_size)
                report.archived = archiver.run_once_after(
                    drain.q, settings, fin["archived_done"], fin["archived_failed"]).archived
                vac = vacuum.run_once(drain.q, settings.vacuum_threshold, health=fin)
                report.vacuumed = vac.vacuumed
                report.n_dead_tup = vac.n_dead_tup
                report.last_autovacuum = _iso(vac.last_autovacuum)
                report.remaining_due, next_due = int(fin["remaining_due"]), fin["next_due_at"]
            else:
                if not stop.is_set():
                    report.archived = archiver.run_once(
                        drain.q, settings, deadline=None).archived
                    vac = vacuum.run_once(drain.q, settings.vacuum_threshold)
                    report.vacuumed = vac.vacuumed
                    report.n_dead_tup = vac.n_dead_tup
                    report.last_autovacuum = _iso(vac.last_autovacuum)
                report.remaining_due, next_due = drain.q.queue_summary(queues)
            report.next_due_at = _iso(next_due)
        finally:
            conn.close()
            report.connected_s = round(time.monotonic() - connected_at, 6)
    report.duration_s = round(time.monotonic() - started, 6)
    logger.debug("drain finished", extra=report.as_dict())
    if settings.pushgateway_url:
        _push_metrics(settings, report)
    return report


def _push_metrics(settings: Settings, report: RunReport) -> None:
    try:
        from drainer import metrics

        metrics.push_report(settings, report)
    except Exception as exc:
        logger.warning("pushing metrics failed: %s", db._one_line(exc))


@contextmanager
def _nullcontext() -> Iterator[None]:
    yield


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
