"""The claim pipeline: ``complete_many_and_claim`` statements in flight on one connection.

Hand-written on psycopg's low-level ``pgconn`` because the drain leaves a statement in
flight across its steps (send the next claim, run a batch's handlers, read the claim
before it) and commits each statement on its own, where :class:`psycopg.Pipeline` reads
back every statement queued whenever a cursor fetches (or at ``sync()`` and at the end
of its block: the fetch waits for the claim sent ahead too) and joins its statements in
one transaction up to a Sync. Waiting goes through psycopg's own machinery
(:mod:`psycopg.generators` driven by the connection's ``wait``), whose sending reads
while it writes: in pipeline mode a client that only writes deadlocks once the server
blocks writing results nobody reads and so stops reading what is sent. What it pays:
``python -m bench.pipeline`` (the statement alone, in step against pipelined; see
docs/performance.md, "Pipelined completion + claim").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import generators, pq

from drainer.db._flight import check_sync, next_result, read_results
from drainer.db.encoders import ints_text, positional, results_text
from drainer.db.queries import ClaimedRow, claim_order, how_many_start

if TYPE_CHECKING:
    from drainer.db.queries import Queries

#: seconds between the wait's wake-ups to notice an interrupt (psycopg's connections use 0.1)
WAIT_INTERVAL = 0.1


class ClaimPipeline:
    """``complete_many_and_claim`` statements in flight on one connection, read in order.

    psycopg's ``execute`` sends a statement and waits for it; this sends up to ``depth``
    of them ahead (libpq pipeline mode, a Sync after each so that each commits on its
    own), so the server runs the next statement while the drain runs a batch's handlers
    and reads the previous result (measured: see README, Performance). While statements
    are in flight the connection belongs to the pipeline: :meth:`close` (which reads what
    is left) must come before any other statement.

    Parameters go in text form, typed by the statement's casts; results are decoded by
    the connection's own loaders. With prepared statements allowed the statement is
    prepared once (a named protocol-level statement, as psycopg's own prepare does);
    else it is sent unnamed each time.
    """

    NAME = "complete_many_and_claim"

    def __init__(self, queries: Queries) -> None:
        self.conn = queries.conn
        self.pgconn = queries.conn.pgconn
        self.text, self.names = positional(queries.text(self.NAME))
        self.encoding = queries.conn.info.encoding
        # the prepared statement's name; None: sent unnamed each time (prepared statements off)
        self.statement: bytes | None = None if queries.conn.prepare_threshold is None else \
            f"drainer_{self.NAME}_{id(self):x}".encode()
        self.prepared = False
        # the prepare went out ahead of the first statement and its results are not read yet
        self.prepare_unread = False
        # prepared: ask for the generic plan (see queries.sql, generic_plan_for_this_transaction),
        # by a prepared statement too (sent unnamed, it was parsed again before each claim)
        self.generic = self.statement is not None
        self.generic_plan = queries.text("generic_plan_for_this_transaction").encode()
        self.generic_name = f"drainer_generic_plan_{id(self):x}".encode()
        self.in_flight = 0
        self._loaders: dict[int, Callable[[bytes], Any]] = {}

    @staticmethod
    def supported() -> bool:
        """Whether the libpq psycopg uses has pipeline mode (libpq 14 and later)."""
        return psycopg.Pipeline.is_supported()

    def send(self, ids: Sequence[int], fences: Sequence[int], queue: str, batch_size: int,
             lease: float, start_now: int | None = None, run_id: str | None = None,
             results: Sequence[str | None] | None = None, followups: str | None = None
             ) -> None:
        """Send one completion + claim; the server runs it behind those sent before."""
        pgconn = self.pgconn
        if not self.in_flight:
            pgconn.enter_pipeline_mode()
            if self.statement is not None and not self.prepared:
                self._prepare(self.statement)
        values: dict[str, bytes | None] = {
            "ids": ints_text(ids).encode(), "fences": ints_text(fences).encode(),
            "results": results_text(results).encode(),
            "followups": (followups or "[]").encode(self.encoding),
            "queue": queue.encode(self.encoding), "batch_size": str(int(batch_size)).encode(),
            "lease": repr(float(lease)).encode(),
            "start_now": str(how_many_start(start_now, batch_size)).encode(),
            "run_id": None if run_id is None else run_id.encode(self.encoding)}
        params: list[bytes | None] = [values[n] for n in self.names]
        if self.generic:
            pgconn.send_query_prepared(self.generic_name, None)
        if self.statement is None:
            pgconn.send_query_params(self.text.encode(), params)
        else:
            pgconn.send_query_prepared(self.statement, params)
        pgconn.pipeline_sync()
        self.in_flight += 1
        # flush() sends what the socket takes; what is left waits for the socket to take
        # it or for input to read (generators.send reads it: see the module's docstring)
        if pgconn.flush():
            self.conn.wait(generators.send(pgconn))

    def _prepare(self, statement: bytes) -> None:
        """Prepare the statement and the generic plan's (one Sync for both) ahead of the
        first statement, not waited for: their results are read before its own
        (:meth:`_prepared`), so that the prepare costs no round trip of its own (10 ms
        away, it was one of a 20,000-job drain's few dozen)."""
        pgconn = self.pgconn
        pgconn.send_prepare(statement, self.text.encode())
        pgconn.send_prepare(self.generic_name, self.generic_plan)
        pgconn.pipeline_sync()
        self.prepared = self.prepare_unread = True

    def _prepared(self) -> pq.abc.PGresult | None:
        """Read the prepare's results, sent ahead of the oldest statement: its error, if
        any (the statements behind it then fail too: nothing written, nothing claimed)."""
        self.prepare_unread = False
        errors = [res for _ in range(2) for res in read_results(self.conn)
                  if res.status == pq.ExecStatus.FATAL_ERROR]
        check_sync(next_result(self.conn))
        if errors:
            self.prepared = False
        return errors[0] if errors else None

    def receive(self) -> tuple[set[int], list[ClaimedRow]]:
        """The oldest statement's result: ids written and rows claimed; or its error
        (then it rolled back whole: nothing written, nothing claimed)."""
        if not self.in_flight:
            raise RuntimeError("no statement in flight")
        failed = self._prepared() if self.prepare_unread else None
        setting = read_results(self.conn) if self.generic else []
        results = read_results(self.conn)
        sync = next_result(self.conn)
        self.in_flight -= 1
        check_sync(sync)
        if not self.in_flight:
            self.pgconn.exit_pipeline_mode()
        if failed is not None:  # what the statement failed by (it names no prepared one)
            _check(failed, self.encoding)
        written: set[int] = set()
        rows: list[ClaimedRow] = []
        for res in setting:
            _check(res, self.encoding)
        for res in results:
            _check(res, self.encoding)
            if not res.ntuples:
                continue
            # kind, id, queue, payload, attempts, max_attempts, priority, run_at, locked_until,
            # fence, trace_context
            queue, payload, run_at, locked_until, trace_context = (
                self._loader(res.ftype(c)) for c in (2, 3, 7, 8, 10))
            get = res.get_value
            for i in range(res.ntuples):
                if get(i, 0) == b"done":
                    written.add(int(_value(get(i, 1))))
                    continue
                rows.append(ClaimedRow(
                    int(_value(get(i, 1))), queue(_value(get(i, 2))),
                    payload(_value(get(i, 3))), int(_value(get(i, 4))),
                    int(_value(get(i, 5))), int(_value(get(i, 6))),
                    run_at(_value(get(i, 7))), locked_until(_value(get(i, 8))),
                    int(_value(get(i, 9))), _nullable(trace_context, get(i, 10))))
        rows.sort(key=claim_order)
        return written, rows

    def close(self) -> list[tuple[set[int], list[ClaimedRow]] | BaseException]:
        """Read every statement still in flight (results or errors, in order; a broken
        connection raises at once); the connection is then free for other statements."""
        out: list[tuple[set[int], list[ClaimedRow]] | BaseException] = []
        while self.in_flight:
            try:
                out.append(self.receive())
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:
                out.append(exc)
        return out

    def _loader(self, oid: int) -> Callable[[bytes], Any]:
        f = self._loaders.get(oid)
        if f is None:
            cls = self.conn.adapters.get_loader(oid, pq.Format.TEXT)
            if cls is None:
                raise psycopg.InterfaceError(f"no loader for type oid {oid}")
            f = self._loaders[oid] = cls(oid, self.conn).load
        return f


def _nullable(load: Callable[[bytes], Any], value: bytes | None) -> Any:
    """A column that may be NULL (``get_value`` gives None for NULL)."""
    return None if value is None else load(value)


def _value(value: bytes | None) -> bytes:
    if value is None:  # the statement's columns are NOT NULL for claimed rows
        raise psycopg.DataError("unexpected NULL in a claimed row")
    return value


def _check(res: pq.abc.PGresult, encoding: str) -> None:
    if res.status == pq.ExecStatus.FATAL_ERROR:
        raise psycopg.errors.error_from_result(res, encoding=encoding)
