"""Operator commands against the real PostgreSQL: status, jobs, show, retry, cancel, purge."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer import Job, run_once
from drainer.cli.control import render_counts
from drainer.cli.jobs import render_job, render_jobs
from drainer.cli.status import render_status
from drainer.errors import ConfigError
from drainer.ops import JobNotFound, cancel_jobs, get_job, list_jobs, purge_jobs, retry_jobs
from drainer.producer import JobSpec, enqueue_many
from drainer.registry import Registry
from drainer.settings import Settings
from drainer.status import collect_status
from tests.conftest import make_settings

Conn = psycopg.Connection[Any]


def jobs_table(s: Settings) -> sql.Composed:
    return sql.SQL("{}").format(sql.Identifier(s.schema_name, s.table))


def add(conn: Conn, s: Settings, queue: str = "q", n: int = 1, *, status: str = "queued",
        **cols: Any) -> list[int]:
    """Insert n jobs, then set their status and any other columns directly."""
    with conn.transaction():
        enqueue_many(conn, [JobSpec(queue, {"i": i}) for i in range(n)],
                     schema=s.schema_name)
        ids = [r[0] for r in conn.execute(
            sql.SQL("SELECT id FROM {} ORDER BY id DESC LIMIT %s").format(jobs_table(s)),
            (n,)).fetchall()]
    sets = {"status": status, **cols}
    if status in ("done", "failed") and "finished_at" not in sets:
        sets["finished_at"] = sql.SQL("now()")
    assignments = sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.Identifier(k), v if isinstance(v, sql.Composable)
                                  else sql.Literal(v))
        for k, v in sets.items())
    conn.execute(sql.SQL("UPDATE {} SET {} WHERE id = ANY(%s)").format(
        jobs_table(s), assignments), (ids,))
    return sorted(ids)


def snapshot(conn: Conn, s: Settings) -> list[tuple[Any, ...]]:
    return conn.execute(sql.SQL("SELECT * FROM {} ORDER BY id").format(jobs_table(s))
                        ).fetchall()


def row(conn: Conn, s: Settings, job_id: int) -> dict[str, Any]:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    cur.execute(sql.SQL("SELECT * FROM {} WHERE id = %s").format(jobs_table(s)), (job_id,))
    r = cur.fetchone()
    assert r is not None
    return dict(r)


def ago(seconds: float) -> sql.Composable:
    return sql.SQL("now() - {} * interval '1 second'").format(sql.Literal(seconds))


# -- status ---------------------------------------------------------------------------------------


def test_status_reports_queues_leases_dead_letters_and_table(migrated: Settings,
                                                             conn: Conn) -> None:
    s = migrated
    add(conn, s, "mail", 3, run_at=ago(120))
    add(conn, s, "mail", 2, run_at=sql.SQL("now() + interval '1 hour'"))
    add(conn, s, "mail", 2, status="running", attempts=1,
        locked_until=ago(5))                       # expired leases
    add(conn, s, "mail", 1, status="running", attempts=1,
        locked_until=sql.SQL("now() + interval '5 minutes'"))
    add(conn, s, "mail", 4, status="failed", last_error="SMTP 451: try again\ntraceback")
    add(conn, s, "mail", 1, status="failed", last_error="KeyError: 'to'")
    add(conn, s, "mail", 5, status="done")
    # a quiet queue whose only error must not be crowded out by the busy one
    add(conn, s, "pdf", 1, status="failed", last_error="TimeoutError: render")
    conn.execute(sql.SQL("VACUUM {}").format(jobs_table(s)))

    st = collect_status(s)
    mail = st["queues"]["mail"]
    assert (mail["queued"], mail["due"], mail["running"], mail["failed"], mail["done"]) == \
        (5, 3, 3, 5, 5)
    assert 119 <= mail["oldest_due_age_s"] < 200
    assert mail["expired_leases"] == 2
    assert mail["next_due_at"] is not None
    assert mail["failed_errors"] == [{"error": "SMTP 451: try again", "jobs": 4},
                                     {"error": "KeyError: 'to'", "jobs": 1}]
    assert st["queues"]["pdf"]["top_failed_error"] == {"error": "TimeoutError: render",
                                                       "jobs": 1}
    assert st["totals"]["failed"] == 6 and st["expired_leases"] == 2
    assert st["index_bytes"] > 0 and st["table_bytes"] > 0
    assert st["last_vacuum"] is not None
    assert st["n_dead_tup"] is not None
    text = render_status(st)
    for needle in ("mail", "pdf", "SMTP 451: try again", "expired leases:  2", "indexes",
                   "last vacuum", "dead tuples"):
        assert needle in text


def test_status_uses_one_connection_and_four_statements(
        migrated: Settings, conn: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    add(conn, migrated, "q", 2)
    opened: list[psycopg.Connection[Any]] = []
    statements: list[str] = []
    real_connect = psycopg.connect
    real_execute = psycopg.Cursor.execute

    def spy_connect(*a: Any, **kw: Any) -> Any:
        c = real_connect(*a, **kw)
        opened.append(c)
        return c

    def spy_execute(self: Any, query: Any, *a: Any, **kw: Any) -> Any:
        statements.append(str(query)[:40])
        return real_execute(self, query, *a, **kw)

    monkeypatch.setattr(psycopg, "connect", spy_connect)
    monkeypatch.setattr(psycopg.Cursor, "execute", spy_execute)
    collect_status(migrated)
    monkeypatch.undo()
    assert len(opened) == 1
    assert opened[0].closed
    assert len(statements) == 4, statements


# -- jobs and show --------------------------------------------------------------------------------


def test_jobs_filters_and_limit(migrated: Settings, conn: Conn) -> None:
    s = migrated
    a = add(conn, s, "a", 3)
    b_failed = add(conn, s, "b", 2, status="failed", last_error="E: one\ntwo")
    rows = list_jobs(s)
    assert [r["id"] for r in rows] == sorted(a + b_failed, reverse=True)
    assert [r["id"] for r in list_jobs(s, queue="a")] == sorted(a, reverse=True)
    failed = list_jobs(s, status="failed")
    assert [r["id"] for r in failed] == sorted(b_failed, reverse=True)
    assert failed[0]["error"] == "E: one"
    assert len(list_jobs(s, limit=2)) == 2
    assert list_jobs(s, queue="a", status="failed") == []
    assert "E: one" in render_jobs(failed)
    with pytest.raises(ConfigError):
        list_jobs(s, status="bogus")


def test_show_gives_full_last_error(migrated: Settings, conn: Conn) -> None:
    error = "ValueError: bad\n" + "\n".join(f"  frame {i}" for i in range(50))
    [job_id] = add(conn, migrated, "a", 1, status="failed", last_error=error)
    job = get_job(migrated, job_id)
    assert job["last_error"] == error
    assert job["payload"] == {"i": 0}
    assert job["status"] == "failed"
    text = render_job(job)
    assert "frame 49" in text and '"i": 0' in text
    with pytest.raises(JobNotFound):
        get_job(migrated, job_id + 1000)


def test_show_lines_up_every_value(migrated: Settings, conn: Conn) -> None:
    """`last_error: -` and `rate_limited_until: -` in the column of the other values."""
    [job_id] = add(conn, migrated, "a", 1)
    job = get_job(migrated, job_id)
    assert job["last_error"] is None and job["result"] is None
    lines = render_job(job).splitlines()
    one_line = [ln for ln in lines if ln.endswith(": -") or ":  " in ln]
    labels = {ln.split(":", 1)[0] for ln in one_line}
    assert {"id", "status", "last_error", "result", "rate_limited_until"} <= labels, lines
    starts = {len(ln) - len(ln.split(":", 1)[1].lstrip()) for ln in one_line}
    assert len(starts) == 1, lines


# -- retry ----------------------------------------------------------------------------------------


def test_retry_by_id_resets_and_leaves_others(migrated: Settings, conn: Conn) -> None:
    s = migrated
    f1, f2 = add(conn, s, "a", 2, status="failed", attempts=5, last_error="boom",
                 run_at=ago(3600))
    [done] = add(conn, s, "a", 1, status="done", attempts=1)
    before_f2, before_done = row(conn, s, f2), row(conn, s, done)
    report = retry_jobs(s, ids=[f1, done, 999_999])
    assert report["retried"] == 1 and report["retried_ids"] == [f1]
    assert report["not_failed_ids"] == [done] and report["not_found_ids"] == [999_999]
    r = row(conn, s, f1)
    assert (r["status"], r["attempts"], r["finished_at"], r["locked_until"]) == \
        ("queued", 0, None, None)
    assert r["last_error"] == "boom"
    age = conn.execute("SELECT extract(epoch FROM now() - %s)", (r["run_at"],)).fetchone()
    assert age is not None and abs(float(age[0])) < 5
    assert row(conn, s, f2) == before_f2
    assert row(conn, s, done) == before_done


def test_retry_by_queue_and_all_failed(migrated: Settings, conn: Conn) -> None:
    s = migrated
    a = add(conn, s, "a", 2, status="failed")
    b = add(conn, s, "b", 3, status="failed")
    queued = add(conn, s, "a", 1)
    report = retry_jobs(s, queue="a")
    assert report["retried"] == 2 and "retried_ids" not in report
    assert all(row(conn, s, i)["status"] == "queued" for i in a)
    assert all(row(conn, s, i)["status"] == "failed" for i in b)
    assert row(conn, s, queued[0])["attempts"] == 0
    assert retry_jobs(s, all_failed=True)["retried"] == 3
    assert all(row(conn, s, i)["status"] == "queued" for i in b)
    assert retry_jobs(s, all_failed=True)["retried"] == 0


def test_retry_skips_jobs_whose_dedup_key_is_taken(migrated: Settings, conn: Conn) -> None:
    s = migrated
    [taken] = add(conn, s, "a", 1, status="failed", dedup_key="k1")
    add(conn, s, "a", 1, dedup_key="k1")                       # k1 queued again since
    old, new = add(conn, s, "a", 2, status="failed", dedup_key="k2")  # both failed
    [free] = add(conn, s, "a", 1, status="failed")
    report = retry_jobs(s, all_failed=True)
    assert report["retried"] == 2
    assert report["skipped_dedup"] == 2
    assert report["skipped_dedup_ids"] == [taken, old]
    assert report["skipped_dedup_keys"] == ["k1", "k2"]
    assert row(conn, s, taken)["status"] == "failed"
    assert row(conn, s, old)["status"] == "failed"
    assert row(conn, s, new)["status"] == "queued"
    assert row(conn, s, free)["status"] == "queued"
    assert "skipped dedup 2" in render_counts(report)


def test_retry_survives_a_dedup_key_taken_between_plan_and_update(
        migrated: Settings, conn: Conn, pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A producer inserts the key while retry runs: retry plans again and skips it."""
    caplog.set_level("INFO", logger="drainer.ops")
    s = migrated
    [failed] = add(conn, s, "a", 1, status="failed", dedup_key="race")
    with psycopg.connect(pg_url) as producer:  # a transaction, not committed yet
        producer.execute(sql.SQL("INSERT INTO {} (queue, dedup_key) VALUES ('a', 'race')")
                         .format(jobs_table(s)))
        result: dict[str, Any] = {}
        t = threading.Thread(target=lambda: result.update(retry_jobs(s, ids=[failed])))
        t.start()
        # wait until retry's UPDATE waits on the producer's uncommitted index entry
        deadline = time.monotonic() + 20
        while not conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE %s", (f"%{s.schema_name}%",)).fetchone():
            assert time.monotonic() < deadline and t.is_alive(), result
            time.sleep(0.02)
        producer.commit()
        t.join(10)
    assert result["retried"] == 0 and result["skipped_dedup_ids"] == [failed]
    assert "planning again" in caplog.text  # the unique violation happened and was handled
    assert row(conn, s, failed)["status"] == "failed"


