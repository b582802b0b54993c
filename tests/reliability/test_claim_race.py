"""The experiment of *Postgres as a job queue: using FOR UPDATE SKIP LOCKED correctly*: 8
concurrent claimers over 10,000 jobs.

drainer's claim (``Queries.claim_batch``: a CTE with FOR UPDATE SKIP LOCKED) hands every
job to exactly one claimer. The naive ``UPDATE ... WHERE id = (SELECT id ... LIMIT 1)``
is the negative control: under READ COMMITTED the blocked claimers re-check only
``id = ...`` after the first commits, so they take the same job again and again.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.db import Queries
from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings
from tests.article import ARTICLE_CREATE_TABLE

JOBS = 10_000
WORKERS = 8
NAIVE_JOBS = 2_000

# The article's table, index and naive statement (its naive.sql marks the job done at once).
ARTICLE_DDL = ARTICLE_CREATE_TABLE + """;
CREATE INDEX ON {t} (queue, run_at) WHERE status = 'queued';
INSERT INTO {t} (payload) SELECT jsonb_build_object('email_id', g)
FROM generate_series(1, %(jobs)s) AS g;
"""
NAIVE = """
UPDATE {t} SET status = 'done', attempts = attempts + 1
WHERE id = (SELECT id FROM {t} WHERE status = 'queued' ORDER BY run_at LIMIT 1)
RETURNING id, attempts
"""


def _article_table(conn: psycopg.Connection[Any], schema: str, jobs: int = JOBS
                   ) -> sql.Composed:
    t = sql.Identifier(schema, "article_jobs")
    with conn.transaction():
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        for stmt in ARTICLE_DDL.split(";"):
            if stmt.strip():
                conn.execute(sql.SQL(stmt).format(t=t), {"jobs": jobs})  # type: ignore[arg-type]
    return t  # type: ignore[return-value]


def _summary(conn: psycopg.Connection[Any], table: sql.Composable) -> dict[str, tuple[int, int]]:
    rows = conn.execute(sql.SQL(
        "SELECT status, count(*), max(attempts) FROM {} GROUP BY status").format(table))
    return {status: (count, max_attempts) for status, count, max_attempts in rows}


def _in_threads(pg_url: str, work: Any) -> None:
    start = threading.Barrier(WORKERS)
    errors: list[BaseException] = []

    def main(n: int) -> None:
        try:
            with psycopg.connect(pg_url, autocommit=True) as c:
                start.wait()
                work(n, c)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=main, args=(n,)) for n in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.slow
def test_drainer_claim_runs_each_of_10000_jobs_exactly_once(
    migrated: Settings, conn: psycopg.Connection[Any], pg_url: str
) -> None:
    enqueue_many(conn, [JobSpec("default", {"email_id": i}, max_attempts=1)
                        for i in range(JOBS)], schema=migrated.schema_name)
    runs: Counter[int] = Counter()
    claims = [0] * WORKERS
    lock = threading.Lock()

    def work(n: int, c: psycopg.Connection[Any]) -> None:
        q = Queries(c, migrated.schema_name, migrated.table)
        while True:
            rows = q.claim_batch("default", 1, 300.0)  # one job a claim, as in the article
            if not rows:
                return
            claims[n] += 1
            with lock:
                runs.update(r.id for r in rows)  # the "execution"
            written = q.complete_many([r.id for r in rows], [r.attempts for r in rows])
            assert written == {r.id for r in rows}

    _in_threads(pg_url, work)
    summary = _summary(conn, sql.Identifier(migrated.schema_name, migrated.table))
    print(f"\ndrainer claim_batch, {WORKERS} threads: {sum(claims)} claims, "
          f"{len(runs)} distinct jobs run, {sum(runs.values())} executions, table {summary}")
    assert summary == {"done": (JOBS, 1)}
    assert len(runs) == JOBS and set(runs.values()) == {1}
    assert sum(claims) == JOBS


@pytest.mark.slow
def test_naive_claim_runs_jobs_several_times(conn: psycopg.Connection[Any], pg_url: str,
                                             schema: str) -> None:
    """Negative control: the same experiment with the naive statement loses and repeats.

    On 2,000 jobs (8 x 250 claims) to stay fast: the naive statement sorts every queued
    row on each claim. The article's full 10,000 runs under pgbench below.
    """
    table = _article_table(conn, schema, NAIVE_JOBS)
    stmt = sql.SQL(NAIVE).format(t=table)
    runs: Counter[int] = Counter()
    lock = threading.Lock()

    def work(n: int, c: psycopg.Connection[Any]) -> None:
        for _ in range(NAIVE_JOBS // WORKERS):  # as many claims as jobs, as in the article
            row = c.execute(stmt).fetchone()
            if row is not None:
                with lock:
                    runs[row[0]] += 1

    _in_threads(pg_url, work)
    summary = _summary(conn, table)
    dup = sum(n - 1 for n in runs.values())
    print(f"\nnaive, {WORKERS} threads x {NAIVE_JOBS // WORKERS} claims: table {summary}; "
          f"{dup} duplicate executions; most runs of one job {max(runs.values())}")
    done, worst = summary["done"]
    assert done < NAIVE_JOBS, "the naive claim should lose jobs to duplicates"
    assert worst > 1 and dup > 0
    assert summary["queued"][0] == NAIVE_JOBS - done


PGBENCH = shutil.which("pgbench")


@pytest.mark.slow
@pytest.mark.skipif(PGBENCH is None, reason="pgbench is not installed (the thread-based "
                    "tests above cover the same ground)")
def test_article_pgbench_experiment(conn: psycopg.Connection[Any], pg_url: str, schema: str,
                                    migrated: Settings, tmp_path: Path) -> None:
    """The article's exact command: pgbench -n -c 8 -j 8 -t 1250, naive vs drainer's claim."""
    assert PGBENCH is not None
    naive_table = _article_table(conn, schema)
    naive_sql = tmp_path / "naive.sql"
    naive_sql.write_text(" ".join(sql.SQL(NAIVE).format(t=naive_table).as_string(conn)
                                  .split()) + ";\n")

    # drainer's claim statement as drainer renders it, one job a claim (pgbench -t counts
    # claims), its parameters inlined as literals.
    enqueue_many(conn, [JobSpec("default", {"email_id": i}, max_attempts=1)
                        for i in range(JOBS)], schema=migrated.schema_name)
    q = Queries(conn, migrated.schema_name, migrated.table)
    claim = psycopg.ClientCursor(conn).mogrify(
        q.text("claim_batch"), {"queue": "default", "batch_size": 1, "lease": 300.0,
                                "start_now": 1, "run_id": "pgbench"})
    claim_sql = tmp_path / "claim.sql"
    claim_sql.write_text(" ".join(claim.split()) + ";\n")

    for script in (naive_sql, claim_sql):
        subprocess.run([PGBENCH, "-n", "-c", str(WORKERS), "-j", str(WORKERS), "-t",
                        str(JOBS // WORKERS), "-f", str(script), pg_url],
                       check=True, capture_output=True, timeout=120)
    naive = _summary(conn, naive_table)
    ours = _summary(conn, sql.Identifier(migrated.schema_name, migrated.table))
    print(f"\npgbench -c 8 -j 8 -t 1250: naive {naive}; drainer claim_batch {ours}")
    assert naive["done"][0] < JOBS and naive["done"][1] > 1
    # Every claim took a job of its own: each job claimed once (running, attempts 1).
    # A claim may find every remaining row locked by the others near the end and return
    # nothing, so a handful may still be queued, never claimed twice.
    assert ours["running"][1] == 1
    assert ours["running"][0] + ours.get("queued", (0, 0))[0] == JOBS
    assert ours["running"][0] >= JOBS - WORKERS
