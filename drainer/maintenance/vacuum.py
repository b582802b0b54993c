"""VACUUM the jobs table when dead tuples pile up: autovacuum may never finish on a
compute that suspends."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from drainer.db import Queries, one_line, timeout_kind

logger = logging.getLogger(__name__)
#: The VACUUM between batches is a step of the drain: it logs under the drain's name.
drain_logger = logging.getLogger("drainer.drain")

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


def run_once(queries: Queries, threshold: int, health: Mapping[str, Any] | None = None,
             *, timeout: float | None = None) -> VacuumResult:
    """VACUUM the table when n_dead_tup >= threshold (0 disables); ANALYZE it too when
    autovacuum would (:func:`wants_analyze`).

    ``health`` is a table_health row already read (by finish_run), else it is read here.
    Only the table's owner may vacuum it (PostgreSQL 17 adds the MAINTAIN privilege); a
    role without that right gets a warning and the run goes on. The VACUUM runs under
    ``statement_timeout = timeout`` (None: the session's; see Queries._vacuum); cancelled by
    a timeout, it is a warning and the result says vacuumed False: the jobs are done, the
    next run vacuums again.
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
    started = time.monotonic()
    try:
        queries.vacuum_after_drain(analyze=analyze, timeout=timeout)
    except (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable) as exc:
        reason = f"cancelled by {timeout_kind(exc)} after {time.monotonic() - started:.1f}s"
        logger.warning("VACUUM of %s.%s with %d dead tuples %s (the jobs are done; the next "
                       "run tries again; see --maintenance-timeout): %s", queries.schema,
                       queries.table, dead, reason, one_line(exc))
        return VacuumResult(False, dead, last_auto, reason)
    logger.info("vacuumed %s%s.%s (%d dead tuples)", "and analyzed " if analyze else "",
                queries.schema, queries.table, dead)
    return VacuumResult(True, dead, last_auto, analyzed=analyze)


class BetweenBatches:
    """VACUUM between batches of a long drain (no transaction open): claimed jobs leave dead
    entries at the head of the claim index, which every later claim walks until a VACUUM
    clears them (measured: the last 10% of a 200,000-job drain ran at half the rate of
    the first)."""

    def __init__(self, queries: Queries, every: int, timeout: float | None = None) -> None:
        self.q = queries
        self.every = every
        self.timeout = timeout  # the VACUUM's statement_timeout (see Queries._vacuum)
        self.vacuumed_at = 0  # finished jobs at the last VACUUM during this drain
        self.allowed: bool | None = None  # unknown until the first one is due

    def due(self, finished: int) -> bool:
        """Whether ``every`` jobs finished since the last VACUUM (and we may vacuum)."""
        if not self.every or self.allowed is False:
            return False
        return finished - self.vacuumed_at >= self.every

    def run_once(self, finished: int) -> bool:
        """VACUUM now (``finished`` jobs so far); False when it did not (a transaction is
        open, the role does not own the table, or the VACUUM failed)."""
        if self.q.conn.info.transaction_status != TransactionStatus.IDLE:
            return False
        self.vacuumed_at = finished
        if self.allowed is None:
            self.allowed = bool(self.q.table_health().get("can_vacuum"))
            if not self.allowed:
                drain_logger.info("not vacuuming during the drain: drainer's role does not "
                                  "own the jobs table")
                return False
        started = time.monotonic()
        try:
            self.q.vacuum_during_drain(self.timeout)
        except Exception as exc:  # a maintenance nicety: never fail the drain for it
            self.allowed = False
            kind = timeout_kind(exc)
            drain_logger.warning("VACUUM during the drain %s, not trying again this run: %s",
                                 "failed" if kind is None else f"cancelled by {kind}",
                                 one_line(exc))
            return False
        drain_logger.debug("vacuumed the jobs table after %d finished jobs in %.3fs",
                           finished, time.monotonic() - started)
        return True
