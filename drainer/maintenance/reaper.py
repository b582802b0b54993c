"""The reaper: expired leases go back to queued, or to failed at max_attempts.

It has no settings of its own: a lease expires when ``locked_until`` passes (the lease is
the task's or ``--lease``), and it reaps the queues the drain claims.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from drainer.db import Queries

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReapResult:
    reaped: int
    requeued: int
    failed: int


def run_once(queries: Queries, queues: Sequence[str],
             max_attempts: Sequence[int | None] | None = None) -> ReapResult:
    """Reap the expired leases of ``queues`` (a worker died or stalled past its lease).

    ``max_attempts``: each queue's task's max_attempts (None: the row's), so that a job
    that kills its worker is failed after as many attempts as its task allows.
    """
    rows = queries.reap_expired(queues, max_attempts)
    failed = sum(1 for _id, status, _attempts in rows if status == "failed")
    if rows:
        logger.info("reaped %d expired leases (%d back to queued, %d failed at max_attempts)",
                    len(rows), len(rows) - failed, failed)
    return ReapResult(len(rows), len(rows) - failed, failed)
