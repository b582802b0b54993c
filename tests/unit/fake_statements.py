"""An in-memory jobs table speaking the drain's statement interfaces (no database).

It implements :class:`drainer.drain.statements.Statements` and ``Pipeline`` with the same
fencing as queries.sql (status 'running' and the claim's attempt), and records every
statement it was sent, so that unit tests can follow the drain loop's transitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg

from drainer.db import ClaimedRow, claim_order

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


class FakeJobs:
    """The jobs table and the statements the drain sends to it."""

    def __init__(self) -> None:
        self.rows: dict[int, Row] = {}
        self.sent: list[str] = []  # statement names, in the order they were sent
        self.deadlock_next: set[str] = set()  # statements that fail once with a deadlock
        self.in_flight = 0
        self._results: list[tuple[set[int], list[ClaimedRow]] | BaseException] = []

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
    def _claim(self, queue: str, batch_size: int, lease: float) -> list[ClaimedRow]:
        if batch_size < 0:
            raise psycopg.errors.InvalidRowCountInLimitClause("LIMIT must not be negative")
        due = sorted((r for r in self.rows.values()
                      if r.queue == queue and r.status == "queued" and r.run_at <= T0),
                     key=lambda r: (-r.priority, r.run_at, r.id))[:batch_size]
        out = []
        for r in due:
            r.status, r.attempts = "running", r.attempts + 1
            out.append(ClaimedRow(r.id, r.queue, {}, r.attempts, r.max_attempts, r.priority,
                                  r.run_at, T0 + timedelta(seconds=lease), r.attempts))
        return sorted(out, key=claim_order)

    def _fenced(self, ids: Sequence[int], attempts: Sequence[int]) -> list[Row]:
        return [self.rows[i] for i, a in zip(ids, attempts, strict=True)
                if i in self.rows and self.rows[i].status == "running"
                and self.rows[i].attempts == a]

    def _complete(self, ids: Sequence[int], attempts: Sequence[int]) -> set[int]:
        done = self._fenced(ids, attempts)
        for r in done:
            r.status = "done"
        return {r.id for r in done}

    def claim_batch(self, queue: str, batch_size: int, lease: float) -> list[ClaimedRow]:
        self._send("claim_batch")
        return self._claim(queue, batch_size, lease)

    def complete_many(self, ids: Sequence[int], attempts: Sequence[int], *,
                      delete: bool = False, **_: Any) -> set[int]:
        self._send("complete_many")
        return self._complete(ids, attempts)

    def complete_many_and_claim(
        self, ids: Sequence[int], attempts: Sequence[int], queue: str, batch_size: int,
        lease: float, **_: Any,
    ) -> tuple[set[int], list[ClaimedRow]]:
        self._send("complete_many_and_claim")
        return self._complete(ids, attempts), self._claim(queue, batch_size, lease)

    def fail_many(
        self, ids: Sequence[int], attempts: Sequence[int], errors: Sequence[str],
        max_attempts: Sequence[int | None], retry_base: float, retry_cap: float, **_: Any,
    ) -> list[tuple[int, str, datetime]]:
        self._send("fail_many")
        out = []
        for r in self._fenced(ids, attempts):
            r.status = "failed" if r.attempts >= r.max_attempts else "queued"
            r.run_at = T0 + timedelta(hours=1)  # a retry is due later, not in this drain
            out.append((r.id, r.status, r.run_at))
        return out

    def snooze_many(self, ids: Sequence[int], fences: Sequence[int],
                    seconds: Sequence[float]) -> dict[int, datetime]:
        self._send("snooze_many")
        out = {}
        for r, wait in zip(self._fenced(ids, fences), seconds, strict=False):
            r.status, r.attempts = "queued", r.attempts - 1
            r.run_at = T0 + timedelta(seconds=wait)
            out[r.id] = r.run_at
        return out

    def claim_batch_capped(self, queue: str, batch_size: int, lease: float,
                           max_running: int, **_: Any) -> list[ClaimedRow]:
        self._send("claim_batch_capped")
        running = sum(1 for r in self.rows.values()
                      if r.queue == queue and r.status == "running")
        return self._claim(queue, max(0, min(batch_size, max_running - running)), lease)

    def release_many(self, ids: Sequence[int], attempts: Sequence[int]) -> set[int]:
        self._send("release_many")
        released = self._fenced(ids, attempts)
        for r in released:
            r.status, r.attempts = "queued", r.attempts - 1
        return {r.id for r in released}

    def queue_summary(self, queues: Sequence[str]) -> tuple[int, datetime | None]:
        self._send("queue_summary")
        due = [r for r in self.rows.values()
               if r.queue in queues and r.status == "queued" and r.run_at <= T0]
        return len(due), None

    def table_health(self) -> dict[str, Any]:
        self._send("table_health")
        return {"can_vacuum": True}

    def vacuum_during_drain(self) -> None:
        self._send("vacuum_during_drain")

    # -- Pipeline -----------------------------------------------------------------------------
    def send(self, ids: Sequence[int], attempts: Sequence[int], queue: str, batch_size: int,
             lease: float, **_: Any) -> None:
        """The server runs statements in the order they were sent: run it now, answer later."""
        self.in_flight += 1
        try:
            self._results.append(self.complete_many_and_claim(ids, attempts, queue,
                                                              batch_size, lease))
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
