"""The archiver: old done jobs (and older failed ones) are deleted or moved, in batches."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from drainer.maintenance import (
    ARCHIVE_AFTER_DEFAULT,
    ARCHIVE_BATCH_DEFAULT,
    FAILED_RETENTION_DEFAULT,
)

if TYPE_CHECKING:
    from drainer.db import Queries
    from drainer.settings import Settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArchiverConfig:
    """What the archiver does: ``mode`` delete, move (to the archive table) or off."""

    mode: str = "delete"
    archive_after: float = ARCHIVE_AFTER_DEFAULT
    failed_retention: float = FAILED_RETENTION_DEFAULT
    batch_size: int = ARCHIVE_BATCH_DEFAULT

    @classmethod
    def from_settings(cls, settings: Settings) -> ArchiverConfig:
        return cls(settings.archive_mode, settings.archive_after, settings.failed_retention,
                   settings.archive_batch_size)


@dataclass(frozen=True)
class ArchiveResult:
    archived: int
    done: int
    failed: int
    statements: int


def run_once(queries: Queries, config: ArchiverConfig, *, deadline: float | None = None
             ) -> ArchiveResult:
    """Archive ``done`` jobs finished more than ``archive_after`` ago, and ``failed`` jobs
    (the dead-letter queue) and ``cancelled`` ones finished more than ``failed_retention``
    ago (both counted in ``failed``).

    Each statement handles at most ``batch_size`` rows, so no statement holds
    locks or bloats WAL for long; stops early at ``deadline`` (``time.monotonic()``).
    """
    if config.mode == "off":
        return ArchiveResult(0, 0, 0, 0)
    move = config.mode == "move"
    counts = {"done": 0, "failed": 0}
    statements = 0
    # cancelled jobs are kept as long as failed ones, and counted with them
    for status, older_than, bucket in (("done", config.archive_after, "done"),
                                       ("failed", config.failed_retention, "failed"),
                                       ("cancelled", config.failed_retention, "failed")):
        while True:
            n = queries.archive_batch(status, older_than, config.batch_size, move)
            statements += 1
            counts[bucket] += n
            if n < config.batch_size:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
    return _logged(ArchiveResult(counts["done"] + counts["failed"], counts["done"],
                                 counts["failed"], statements), move)


def run_once_after(queries: Queries, config: ArchiverConfig, done: int, failed: int,
                   *, deadline: float | None = None) -> ArchiveResult:
    """The archiver after finish_run deleted a first batch of ``done`` and ``failed`` jobs:
    goes on only when a batch came back full (archive-mode delete)."""
    first = ArchiveResult(done + failed, done, failed, 1)
    if max(done, failed) < config.batch_size:
        return _logged(first, False)
    more = run_once(queries, config, deadline=deadline)
    return ArchiveResult(first.archived + more.archived, done + more.done,
                         failed + more.failed, 1 + more.statements)


def _logged(result: ArchiveResult, move: bool) -> ArchiveResult:
    if result.archived:
        logger.info("archived %d jobs (%s): %d done, %d failed", result.archived,
                    "moved" if move else "deleted", result.done, result.failed)
    return result