def test_retry_dry_run_changes_nothing(migrated: Settings, conn: Conn) -> None:
    s = migrated
    add(conn, s, "a", 3, status="failed", attempts=5)
    add(conn, s, "a", 1, status="failed", dedup_key="k")
    add(conn, s, "a", 1, dedup_key="k")
    before = snapshot(conn, s)
    report = retry_jobs(s, all_failed=True, dry_run=True)
    assert report["dry_run"] and report["retried"] == 3 and report["skipped_dedup"] == 1
    assert snapshot(conn, s) == before
    assert retry_jobs(s, all_failed=True)["retried"] == 3


def test_retry_refuses_ambiguous_selection(migrated: Settings) -> None:
    for kw in ({}, {"ids": [1], "all_failed": True}, {"queue": "a", "all_failed": True},
               {"ids": [1], "queue": "a"}):
        with pytest.raises(ConfigError):
            retry_jobs(migrated, **kw)


# -- cancel ---------------------------------------------------------------------------------------


def test_cancel_queued_and_leave_finished(migrated: Settings, conn: Conn) -> None:
    s = migrated
    q1, q2 = add(conn, s, "a", 2)
    [done] = add(conn, s, "a", 1, status="done")
    [failed] = add(conn, s, "a", 1, status="failed", last_error="real error")
    before = {i: row(conn, s, i) for i in (q2, done, failed)}
    report = cancel_jobs(s, [q1, done, failed, 123_456])
    assert (report["cancelled"], report["cancelled_queued"], report["already_finished"],
            report["not_found"]) == (1, 1, 2, 1)
    r = row(conn, s, q1)
    assert (r["status"], r["last_error"], r["locked_until"]) == ("cancelled", "cancelled", None)
    assert r["finished_at"] is not None
    assert {i: row(conn, s, i) for i in (q2, done, failed)} == before


