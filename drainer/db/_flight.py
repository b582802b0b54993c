"""Statements on psycopg's low-level ``pgconn``, several to a round trip.

``execute`` sends a statement and waits for its answer: a round trip each. In libpq's
pipeline mode statements go out together, each followed by a Sync so that each runs in a
transaction of its own, and their answers are read in order. The drain's claims use it
(:mod:`drainer.db._pipeline`); so do statements that run one behind the other and need no
answer in between (:func:`one_flight`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import generators, pq


def one_flight(conn: psycopg.Connection[Any], statements: Sequence[str]
               ) -> list[psycopg.Error | None]:
    """Run statements without parameters, each in a transaction of its own (a Sync after
    each: a VACUUM may be among them), sent together and read together: one round trip
    where ``execute`` takes one each. Each one runs whatever the one before did; what they
    give is each one's error, or None. A broken connection raises at once."""
    pgconn, encoding = conn.pgconn, conn.info.encoding
    pgconn.enter_pipeline_mode()
    try:
        for text in statements:
            pgconn.send_query_params(text.encode(encoding), None)
            pgconn.pipeline_sync()
        if pgconn.flush():
            conn.wait(generators.send(pgconn))
        out: list[psycopg.Error | None] = []
        for _ in statements:
            failed = [res for res in read_results(conn) if res.status == pq.ExecStatus.FATAL_ERROR]
            check_sync(next_result(conn))
            out.append(psycopg.errors.error_from_result(failed[0], encoding=encoding)
                       if failed else None)
    finally:
        if pgconn.pipeline_status != pq.PipelineStatus.OFF and not pgconn.is_busy():
            pgconn.exit_pipeline_mode()
    return out


def next_result(conn: psycopg.Connection[Any]) -> pq.abc.PGresult | None:
    """The next result on the connection (None: the end of a statement's). psycopg's
    ``fetch`` waits for one still on its way; one already read is taken at once, without
    the generator, the wait and the GIL hand-offs around each libpq call that ``fetch``
    costs (five results a statement, most of them already read)."""
    if conn.pgconn.is_busy():
        res: pq.abc.PGresult | None = conn.wait(generators.fetch(conn.pgconn))
        return res
    return conn.pgconn.get_result()


def read_results(conn: psycopg.Connection[Any]) -> list[pq.abc.PGresult]:
    """The results of the statement at the head of the connection, up to its end."""
    out: list[pq.abc.PGresult] = []
    while (res := next_result(conn)) is not None:
        out.append(res)
    return out


def check_sync(res: pq.abc.PGresult | None) -> None:
    if res is None or res.status != pq.ExecStatus.PIPELINE_SYNC:
        raise psycopg.OperationalError("pipeline out of step: expected a sync result")
