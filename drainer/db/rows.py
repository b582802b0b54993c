"""A claimed row, and the claim's order that UPDATE ... RETURNING does not keep."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple


class ClaimedRow(NamedTuple):
    """A row returned by claim_batch (a named tuple: one is made per job claimed)."""

    id: int
    queue: str
    payload: Any
    attempts: int
    max_attempts: int
    priority: int
    run_at: datetime
    locked_until: datetime
    fence: int | None = None
    """The claim's token: grows by one at every claim, never reset (retry included).
    Always set by the claim statements; a row built by hand without one uses attempts."""
    #: The producer's W3C trace context ({"traceparent": ...}), or None.
    trace_context: Any = None


def claim_order(row: ClaimedRow) -> tuple[int, datetime, int]:
    """The claim's ORDER BY (priority DESC, run_at, id): UPDATE ... RETURNING has none."""
    return -row.priority, row.run_at, row.id


def how_many_start(start_now: int | None, batch_size: int) -> int:
    """How many of a claim's rows start at once (None: all of them)."""
    return batch_size if start_now is None else max(0, int(start_now))
