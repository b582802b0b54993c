"""The statements a drain sends, as two interfaces: what :class:`drainer.db.Queries` and
:class:`drainer.db.ClaimPipeline` do for it, and what a fake does in the unit tests.

A new outcome (snooze, follow-up inserts, results) or a claim across many queues in one
statement is one more method here, one more named statement in ``queries.sql``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from drainer.db import ClaimedRow
from drainer.queue_limits import Rate


class Statements(Protocol):
    """Statements sent one at a time, each waiting for its result (autocommit)."""

    def claim_batch(self, queue: str, batch_size: int, lease: float, *,
                    start_now: int | None = None, run_id: str | None = None
                    ) -> list[ClaimedRow]: ...

    def due_queues(self, queues: Sequence[str]) -> list[str]: ...

    def complete_many(self, ids: Sequence[int], fences: Sequence[int], *,
                      delete: bool = False, results: Sequence[str | None] | None = None,
                      followups: str | None = None) -> set[int]: ...

    def complete_many_and_claim(
        self, ids: Sequence[int], fences: Sequence[int], queue: str, batch_size: int,
        lease: float, *, start_now: int | None = None, run_id: str | None = None,
        results: Sequence[str | None] | None = None, followups: str | None = None,
    ) -> tuple[set[int], list[ClaimedRow]]: ...

    def complete_many_and_finish(
        self, ids: Sequence[int], fences: Sequence[int], finish: dict[str, Any], *,
        delete: bool = False, results: Sequence[str | None] | None = None,
        followups: str | None = None,
    ) -> tuple[set[int], dict[str, Any] | None]: ...

    def fail_many(
        self, ids: Sequence[int], fences: Sequence[int], errors: Sequence[str],
        max_attempts: Sequence[int | None], retry_base: float, retry_cap: float, *,
        bases: Sequence[float | None] | None = None, caps: Sequence[float | None] | None = None,
        jitters: Sequence[float] | None = None,
    ) -> list[tuple[int, str, datetime]]: ...

    def snooze_many(self, ids: Sequence[int], fences: Sequence[int],
                    seconds: Sequence[float]) -> dict[int, datetime]: ...

    def claim_batch_capped(self, queue: str, batch_size: int, lease: float,
                           max_running: int, *, start_now: int | None = None,
                           run_id: str | None = None) -> list[ClaimedRow]: ...

    def claim_batch_rated(self, queue: str, batch_size: int, lease: float,
                          max_running: int | None, rate: Rate, *,
                          start_now: int | None = None, run_id: str | None = None
                          ) -> tuple[list[ClaimedRow], datetime | None, int]: ...

    def release_many(self, ids: Sequence[int], fences: Sequence[int]) -> set[int]: ...

    def queue_summary(self, queues: Sequence[str]) -> tuple[int, datetime | None]: ...

    def table_health(self) -> dict[str, Any]: ...

    def vacuum_during_drain(self, timeout: float | None = None) -> None: ...


class Pipeline(Protocol):
    """complete_many_and_claim statements sent ahead and read back in order."""

    in_flight: int

    def send(self, ids: Sequence[int], fences: Sequence[int], queue: str, batch_size: int,
             lease: float, start_now: int | None = None, run_id: str | None = None,
             results: Sequence[str | None] | None = None, followups: str | None = None
             ) -> None: ...

    def receive(self) -> tuple[set[int], list[ClaimedRow]]: ...

    def close(self) -> list[tuple[set[int], list[ClaimedRow]] | BaseException]: ...

