"""An in-memory jobs table speaking the drain's statement interfaces (no database).

It implements :class:`drainer.drain.statements.Statements` and ``Pipeline`` with the same
fencing as queries.sql (status 'running' and the claim's fence, which grows at every claim
and is never reset), the same charging (the first ``start_now`` rows of a claim are
charged; an expired lease gives an uncharged claim its attempt back and makes the job a
suspect, claimed only among the first ``start_now``), and records every
statement it was sent, so that unit tests can follow the drain loop's transitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg

from drainer.db import ClaimedRow, claim_order
from drainer.queue_limits import Rate

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


@dataclass
class Row:
    id: int
    queue: str
    status: str = "queued"
    attempts: int = 0
    max_attempts: int = 5
    priority: int = 0
    run_at: datetime = T0
    fence: int = 0
    charged: bool = False
    suspect: bool = False
    run_id: str | None = None
    result: Any = None


class FakeJobs:
    """The jobs table and the statements the drain sends to it."""

    def __init__(self) -> None:
        self.rows: dict[int, Row] = {}
        self.sent: list[str] = []  # statement names, in the order they were sent
        self.deadlock_next: set[str] = set()  # statements that fail once with a deadlock
        self.in_flight = 0
        self.start_now: list[int] = []  # each claim's start_now, in order
        self._results: list[tuple[set[int], list[ClaimedRow]] | BaseException] = []
        self.rate_window: dict[str, int] = {}  # jobs claimed by claim_batch_rated, by queue
        self.rated_sizes: list[int] = []  # each claim_batch_rated's size, in order

    def add(self, queue: str, n: int) -> list[int]:
        ids = []
        for _ in range(n):
            i = len(self.rows) + 1
            self.rows[i] = Row(i, queue)
            ids.append(i)
        return ids

    def statuses(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows.values():
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def _send(self, name: str) -> None:
        self.sent.append(name)
        if name in self.deadlock_next:
            self.deadlock_next.discard(name)
            raise psycopg.errors.DeadlockDetected("deadlock detected (fake)")

    # -- Statements ---------------------------------------------------------------------------
    def _claim(self, queue: str, batch_size: int, lease: float, start_now: int | None,
               run_id: str | None) -> list[ClaimedRow]:
        if batch_size < 0:
            raise psycopg.errors.InvalidRowCountInLimitClause("LIMIT must not be negative")
        start_now = batch_size if start_now is None else start_now
        self.start_now.append(start_now)
        due = sorted((r for r in self.rows.values()
                      if r.queue == queue and r.status == "queued" and r.run_at <= T0),
                     key=lambda r: (-r.priority, r.run_at, r.id))[:batch_size]
        out = []
        for n, r in enumerate(due, 1):
            if r.suspect and n > start_now:
                continue  # a suspect runs only where it is charged: left for a later claim
            r.status, r.attempts, r.fence = "running", r.attempts + 1, r.fence + 1
            r.charged, r.suspect, r.run_id = r.suspect, False, run_id
            out.append(ClaimedRow(r.id, r.queue, {}, r.attempts, r.max_attempts, r.priority,
                                  r.run_at, T0 + timedelta(seconds=lease), r.fence))
        return sorted(out, key=claim_order)

    def _fenced(self, ids: Sequence[int], fences: Sequence[int]) -> list[Row]:
        return [self.rows[i] for i, f in zip(ids, fences, strict=True)
                if i in self.rows and self.rows[i].status == "running"
                and self.rows[i].fence == f]

    def _complete(self, ids: Sequence[int], fences: Sequence[int],
                  results: Sequence[Any] | None = None) -> set[int]:
        done = self._fenced(ids, fences)
        by_id = dict(zip(ids, results or [None] * len(ids), strict=True))
        for r in done:
            r.status, r.result = "done", by_id[r.id]
        return {r.id for r in done}

    def claim_batch(self, queue: str, batch_size: int, lease: float, *,
                    start_now: int | None = None, run_id: str | None = None
                    ) -> list[ClaimedRow]:
        self._send("claim_batch")
        return self._claim(queue, batch_size, lease, start_now, run_id)

    def complete_many(self, ids: Sequence[int], fences: Sequence[int], *,
                      delete: bool = False, results: Sequence[Any] | None = None,
                      **_: Any) -> set[int]:
        self._send("complete_many")
        return self._complete(ids, fences, results)

    def complete_many_and_claim(
        self, ids: Sequence[int], fences: Sequence[int], queue: str, batch_size: int,
        lease: float, *, start_now: int | None = None, run_id: str | None = None,
        results: Sequence[Any] | None = None, **_: Any,
    ) -> tuple[set[int], list[ClaimedRow]]:
        self._send("complete_many_and_claim")
        return (self._complete(ids, fences, results),
                self._claim(queue, batch_size, lease, start_now, run_id))

    def fail_many(
        self, ids: Sequence[int], fences: Sequence[int], errors: Sequence[str],
        max_attempts: Sequence[int | None], retry_base: float, retry_cap: float, **_: Any,
    ) -> list[tuple[int, str, datetime]]:
        self._send("fail_many")
        out = []
        limits = dict(zip(ids, max_attempts, strict=True))
        for r in self._fenced(ids, fences):
            limit = limits[r.id]
            r.status = "failed" if r.attempts >= (r.max_attempts if limit is None else limit) \
                else "queued"
            r.charged = r.suspect = False
            r.run_at = T0 + timedelta(hours=1)  # a retry is due later, not in this drain
            out.append((r.id, r.status, r.run_at))
        return out

    def snooze_many(self, ids: Sequence[int], fences: Sequence[int],
                    seconds: Sequence[float]) -> dict[int, datetime]:
        self._send("snooze_many")
        out = {}
        wait_of = dict(zip(ids, seconds, strict=True))
        for r in self._fenced(ids, fences):
            wait = wait_of[r.id]
            r.status, r.attempts = "queued", r.attempts - 1
            r.run_at = T0 + timedelta(seconds=wait)
            out[r.id] = r.run_at
        return out

    def claim_batch_capped(self, queue: str, batch_size: int, lease: float,
                           max_running: int, **_: Any) -> list[ClaimedRow]:
        self._send("claim_batch_capped")
        running = sum(1 for r in self.rows.values()
                      if r.queue == queue and r.status == "running")
        return self._claim(queue, max(0, min(batch_size, max_running - running)), lease,
                           _.get("start_now"), _.get("run_id"))

    def claim_batch_rated(self, queue: str, batch_size: int, lease: float,
                          max_running: int | None, rate: Rate, **_: Any
                          ) -> tuple[list[ClaimedRow], datetime | None, int]:
        """The rate window on the fake's clock, which stands still at T0: every claim of
        the queue is in the window; a full window's next slot is T0 + period."""
        self._send("claim_batch_rated")
        self.rated_sizes.append(batch_size)
        used = self.rate_window.get(queue, 0)
        running = sum(1 for r in self.rows.values()
                      if r.queue == queue and r.status == "running")
        capped = batch_size if max_running is None else max(0, min(batch_size,
                                                                   max_running - running))
        rows = self._claim(queue, min(capped, rate.count - used), lease, _.get("start_now"),
                           _.get("run_id"))
        self.rate_window[queue] = used + len(rows)
        due = sum(1 for r in self.rows.values()
                  if r.queue == queue and r.status == "queued" and r.run_at <= T0)
        full = self.rate_window[queue] >= rate.count
        limited = due if full and rate.count - used < capped else 0
        return rows, T0 + timedelta(seconds=rate.period) if full else None, limited

    def release_many(self, ids: Sequence[int], fences: Sequence[int]) -> set[int]:
        self._send("release_many")
        released = self._fenced(ids, fences)
        for r in released:
            r.status, r.attempts, r.charged = "queued", r.attempts - 1, False
        return {r.id for r in released}

    def reap(self, max_attempts: int | None = None) -> list[int]:
        """Every running lease expires and is reaped (as reap_expired): an uncharged claim
        gets its attempt back, every reaped job becomes a suspect."""
        reaped = []
        for r in self.rows.values():
            if r.status != "running":
                continue
            r.attempts -= not r.charged
            limit = r.max_attempts if max_attempts is None else max_attempts
            r.status = "failed" if r.attempts >= limit else "queued"
            r.charged, r.suspect = False, True
            reaped.append(r.id)
        return reaped

    def due_queues(self, queues: Sequence[str]) -> list[str]:
        self._send("due_queues")
        due = {r.queue for r in self.rows.values() if r.status == "queued" and r.run_at <= T0}
        return [q for q in queues if q in due]

    def queue_summary(self, queues: Sequence[str]) -> tuple[int, datetime | None]:
        self._send("queue_summary")
        due = [r for r in self.rows.values()
               if r.queue in queues and r.status == "queued" and r.run_at <= T0]
        return len(due), None

    def table_health(self) -> dict[str, Any]:
        self._send("table_health")
        return {"can_vacuum": True}

    def vacuum_during_drain(self, timeout: float | None = None) -> None:
        self._send("vacuum_during_drain")

    # -- Pipeline -----------------------------------------------------------------------------
    def send(self, ids: Sequence[int], fences: Sequence[int], queue: str, batch_size: int,
             lease: float, start_now: int | None = None, run_id: str | None = None,
             *_: Any) -> None:
        """The server runs statements in the order they were sent: run it now, answer later."""
        self.in_flight += 1
        try:
            self._results.append(self.complete_many_and_claim(
                ids, fences, queue, batch_size, lease, start_now=start_now, run_id=run_id))
        except psycopg.Error as exc:
            self._results.append(exc)
        self.sent[-1] = "send"

    def receive(self) -> tuple[set[int], list[ClaimedRow]]:
        if not self.in_flight:
            raise RuntimeError("no statement in flight")
        self.in_flight -= 1
        result = self._results.pop(0)
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self) -> list[tuple[set[int], list[ClaimedRow]] | BaseException]:
        out = self._results
        self._results, self.in_flight = [], 0
        return out
