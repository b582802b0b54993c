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

#: ANALYZE with the VACUUM when more rows changed since the last ANALYZE than this many plus
#: ANALYZE_SCALE of the table: autovacuum's own rule (autovacuum_analyze_threshold and
#: autovacuum_analyze_scale_factor at their defaults).
ANALYZE_BASE = 50
ANALYZE_SCALE = 0.1


@dataclass(frozen=True)
class VacuumResult:
    vacuumed: bool
    n_dead_tup: int | None
    last_autovacuum: datetime | None
    skipped_reason: str | None = None
    analyzed: bool = False


def wants_analyze(health: Mapping[str, Any]) -> bool:
    """Whether autovacuum would ANALYZE the table now (also when its stats are unknown)."""
    changed, rows = health.get("n_mod_since_analyze"), health.get("reltuples")
    if changed is None or rows is None or rows < 0:  # no statistics yet: never analyzed
        return True
    return bool(changed > ANALYZE_BASE + ANALYZE_SCALE * rows)


def run_once(queries: Queries, threshold: int, health: Mapping[str, Any] | None = None
             ) -> VacuumResult:
    """VACUUM the table when n_dead_tup >= threshold (0 disables); ANALYZE it too when
    autovacuum would (:func:`wants_analyze`).

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
    analyze = wants_analyze(health)
    queries.vacuum_after_drain(analyze=analyze)
    logger.info("vacuumed %s%s.%s (%d dead tuples)", "and analyzed " if analyze else "",
                queries.schema, queries.table, dead)
    return VacuumResult(True, dead, last_auto, analyzed=analyze)