def test_cancel_dry_run_changes_nothing(migrated: Settings, conn: Conn) -> None:
    s = migrated
    ids = add(conn, s, "a", 2) + add(conn, s, "a", 1, status="running", attempts=1,
                                     locked_until=sql.SQL("now() + interval '1 minute'"))
    before = snapshot(conn, s)
    report = cancel_jobs(s, ids, dry_run=True)
    assert (report["cancelled"], report["cancelled_queued"],
            report["cancelled_running"]) == (3, 2, 1)
    assert snapshot(conn, s) == before


def test_cancel_skips_a_job_locked_by_a_transaction(migrated: Settings, conn: Conn,
                                                    pg_url: str) -> None:
    [job_id] = add(conn, migrated, "a", 1)
    with psycopg.connect(pg_url) as holder:  # like a transaction-mode batch in flight
        holder.execute(sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(
            jobs_table(migrated)), (job_id,))
        started = time.monotonic()
        report = cancel_jobs(migrated, [job_id])
        assert time.monotonic() - started < 2  # skipped, not waited for
        holder.rollback()
    assert report["cancelled"] == 0 and report["busy_ids"] == [job_id]
    assert row(conn, migrated, job_id)["status"] == "queued"


def test_cancel_running_job_reaches_its_handler(pg_url: str, schema: str, conn: Conn,
                                                registry: Registry) -> None:
    """The owner's heartbeat sees the cancel, the handler is told, the outcome is dropped."""
    from drainer.migrate import migrate

    s = make_settings(pg_url, schema, lease=1.5)
    migrate(conn, s.schema_name, s.table)
    started = threading.Event()
    seen: dict[str, Any] = {}

    @registry.task("slow")
    def slow(job: Job) -> None:
        started.set()
        t0 = time.monotonic()
        seen["cancelled"] = job.cancelled.wait(8)
        seen["after_s"] = time.monotonic() - t0

    [job_id] = add(conn, s, "slow", 1)
    reports: list[Any] = []
    drain = threading.Thread(target=lambda: reports.append(run_once(s, registry=registry)))
    drain.start()
    assert started.wait(10)
    report = cancel_jobs(s, [job_id])
    assert report["cancelled_running"] == 1
    # the owner may still write with its attempts until its lease runs out: retry waits
    retry = retry_jobs(s, ids=[job_id])
    assert retry["retried"] == 0 and retry["skipped_lease_active_ids"] == [job_id]
    drain.join(15)
    assert seen["cancelled"] is True
    # the next heartbeat noticed: about two thirds of the 1.5 s lease, with slack for a
    # loaded machine (without the cancel the handler would wait its full 8 s)
    print(f"cancel noticed after {seen['after_s']:.3f}s")
    assert seen["after_s"] < 3.0
    [rep] = reports
    assert rep.lost == 1 and rep.succeeded == 0
    r = row(conn, s, job_id)
    assert (r["status"], r["last_error"]) == ("cancelled", "cancelled")
    time.sleep(max(0.0, (r["locked_until"] - conn.execute("SELECT now()").fetchone()[0])
                   .total_seconds()) + 0.1)  # type: ignore[index]
    assert retry_jobs(s, ids=[job_id])["retried"] == 1


