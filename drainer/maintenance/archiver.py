"""The archiver: old done jobs (and older failed ones) are deleted or moved, in batches."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from drainer.db import Queries

if TYPE_CHECKING:
    from drainer.settings import Settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArchiveResult:
    archived: int
    done: int
    failed: int
    statements: int


def run_once(queries: Queries, settings: Settings, *, deadline: float | None = None
             ) -> ArchiveResult:
    """Archive ``done`` jobs finished more than ``archive_after`` ago and ``failed`` jobs
    (the dead-letter queue) finished more than ``failed_retention`` ago.

    Each statement handles at most ``archive_batch_size`` rows, so no statement holds
    locks or bloats WAL for long; stops early at ``deadline`` (``time.monotonic()``).
    """
    if settings.archive_mode == "off":
        return ArchiveResult(0, 0, 0, 0)
    move = settings.archive_mode == "move"
    counts = {"done": 0, "failed": 0}
    statements = 0
    for status, older_than in (("done", settings.archive_after),
                               ("failed", settings.failed_retention)):
        while True:
            n = queries.archive_batch(status, older_than, settings.archive_batch_size, move)
            statements += 1
            counts[status] += n
            if n < settings.archive_batch_size:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
    total = counts["done"] + counts["failed"]
    if total:
        logger.info("archived %d jobs (%s): %d done, %d failed", total,
                    "moved" if move else "deleted", counts["done"], counts["failed"])
    return ArchiveResult(total, counts["done"], counts["failed"], statements)
