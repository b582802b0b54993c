"""drainer's statements bound to one connection and one jobs table: one method a statement."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from drainer.db._flight import one_flight
from drainer.db.connect import one_line
from drainer.db.encoders import completion_params, counts
from drainer.db.statements import Rendered, identifiers, regclass_literal
from drainer.job import MAX_WAIT_S
from drainer.queue_limits import Rate

logger = logging.getLogger(__name__)


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



#: claim_batch_rated counts the due jobs a rate limit left queued up to this many.
RATE_LIMITED_COUNT_MAX = 1000


def finish_params(regclass: str, queues: Sequence[str], *, archive_after: float,
                   failed_retention: float, batch_size: int,
                   served: Sequence[str] | None = None, if_idle: bool = False,
                   if_drained: bool = False) -> dict[str, Any]:
    return {"queues": list(queues), "archive_after": archive_after,
            "failed_retention": failed_retention, "batch_size": batch_size,
            "regclass": regclass, "served": list(queues if served is None else served),
            "if_idle": if_idle, "if_drained": if_drained}


def finish_row(cur: psycopg.Cursor[dict[str, Any]]) -> dict[str, Any] | None:
    """finish_run's row (None: it did nothing, as with if_idle when there was work),
    unserved_due as {queue: count}."""
    row = cur.fetchone()
    if row is None:
        return None
    out = dict(row)
    out["unserved_due"] = counts(out.get("unserved_due"))
    return out


class Queries:
    """drainer's named statements bound to one connection and one jobs table.

    One method per statement of ``sql/queries.sql``; each returns plain Python values.
    """

    def __init__(self, conn: psycopg.Connection[Any], schema: str, table: str) -> None:
        self.conn = conn
        self.schema = schema
        self.table = table
        self.regclass = regclass_literal(schema, table)
        self._sql = Rendered(conn, identifiers(schema, table))

    def text(self, name: str) -> str:
        """The rendered SQL of a named statement (for EXPLAIN, benchmarks, pgbench)."""
        return self._sql[name]

    def _exec(self, name: str, params: dict[str, Any] | None = None) -> psycopg.Cursor[Any]:
        return self.conn.execute(self._sql[name], params)

    # -- schema ---------------------------------------------------------------------------------
    def schema_version(self) -> int | None:
        """The migration version recorded for the table; SchemaError when none."""
        try:
            row = self._exec("schema_version", {"table": self.table}).fetchone()
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            if not self.conn.autocommit:
                self.conn.rollback()
            return None
        return None if row is None else row[0]

    def pause_queues(self, queues: Sequence[str]) -> list[str]:
        return [r[0] for r in self._exec("queue_pause", {"queues": list(queues)})]

    def resume_queues(self, queues: Sequence[str]) -> list[str]:
        return [r[0] for r in self._exec("queue_resume", {"queues": list(queues)})]

    # -- the job lifecycle ----------------------------------------------------------------------
    def claim_batch(self, queue: str, batch_size: int, lease: float, *,
                    start_now: int | None = None, run_id: str | None = None
                    ) -> list[ClaimedRow]:
        """Claim up to ``batch_size`` due jobs; the first ``start_now`` (default: all) start
        at once and are charged their attempt; ``run_id`` is recorded on each row."""
        cur = self._exec("claim_batch", {
            "queue": queue, "batch_size": batch_size, "lease": lease,
            "start_now": how_many_start(start_now, batch_size), "run_id": run_id})
        rows = [ClaimedRow(*r) for r in cur.fetchall()]
        rows.sort(key=claim_order)
        return rows

    def due_queues(self, queues: Sequence[str]) -> list[str]:
        """The queues of ``queues`` with a due queued job, in their order."""
        return [r[0] for r in self._exec("due_queues", {"queues": list(queues)}).fetchall()]

    def complete_many(self, ids: Sequence[int], fences: Sequence[int], *,
                      delete: bool = False, results: Sequence[str | None] | None = None,
                      followups: str | None = None) -> set[int]:
        """Mark jobs done, fenced; ``results``: what each handler returned, as JSON text
        (None: NULL); ``followups``: the follow-up jobs, a JSON array (see queries.sql)."""
        if not ids:
            return set()
        name = "delete_completed_many" if delete else "complete_many"
        cur = self._exec(name, completion_params(ids, fences, results, followups))
        return {r[0] for r in cur.fetchall()}

    def complete_many_and_claim(
        self, ids: Sequence[int], fences: Sequence[int], queue: str, batch_size: int,
        lease: float, *, start_now: int | None = None, run_id: str | None = None,
        results: Sequence[str | None] | None = None, followups: str | None = None,
    ) -> tuple[set[int], list[ClaimedRow]]:
        """complete_many, then claim_batch, in one statement (one round trip, one commit)."""
        cur = self._exec("complete_many_and_claim", {
            **completion_params(ids, fences, results, followups),
            "queue": queue, "batch_size": batch_size, "lease": lease,
            "start_now": how_many_start(start_now, batch_size), "run_id": run_id,
        })
        written: set[int] = set()
        rows: list[ClaimedRow] = []
        for r in cur.fetchall():
            if r[0] == "done":
                written.add(r[1])
            else:
                rows.append(ClaimedRow(*r[1:]))
        rows.sort(key=claim_order)
        return written, rows

    def fail_many(
        self, ids: Sequence[int], fences: Sequence[int], errors: Sequence[str],
        max_attempts: Sequence[int | None], retry_base: float, retry_cap: float, *,
        bases: Sequence[float | None] | None = None, caps: Sequence[float | None] | None = None,
        jitters: Sequence[float] | None = None,
    ) -> list[tuple[int, str, datetime]]:
        """Failures, fenced; each row's backoff base/cap/jitter (None: retry_base/retry_cap,
        no jitter). A base or cap past MAX_WAIT_S (an uncapped ``Retry(cap=inf)``) waits
        MAX_WAIT_S: run_at's ceiling, not an interval out of range for the whole batch."""
        if not ids:
            return []
        n = len(ids)
        cur = self._exec("fail_many", {
            "ids": list(ids), "fences": list(fences), "errors": list(errors),
            "max_attempts": list(max_attempts),
            "bases": [min(retry_base if b is None else b, MAX_WAIT_S)
                      for b in (bases or [None] * n)],
            "caps": [min(retry_cap if c is None else c, MAX_WAIT_S)
                     for c in (caps or [None] * n)],
            "jitters": list(jitters or [0.0] * n),
        })
        return [(r[0], r[1], r[2]) for r in cur.fetchall()]

    def snooze_many(self, ids: Sequence[int], fences: Sequence[int],
                    seconds: Sequence[float]) -> dict[int, datetime]:
        """Snoozed jobs back to queued, run_at moved on, no attempt used: {id: run_at}."""
        if not ids:
            return {}
        cur = self._exec("snooze_many", {
            "ids": list(ids), "fences": list(fences),
            "seconds": [min(float(v), MAX_WAIT_S) for v in seconds]})
        return {r[0]: r[1] for r in cur.fetchall()}

    def claim_batch_capped(self, queue: str, batch_size: int, lease: float,
                           max_running: int, *, start_now: int | None = None,
                           run_id: str | None = None) -> list[ClaimedRow]:
        """claim_batch for a queue with max_running: in one transaction, under the queue's
        advisory lock, at most max_running minus the jobs running under a live lease.
        Sent as one pipeline (BEGIN, lock, claim, COMMIT): one round trip."""
        params = {"queue": queue, "batch_size": batch_size, "lease": lease,
                  "max_running": max_running,
                  "start_now": how_many_start(start_now, batch_size), "run_id": run_id}
        with self.conn.pipeline(), self.conn.transaction():
            self._exec("queue_claim_lock",
                       {"key": f"drainer:max_running:{self.schema}.{self.table}:{queue}"})
            cur = self._exec("claim_batch_capped", params)
        rows = [ClaimedRow(*r) for r in cur.fetchall()]
        rows.sort(key=claim_order)
        return rows

    def claim_batch_rated(self, queue: str, batch_size: int, lease: float,
                          max_running: int | None, rate: Rate, *,
                          start_now: int | None = None, run_id: str | None = None
                          ) -> tuple[list[ClaimedRow], datetime | None, int]:
        """claim_batch for a queue with a rate limit (and max_running, or None): in one
        transaction, under the queue's claim lock, at most ``rate.count`` claimed in any
        ``rate.period`` seconds. One round trip. Returns (rows, rate_next_at: when the full
        window next has room or None, rate_limited: due jobs left for a later slot)."""
        params = {"queue": queue, "batch_size": batch_size, "lease": lease,
                  "max_running": max_running, "rate_count": rate.count,
                  "rate_period": rate.period, "count_limit": RATE_LIMITED_COUNT_MAX,
                  "start_now": how_many_start(start_now, batch_size), "run_id": run_id}
        with self.conn.pipeline(), self.conn.transaction():
            self._exec("queue_claim_lock",
                       {"key": f"drainer:max_running:{self.schema}.{self.table}:{queue}"})
            cur = self._exec("claim_batch_rated", params)
        result = cur.fetchall()
        rows = [ClaimedRow(*r[:10]) for r in result if r[0] is not None]
        rows.sort(key=claim_order)
        next_at = result[0][10] if result else None
        limited = int(result[0][11]) if result else 0
        return rows, next_at, limited

    def set_limits(self, queues: Sequence[str], *, max_running: int | None = None,
                   rate: Rate | None = None, clear_max_running: bool = False,
                   clear_rate: bool = False) -> list[dict[str, Any]]:
        """The operator's limits of ``queues`` (``drainer limit``): rows as set."""
        cur = self.conn.cursor(row_factory=dict_row)
        cur.execute(self._sql["queue_limit"], {
            "queues": list(queues), "max_running": max_running,
            "rate_count": None if rate is None else rate.count,
            "rate_period": None if rate is None else rate.period,
            "clear_max_running": clear_max_running, "clear_rate": clear_rate})
        return list(cur.fetchall())

    def extend_many(
        self, ids: Sequence[int], fences: Sequence[int], leases: Sequence[float]
    ) -> dict[int, datetime]:
        if not ids:
            return {}
        cur = self._exec("extend_many", {
            "ids": list(ids), "fences": list(fences), "leases": list(leases),
        })
        return {r[0]: r[1] for r in cur.fetchall()}

    def release_many(self, ids: Sequence[int], fences: Sequence[int]) -> set[int]:
        if not ids:
            return set()
        cur = self._exec("release_many", {"ids": list(ids), "fences": list(fences)})
        return {r[0] for r in cur.fetchall()}

    def lock_running(self, job_id: int, fence: int) -> bool:
        """Lock a job we still own (FOR UPDATE, fenced), inside the caller's transaction."""
        return self._exec("lock_running", {"id": job_id, "fence": fence}).fetchone() \
            is not None

    def reap_expired(self, queues: Sequence[str],
                     max_attempts: Sequence[int | None] | None = None
                     ) -> list[tuple[int, str, int]]:
        """Reap the expired leases of ``queues``; ``max_attempts``: each queue's task's
        max_attempts (None: the row's)."""
        limits = list(max_attempts) if max_attempts is not None else [None] * len(queues)
        cur = self._exec("reap_expired", {"queues": list(queues), "max_attempts": limits})
        return [(r[0], r[1], r[2]) for r in cur.fetchall()]

    def archive_batch(self, status: str, older_than: float, batch_size: int,
                      move: bool) -> int:
        cur = self._exec("archive_move" if move else "archive_delete", {
            "status": status, "older_than": older_than, "batch_size": batch_size,
        })
        return cur.rowcount

    def queue_summary(self, queues: Sequence[str]) -> tuple[int, datetime | None]:
        remaining, next_due, _ = self.queue_summary_served(queues, None)
        return remaining, next_due

    def queue_summary_served(
        self, queues: Sequence[str], served: Sequence[str] | None,
    ) -> tuple[int, datetime | None, dict[str, int]]:
        """queue_summary, and the jobs due on queues outside ``served`` (every queue with a
        handler), by queue ({} when ``served`` is None)."""
        row = self._exec("queue_summary", {
            "queues": list(queues), "served": None if served is None else list(served),
        }).fetchone()
        assert row is not None
        return int(row[0]), row[1], counts(row[2])

    def finish_run(self, queues: Sequence[str], archive_after: float, failed_retention: float,
                   batch_size: int, served: Sequence[str] | None = None) -> dict[str, Any]:
        """One archive_delete batch of each status, table_health and queue_summary at once.

        Keys: archived_done, archived_failed, the table_health keys, remaining_due,
        next_due_at, unserved_due (jobs due on queues outside ``served``, by queue;
        ``served`` defaults to ``queues``).
        """
        cur = self.conn.cursor(row_factory=dict_row)
        cur.execute(self._sql["finish_run"], finish_params(
            self.regclass, queues, archive_after=archive_after,
            failed_retention=failed_retention, batch_size=batch_size, served=served))
        out = finish_row(cur)
        assert out is not None
        return out

    def complete_many_and_finish(
        self, ids: Sequence[int], fences: Sequence[int], finish: dict[str, Any], *,
        delete: bool = False, results: Sequence[str | None] | None = None,
        followups: str | None = None,
    ) -> tuple[set[int], dict[str, Any] | None]:
        """complete_many (``delete``: delete_completed_many), then finish_run
        (``finish``: its keyword arguments) with ``if_drained``, in one simple-protocol
        Query (one round trip, one transaction): the end of the run when no job of the
        drained queues is due once the completions are in; else it does nothing (None)."""
        name = "delete_completed_many" if delete else "complete_many"
        params = {**completion_params(ids, fences, results, followups),
                  **finish_params(self.regclass, if_drained=True, **finish)}
        cur = psycopg.ClientCursor(self.conn)
        cur.execute(self._sql[name] + ";\n" + self._sql["finish_run"], params)
        written = {r[0] for r in cur.fetchall()}
        cur.nextset()
        cur.row_factory = dict_row
        return written, finish_row(cur)

    def queue_seen(self, queue: str) -> bool:
        """Whether the table holds any job of ``queue``, of any status."""
        row = self._exec("queue_seen", {"queue": queue}).fetchone()
        return bool(row and row[0])

    def vacuum_during_drain(self, timeout: float | None = None) -> None:
        self._vacuum("vacuum_during_drain", timeout)

    def vacuum_after_drain(self, analyze: bool = True, timeout: float | None = None) -> None:
        self._vacuum("vacuum_after_drain" if analyze else "vacuum_after_drain_keep_stats",
                     timeout)

    def _vacuum(self, name: str, timeout: float | None) -> None:
        """The VACUUM ``name``, under ``statement_timeout = timeout`` seconds (0: none), then
        the session's own again (RESET); None: under the session's. A session SET: VACUUM
        runs in no transaction block (so no SET LOCAL) nor in a multi-statement Query, so
        the SET, the VACUUM and the RESET are three statements, sent in one flight (a Sync
        after each): the timeout costs no round trip of its own (10 ms away, two of every
        run that vacuums). Through a transaction-mode pooler the three may land on
        different server connections: drainer passes None there (session_options off).
        Raised once the RESET ran: the VACUUM's error, else the SET's (the VACUUM did not
        run under the budget asked for); the RESET's is only logged (a broken connection:
        it is not used again)."""
        if timeout is None:
            self._exec(name)
            return
        set_timeout = sql.SQL("SET statement_timeout = {}").format(
            sql.Literal(max(0, int(timeout * 1000)))).as_string(self.conn)
        setting, failed, reset = one_flight(self.conn, [set_timeout, self._sql[name],
                                                        "RESET statement_timeout"])
        if reset is not None:
            logger.debug("RESET statement_timeout failed: %s", one_line(reset))
        error = failed if failed is not None else setting
        if error is not None:
            raise error

    def table_health(self) -> dict[str, Any]:
        cur = self.conn.cursor(row_factory=dict_row)
        cur.execute(self._sql["table_health"], {"regclass": self.regclass})
        row = cur.fetchone()
        return dict(row) if row else {}

    # -- status ---------------------------------------------------------------------------------
    def fetch_dicts(self, name: str, params: dict[str, Any] | None = None
                    ) -> list[dict[str, Any]]:
        cur = self.conn.cursor(row_factory=dict_row)
        cur.execute(self._sql[name], params)
        return list(cur.fetchall())

