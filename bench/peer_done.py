"""When a peer that has no drain mode has drained its queue: its own table, polled.

chancy and DBOS have no one-shot or drain mode (their workers run until stopped), so their
drain harnesses (bench/peer_chancy.py, bench/peer_dbos.py, run by the peers venv) start the
worker, poll the peer's own table for the jobs of the queue that are not finished yet, and
stop the worker once there are none, so that their figure is process start to exit, as the
others'. Imports psycopg only: both venvs have it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from psycopg import sql


@dataclass(frozen=True)
class JobTable:
    """Where a peer keeps its jobs and which states are final (the job is finished and its
    outcome written). chancy: ``chancy_jobs.state`` ('retrying' goes back to a worker);
    DBOS: ``dbos.workflow_status.status``, one row a workflow."""

    schema: str
    table: str
    queue_column: str
    state_column: str
    final: tuple[str, ...]
    succeeded: str


TABLES = {
    "chancy": JobTable("public", "chancy_jobs", "queue", "state", ("succeeded", "failed"),
                       "succeeded"),
    "dbos": JobTable("dbos", "workflow_status", "queue_name", "status",
                     ("SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"),
                     "SUCCESS"),
}


def progress_query(kind: str, schema: str | None = None) -> sql.Composed:
    """(succeeded, finished otherwise, not finished) of a queue's jobs, one scan."""
    t = TABLES[kind]
    state = sql.Identifier(t.state_column)
    return sql.SQL(
        "SELECT count(*) FILTER (WHERE {state} = %(succeeded)s), "
        "count(*) FILTER (WHERE {state} = ANY(%(final)s) AND {state} <> %(succeeded)s), "
        "count(*) FILTER (WHERE {state} IS NULL OR NOT {state} = ANY(%(final)s)) "
        "FROM {table} WHERE {queue} = %(queue)s").format(
        state=state, table=sql.Identifier(schema or t.schema, t.table),
        queue=sql.Identifier(t.queue_column))


def progress(conn: Any, kind: str, queue: str, schema: str | None = None
             ) -> tuple[int, int, int]:
    """(succeeded, failed or cancelled, not finished) of ``queue`` now."""
    t = TABLES[kind]
    row = conn.execute(progress_query(kind, schema),
                       {"succeeded": t.succeeded, "final": list(t.final),
                        "queue": queue}).fetchone()
    return int(row[0]), int(row[1]), int(row[2])


def drained(counts: tuple[int, int, int], expected: int) -> bool:
    """Every job of the queue finished, and at least the ``expected`` ones there were (a
    queue read before its jobs are visible is empty, not drained)."""
    succeeded, failed, unfinished = counts
    return unfinished == 0 and succeeded + failed >= expected


def wait_drained(conn: Any, kind: str, queue: str, expected: int, *, poll: float = 0.1,
                 timeout: float = 3600.0) -> tuple[int, int, int]:
    """Poll until :func:`drained`; the last counts (TimeoutError after ``timeout``). Every
    ``poll`` seconds, not faster: each poll is a scan of the queue's rows, on the server the
    peer is using (chancy writes its outcomes once a second anyway)."""
    deadline = time.monotonic() + timeout
    while True:
        counts = progress(conn, kind, queue)
        if drained(counts, expected):
            return counts
        if time.monotonic() > deadline:
            raise TimeoutError(f"{kind}: not drained after {timeout:g} s: {counts}")
        time.sleep(poll)