# -- purge ----------------------------------------------------------------------------------------


def test_purge_deletes_only_old_jobs_of_the_status(migrated: Settings, conn: Conn) -> None:
    s = make_settings(migrated.database_url.get_secret_value(),  # type: ignore[union-attr]
                      migrated.schema_name, archive_batch_size=2)
    old_done = add(conn, s, "a", 5, status="done", finished_at=ago(8 * 86400))
    new_done = add(conn, s, "a", 2, status="done", finished_at=ago(3600))
    old_failed = add(conn, s, "a", 2, status="failed", finished_at=ago(8 * 86400))
    queued = add(conn, s, "a", 2, created_at=ago(30 * 86400))
    before = snapshot(conn, s)
    dry = purge_jobs(s, status="done", older_than=7 * 86400, dry_run=True)
    assert dry["purged"] == 5 and snapshot(conn, s) == before
    report = purge_jobs(s, status="done", older_than=7 * 86400)
    assert report["purged"] == 5 and report["statements"] == 3  # batches of 2: 2, 2, 1
    left = {r[0] for r in snapshot(conn, s)}
    assert left == set(new_done + old_failed + queued)
    assert not left & set(old_done)
    with pytest.raises(ConfigError):
        purge_jobs(s, status="queued", older_than=0)
    with pytest.raises(ConfigError):
        purge_jobs(s, status="done", older_than=-1)
