"""Jobs scheduled for later cost a wake nothing: the probes and the end-of-run summary read
the claim index a priority at a time, not every queued job of a queue.

The claim index orders a queue's jobs by priority, then run_at: a scan of a queue in that
order with ``run_at <= now()`` as a filter reads every job of a priority scheduled for
later before it reaches the next priority or the end. An empty run over 100,000 jobs
scheduled for tomorrow held the session 46-73 ms instead of 10-15 (its statements: 84 ms
of server time instead of 5), on every wake. Likewise served queues with nothing queued:
one probe tells that no job is queued at all, instead of one a queue.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from drainer import run_once
from drainer.db import Queries
from drainer.db.queries import finish_params
from drainer.registry import Registry
from drainer.settings import Settings

SCHEDULED = 20_000


def _jobs(s: Settings) -> sql.Identifier:
    return sql.Identifier(s.schema_name, s.table)


def _schedule(conn: psycopg.Connection[Any], s: Settings, queue: str, n: int,
              priority: int = 0, *, due: bool = False) -> None:
    """``n`` jobs of ``queue`` at ``priority``: due a minute ago, or from tomorrow on."""
    start, step = ("-1 minute", "0") if due else ("1 day", "1 second")
    conn.execute(sql.SQL(
        "INSERT INTO {} (queue, payload, priority, run_at) "
        "SELECT %s, '{{}}', %s, now() + %s::interval + g * %s::interval "
        "FROM generate_series(1, %s) g").format(_jobs(s)), [queue, priority, start, step, n])


def _blocks(conn: psycopg.Connection[Any], text: str, params: dict[str, Any],
            part: str | None = None) -> int:
    """The pages a statement read (shared hits and reads, planning excluded); ``part``: of
    its subplan by that name alone (``CTE next``)."""
    cur = psycopg.ClientCursor(conn)
    [[plan]] = cur.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {text}", params).fetchall()
    top = plan[0]["Plan"]
    if part is not None:
        [top] = [n for n in top["Plans"] if n.get("Subplan Name") == part]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


def _statements(q: Queries, queues: list[str]) -> dict[str, tuple[str, dict[str, Any]]]:
    """due_queues, queue_summary and finish_run over ``queues``; finish_run over the last of
    them alone too (nothing due there: it does the end of the run and its summary)."""
    def finish(over: list[str]) -> dict[str, Any]:
        return finish_params(q.regclass, over, archive_after=3600, failed_retention=3600,
                             batch_size=100, if_drained=True)

    return {"due_queues": (q.text("due_queues"), {"queues": queues}),
            "queue_summary": (q.text("queue_summary"), {"queues": queues, "served": queues}),
            "finish_run": (q.text("finish_run"), finish(queues)),
            "finish_run drained": (q.text("finish_run"), finish(queues[-1:]))}


def test_probes_and_the_summary_read_as_many_pages_whatever_is_scheduled_for_later(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    q = Queries(conn, migrated.schema_name, migrated.table)
    conn.execute("SET jit = off")
    queues = ["mail", "other"]
    _schedule(conn, migrated, "mail", 3, due=True)

    def more_later() -> dict[str, int]:
        _schedule(conn, migrated, "mail", SCHEDULED)
        _schedule(conn, migrated, "other", SCHEDULED, priority=5)
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(_jobs(migrated)))
        return {k: _blocks(conn, *v) for k, v in _statements(q, queues).items()}

    once, twice = more_later(), more_later()
    # 20,000 entries of the claim index are about 100 of its pages a queue: a statement that
    # read them read twice as many with twice the jobs (measured before: due_queues 127
    # pages, queue_summary 585); a probe a priority reads a few (the index a level deeper)
    for name in once:
        assert twice[name] <= once[name] + 8 and once[name] < 100, (name, once, twice)


def _first_claim(conn: psycopg.Connection[Any], s: Settings, queue: str, batch: int,
                 start_now: int) -> tuple[str, dict[str, Any]]:
    """claim_first over ``queue`` (named first due, as run_start would in its transaction)."""
    conn.execute("SELECT set_config('drainer.start', %s, false)", [f"q:{queue}"])
    return Queries(conn, s.schema_name, s.table).text("claim_first"), {
        "queues": [queue], "eligible": [True], "leases": [60.0],
        "batch_size": batch, "start_now": start_now,
        "run_id": "test"}


def test_the_first_claim_reads_as_many_pages_whatever_is_scheduled_for_later(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    """A wake's first claim mostly comes back short (a wake finds a few jobs): it read every
    job of its priority scheduled for later (10 ms a claim over 100,000)."""
    conn.execute("SET jit = off")
    _schedule(conn, migrated, "mail", 3, priority=2, due=True)
    _schedule(conn, migrated, "mail", 2, due=True)

    def more_later() -> int:
        _schedule(conn, migrated, "mail", SCHEDULED, priority=2)
        _schedule(conn, migrated, "mail", SCHEDULED)
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(_jobs(migrated)))
        with conn.transaction(force_rollback=True):
            # the rows it locks (the CTE next), not the UPDATE's index entries, whose
            # trees grow a level deeper with the table
            return _blocks(conn, *_first_claim(conn, migrated, "mail", 100, 100), "CTE next")

    once, twice = more_later(), more_later()
    # a scan of each priority's jobs in run_at order read ~100 index pages per 20,000 jobs
    # and per priority (measured before: 254-310 pages, then 736-806); a range per priority
    # reads the due rows and a few index pages
    assert twice <= once + 4 and once < 50, (once, twice)


def test_claims_take_due_jobs_in_priority_then_run_at_order_on_every_priority(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    """claim_batch (one scan of the claim index) and claim_first (a range per priority)
    claim the same jobs in the same order."""
    q = Queries(conn, migrated.schema_name, migrated.table)
    _schedule(conn, migrated, "mail", 20, priority=9)  # only jobs for later up there
    _schedule(conn, migrated, "mail", 2, priority=5, due=True)
    _schedule(conn, migrated, "mail", 3, priority=0, due=True)
    _schedule(conn, migrated, "mail", 20, priority=0)
    _schedule(conn, migrated, "mail", 2, priority=-4, due=True)
    _schedule(conn, migrated, "other", 4, priority=7, due=True)  # another queue's
    due = conn.execute(sql.SQL(
        "SELECT id FROM {} WHERE queue = 'mail' AND run_at <= now() "
        "ORDER BY priority DESC, run_at, id").format(_jobs(migrated))).fetchall()
    order = [r[0] for r in due]
    # suspects (a lease of theirs expired) are claimed only among the first start_now rows
    # of the claim's order: the first of priority 5 is, the first of priority 0 is not yet
    conn.execute(sql.SQL("UPDATE {} SET suspect = true WHERE id = ANY(%s)").format(
        _jobs(migrated)), [[order[0], order[2]]])
    for first_claim in (False, True):
        with conn.transaction(force_rollback=True):
            if first_claim:
                first = [r[0] for r in conn.execute(
                    *_first_claim(conn, migrated, "mail", 4, 1)).fetchall()]
            else:
                first = [r.id for r in q.claim_batch("mail", 4, 60.0, start_now=1)]
            assert sorted(first) == sorted([order[0], order[1], order[3]]), first_claim
            rest = q.claim_batch("mail", 4, 60.0)
            assert sorted(r.id for r in rest) == sorted([order[2], *order[4:]])
            assert q.claim_batch("mail", 4, 60.0) == []


def test_due_and_next_jobs_are_counted_on_every_priority(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    q = Queries(conn, migrated.schema_name, migrated.table)
    # a higher priority holding only jobs for later, due jobs at two lower ones
    _schedule(conn, migrated, "mail", 50, priority=9)
    _schedule(conn, migrated, "mail", 3, priority=0, due=True)
    _schedule(conn, migrated, "mail", 50, priority=0)
    _schedule(conn, migrated, "mail", 2, priority=-4, due=True)
    # a queue no handler serves: its due jobs, of two priorities, are counted apart
    _schedule(conn, migrated, "lost", 4, priority=1, due=True)
    _schedule(conn, migrated, "lost", 1, priority=2, due=True)
    _schedule(conn, migrated, "lost", 30, priority=1)
    _schedule(conn, migrated, "later", 10, priority=3)  # served, nothing due
    served = ["mail", "later"]
    assert q.due_queues(["later", "mail", "lost"]) == ["mail", "lost"]
    due, next_due, unserved = q.queue_summary_served(served, served)
    assert due == 5 and unserved == {"lost": 5}
    first = conn.execute(sql.SQL(
        "SELECT min(run_at) FROM {} WHERE queue = ANY(%s) AND run_at > now()").format(
        _jobs(migrated)), [served]).fetchone()
    assert first is not None and next_due == first[0]
    assert isinstance(next_due, datetime) and next_due > datetime.now(next_due.tzinfo)


def test_a_full_rate_window_makes_its_queue_due_at_the_next_slot(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    q = Queries(conn, migrated.schema_name, migrated.table)
    _schedule(conn, migrated, "api", 3, priority=1, due=True)
    _schedule(conn, migrated, "api", 5, priority=0)
    slot = conn.execute("SELECT now() + interval '10 minutes'").fetchone()
    assert slot is not None
    conn.execute(sql.SQL("INSERT INTO {} (queue, rate_next_at) VALUES ('api', %s)").format(
        sql.Identifier(migrated.schema_name, f"{migrated.table}_queues")), [slot[0]])
    due, next_due, _unserved = q.queue_summary_served(["api"], ["api"])
    # every queued job waits for the slot: none due now, the next at the slot
    assert due == 0 and next_due == slot[0]
    # a job scheduled after the slot does not move it
    _schedule(conn, migrated, "api", 1, priority=2)
    assert q.queue_summary_served(["api"], ["api"])[1] == slot[0]
    assert slot[0] - datetime.now(slot[0].tzinfo) < timedelta(minutes=11)


def test_an_empty_run_over_a_scheduled_backlog_reports_the_next_job(
        migrated: Settings, conn: psycopg.Connection[Any], registry: Registry) -> None:
    registry.task("mail")(lambda job: None)
    _schedule(conn, migrated, "mail", SCHEDULED)
    report = run_once(migrated, registry=registry)
    first = conn.execute(sql.SQL("SELECT min(run_at) FROM {}").format(
        _jobs(migrated))).fetchone()
    assert first is not None
    assert report.claimed == 0 and report.remaining_due == 0
    assert report.next_due_at == first[0].isoformat()


def test_with_nothing_queued_a_wake_does_not_probe_each_served_queue(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    """No job queued (done ones only): run_start's due probes and finish_run's summary read
    as many pages for 300 served queues as for 1 (one probe of the claim index tells that
    nothing is queued); with a job queued they probe each queue again, and find it."""
    from drainer.migrate import latest_version

    q = Queries(conn, migrated.schema_name, migrated.table)
    conn.execute("SET jit = off")
    conn.execute(sql.SQL("INSERT INTO {} (queue, status, finished_at) "
                         "SELECT 'q0', 'done', now() FROM generate_series(1, 50)")
                 .format(_jobs(migrated)))

    def pages(n: int) -> dict[str, int]:
        queues = [f"q{i}" for i in range(n)]
        start = {"table": migrated.table, "queues": queues, "latest": latest_version(),
                 "max_attempts": [None] * n, "unschedule": False}
        finish = finish_params(q.regclass, queues, archive_after=3600, failed_retention=3600,
                               batch_size=100)
        return {"run_start": _blocks(conn, q.text("run_start"), start),
                "finish_run": _blocks(conn, q.text("finish_run"), finish)}

    one, many = pages(1), pages(300)
    for name in one:
        assert many[name] <= one[name] + 5, (name, one, many)
    _schedule(conn, migrated, "q299", 1, due=True)
    assert pages(300)["run_start"] > many["run_start"] + 100  # each queue probed again
    assert q.due_queues([f"q{i}" for i in range(300)]) == ["q299"]
    assert q.queue_summary_served(["q299"], ["q299"])[0] == 1
