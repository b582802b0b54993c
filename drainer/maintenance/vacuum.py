"""VACUUM the jobs table when dead tuples pile up: autovacuum may never finish on a
compute that suspends."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from drainer.db import Queries

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VacuumResult:
    vacuumed: bool
    n_dead_tup: int | None
    last_autovacuum: datetime | None
    skipped_reason: str | None = None


def run_once(queries: Queries, threshold: int, health: Mapping[str, Any] | None = None
             ) -> VacuumResult:
    """VACUUM (ANALYZE) the table when n_dead_tup >= threshold (0 disables).

    ``health`` is a table_health row already read (by finish_run), else it is read here.
    Only the table's owner may vacuum it (PostgreSQL 17 adds the MAINTAIN privilege); a
    role without that right gets a warning and the run goes on.
    """
    if health is None:
        health = queries.table_health()
    dead = health.get("n_dead_tup")
    last_auto = health.get("last_autovacuum")
    if threshold <= 0 or dead is None or dead < threshold:
        return VacuumResult(False, dead, last_auto)
    if not health.get("can_vacuum"):
        reason = ("drainer's role does not own the jobs table (VACUUM needs ownership, or "
                  "MAINTAIN on PostgreSQL 17+)")
        logger.warning("skipping VACUUM of %s.%s with %d dead tuples: %s", queries.schema,
                       queries.table, dead, reason)
        return VacuumResult(False, dead, last_auto, reason)
    queries.vacuum_after_drain()
    logger.info("vacuumed %s.%s (%d dead tuples)", queries.schema, queries.table, dead)
    return VacuumResult(True, dead, last_auto)
