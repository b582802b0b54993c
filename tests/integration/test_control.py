"""Job control on a real PostgreSQL: snooze, retry policy, discard, results,
follow-ups in the same drain, pause/resume."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql

import drainer
from drainer import Job, run_once
from drainer.cli.status import render_status
from drainer.db import Queries
from drainer.ops import get_job, list_jobs, pause, resume
from drainer.producer import enqueue
from drainer.registry import Registry
from drainer.settings import Settings
from drainer.status import collect_status


def jobs_table(s: Settings) -> sql.Identifier:
    return sql.Identifier(s.schema_name, s.table)


def row(conn: psycopg.Connection[Any], s: Settings, job_id: int) -> dict[str, Any]:
    cur = conn.execute(sql.SQL(
        "SELECT status, attempts, run_at - now() AS wait, last_error, result, snoozes, "
        "snoozed_at, fence FROM {} WHERE id = %s").format(jobs_table(s)), [job_id])
    r = cur.fetchone()
    assert r is not None and cur.description is not None
    return dict(zip([c.name for c in cur.description], r, strict=True))


def due_now(conn: psycopg.Connection[Any], s: Settings) -> None:
    conn.execute(sql.SQL("UPDATE {} SET run_at = now() WHERE status = 'queued'")
                 .format(jobs_table(s)))


# -- snooze ---------------------------------------------------------------------------------------


def test_snooze_keeps_attempts_and_moves_run_at(migrated: Settings, registry: Registry,
                                                conn: psycopg.Connection[Any]) -> None:
    calls: list[int] = []

    @registry.task("s", max_attempts=2)
    def handler(job: Job) -> None:
        calls.append(job.attempt)
        if len(calls) == 1:
            raise drainer.Snooze(600)
        if len(calls) == 2:
            job.snooze(30)

    job_id = enqueue(conn, "s", {}, schema=migrated.schema_name)
    assert job_id is not None
    report = run_once(migrated, registry=registry)
    assert (report.claimed, report.snoozed, report.retried, report.failed) == (1, 1, 0, 0)
    r = row(conn, migrated, job_id)
    assert (r["status"], r["attempts"], r["snoozes"]) == ("queued", 0, 1)
    assert timedelta(seconds=590) < r["wait"] <= timedelta(seconds=600)
    assert r["snoozed_at"] is not None and r["last_error"] is None
    due_now(conn, migrated)
    assert run_once(migrated, registry=registry).snoozed == 1
    due_now(conn, migrated)
    # two snoozes used no attempt: max_attempts=2 still allows this third run to succeed
    report = run_once(migrated, registry=registry)
    assert report.succeeded == 1 and calls == [1, 1, 1]
    r = row(conn, migrated, job_id)
    assert (r["status"], r["attempts"], r["snoozes"]) == ("done", 1, 2)
    shown = get_job(migrated, job_id)
    assert shown["snoozes"] == 2 and shown["snoozed_at"] is not None


def test_snooze_far_away_stays_under_the_check(migrated: Settings, registry: Registry,
                                               conn: psycopg.Connection[Any]) -> None:
    @registry.task("far")
    def handler(job: Job) -> None:
        raise drainer.Snooze(1e300)

    job_id = enqueue(conn, "far", {}, schema=migrated.schema_name)
    assert run_once(migrated, registry=registry).snoozed == 1
    cur = conn.execute(sql.SQL("SELECT run_at FROM {} WHERE id = %s").format(
        jobs_table(migrated)), [job_id])
    got = cur.fetchone()
    assert got is not None and got[0] <= datetime(9999, 1, 1, tzinfo=timezone.utc)
    with pytest.raises(ValueError):
        drainer.Snooze(-1)


def test_snooze_is_fenced(migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    q = Queries(conn, migrated.schema_name, migrated.table)
    job_id = enqueue(conn, "f", {}, schema=migrated.schema_name)
    assert job_id is not None
    (claimed,) = q.claim_batch("f", 1, 60)
    assert q.snooze_many([job_id], [claimed.fence + 1], [10]) == {}  # a stale token
    assert list(q.snooze_many([job_id], [claimed.fence], [10])) == [job_id]


# -- retry policy ---------------------------------------------------------------------------------


class Permanent(Exception):
    pass


class Transient(Exception):
    pass


def test_task_retry_policy_base_and_cap(migrated: Settings, registry: Registry,
                                        conn: psycopg.Connection[Any]) -> None:
    @registry.task("p", retry=drainer.Retry(base=100, cap=150, max_attempts=3))
    def handler(job: Job) -> None:
        raise Transient("again")

    job_id = enqueue(conn, "p", {}, schema=migrated.schema_name, max_attempts=25)
    assert job_id is not None
    assert run_once(migrated, registry=registry).retried == 1
    assert timedelta(seconds=140) < row(conn, migrated, job_id)["wait"] <= \
        timedelta(seconds=150)  # least(150, 100 * 2^1)
    due_now(conn, migrated)
    run_once(migrated, registry=registry)
    due_now(conn, migrated)
    report = run_once(migrated, registry=registry)
    assert report.failed == 1  # the policy's max_attempts=3, not the row's 25
    assert row(conn, migrated, job_id)["attempts"] == 3


def test_jitter_spreads_the_wait(migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    q = Queries(conn, migrated.schema_name, migrated.table)
    ids = [enqueue(conn, "j", {}, schema=migrated.schema_name) for _ in range(20)]
    rows = q.claim_batch("j", 20, 60)
    q.fail_many([r.id for r in rows], [r.fence for r in rows], ["e"] * 20, [None] * 20,
                10.0, 3600.0, bases=[100.0] * 20, caps=[None] * 20, jitters=[1.0] * 20)
    waits = [row(conn, migrated, i)["wait"].total_seconds() for i in ids if i is not None]
    assert all(195 < w <= 400 for w in waits)  # 200 s * (1 + random())
    assert max(waits) - min(waits) > 10


def test_discard_on_fails_at_once(migrated: Settings, registry: Registry,
                                  conn: psycopg.Connection[Any]) -> None:
    @registry.task("d", discard_on=Permanent)
    def handler(job: Job) -> None:
        raise Permanent("bad input") if job.payload["bad"] else Transient("later")

    bad = enqueue(conn, "d", {"bad": True}, schema=migrated.schema_name)
    later = enqueue(conn, "d", {"bad": False}, schema=migrated.schema_name)
    assert bad is not None and later is not None
    report = run_once(migrated, registry=registry)
    assert (report.failed, report.discarded, report.retried) == (1, 1, 1)
    r = row(conn, migrated, bad)
    assert r["status"] == "failed" and r["last_error"].startswith("Permanent: bad input")
    assert row(conn, migrated, later)["status"] == "queued"


def test_retry_on_discards_everything_else(migrated: Settings, registry: Registry,
                                           conn: psycopg.Connection[Any]) -> None:
    @registry.task("r", retry_on=(Transient,))
    def handler(job: Job) -> None:
        raise KeyError("not a transient error")

    job_id = enqueue(conn, "r", {}, schema=migrated.schema_name)
    assert job_id is not None
    assert run_once(migrated, registry=registry).discarded == 1
    assert row(conn, migrated, job_id)["status"] == "failed"


# -- results --------------------------------------------------------------------------------------


def test_results_are_kept_shown_and_archived(migrated: Settings, registry: Registry,
                                             conn: psycopg.Connection[Any]) -> None:
    @registry.task("res")
    def handler(job: Job) -> Any:
        return {"sum": sum(job.payload["xs"]), "name": "ü"}

    job_id = enqueue(conn, "res", {"xs": [1, 2, 3]}, schema=migrated.schema_name)
    assert job_id is not None
    assert run_once(migrated, registry=registry).succeeded == 1
    assert row(conn, migrated, job_id)["result"] == {"sum": 6, "name": "ü"}
    assert get_job(migrated, job_id)["result"] == {"sum": 6, "name": "ü"}
    assert list_jobs(migrated)[0]["result"] == {"sum": 6, "name": "ü"}
    from drainer.cli.jobs import render_job

    assert '"sum": 6' in render_job(get_job(migrated, job_id))
    # archived with its result (move mode)
    moved = migrated.model_copy(update={"archive_mode": "move", "archive_after": 0.0})
    run_once(moved, registry=registry)
    cur = conn.execute(sql.SQL("SELECT result FROM {} WHERE id = %s").format(
        sql.Identifier(migrated.schema_name, f"{migrated.table}_archive")), [job_id])
    assert cur.fetchone() == ({"sum": 6, "name": "ü"},)


def test_odd_results_written_with_the_end_of_the_run(migrated: Settings, registry: Registry,
                                                    conn: psycopg.Connection[Any]) -> None:
    # a short run's last completions go with finish_run as array text through a client-side
    # cursor: quotes, backslashes, braces, commas and a None beside a result survive it
    odd = {"q": 'a"b\\c{,}\'', "nested": ["}", "{", None], "empty": ""}

    @registry.task("odd")
    def handler(job: Job) -> Any:
        return odd if job.payload["n"] else None

    ids = [enqueue(conn, "odd", {"n": n}, schema=migrated.schema_name) for n in (1, 0, 1)]
    assert run_once(migrated, registry=registry).succeeded == 3
    assert [row(conn, migrated, i)["result"] for i in ids] == [odd, None, odd]


@pytest.mark.parametrize("pipeline_depth", [1, 2])
def test_results_in_combined_and_pipelined_claims(migrated: Settings, registry: Registry,
                                                  conn: psycopg.Connection[Any],
                                                  pipeline_depth: int) -> None:
    @registry.task("many")
    def handler(job: Job) -> Any:
        return ["n", job.payload["n"], 'quote " and \\ backslash']

    ids = [enqueue(conn, "many", {"n": i}, schema=migrated.schema_name) for i in range(60)]
    s = migrated.model_copy(update={"pipeline_depth": pipeline_depth, "batch_size": 5})
    assert run_once(s, registry=registry).succeeded == 60
    for i, job_id in enumerate(ids):
        assert job_id is not None
        assert row(conn, migrated, job_id)["result"] == ["n", i, 'quote " and \\ backslash']


def test_a_result_too_big_or_not_json_fails_the_job(migrated: Settings, registry: Registry,
                                                     conn: psycopg.Connection[Any]) -> None:
    @registry.task("big")
    def handler(job: Job) -> Any:
        return "x" * 2000 if job.payload["big"] else {1, 2}

    big = enqueue(conn, "big", {"big": True}, schema=migrated.schema_name, max_attempts=1)
    odd = enqueue(conn, "big", {"big": False}, schema=migrated.schema_name, max_attempts=1)
    assert big is not None and odd is not None
    s = migrated.model_copy(update={"result_max_bytes": 1000})
    assert run_once(s, registry=registry).failed == 2
    assert "more than result_max_bytes (1000)" in row(conn, migrated, big)["last_error"]
    assert "not JSON-serialisable" in row(conn, migrated, odd)["last_error"]


# -- follow-ups -----------------------------------------------------------------------------------


@pytest.mark.parametrize("pipeline_depth", [1, 2])
def test_a_three_step_chain_finishes_in_one_run(migrated: Settings, registry: Registry,
                                                conn: psycopg.Connection[Any],
                                                pipeline_depth: int) -> None:
    seen: list[tuple[str, Any]] = []

    @registry.task("step1")
    def step1(job: Job) -> None:
        seen.append(("step1", job.payload))
        job.enqueue("step2", {"from": job.id})

    @registry.task("step2")
    def step2(job: Job) -> None:
        seen.append(("step2", job.payload))
        job.enqueue(step3, {"n": 3})  # a @task handler names its queue too

    @registry.task("step3")
    def step3(job: Job) -> str:
        seen.append(("step3", job.payload))
        return "end"

    first = enqueue(conn, "step1", {"n": 1}, schema=migrated.schema_name)
    s = migrated.model_copy(update={"pipeline_depth": pipeline_depth})
    report = run_once(s, registry=registry)
    assert [name for name, _ in seen] == ["step1", "step2", "step3"]
    assert seen[1][1] == {"from": first}
    assert (report.succeeded, report.followups, report.remaining_due) == (3, 2, 0)
    rows = list_jobs(migrated)
    assert [r["status"] for r in rows] == ["done"] * 3


def test_fan_out_and_no_followups_on_failure(migrated: Settings, registry: Registry,
                                             conn: psycopg.Connection[Any]) -> None:
    done: list[int] = []

    @registry.task("fan")
    def fan(job: Job) -> None:
        for i in range(job.payload["n"]):
            job.enqueue("leaf", {"i": i})
        if job.payload.get("fail"):
            raise RuntimeError("after enqueueing")

    @registry.task("leaf", max_attempts=7)
    def leaf(job: Job) -> None:
        done.append(job.payload["i"])

    enqueue(conn, "fan", {"n": 25}, schema=migrated.schema_name)
    enqueue(conn, "fan", {"n": 5, "fail": True}, schema=migrated.schema_name, max_attempts=1)
    report = run_once(migrated, registry=registry)
    assert sorted(done) == list(range(25))  # the failed job's five never existed
    assert (report.followups, report.failed) == (25, 1)
    cur = conn.execute(sql.SQL("SELECT count(*), min(max_attempts) FROM {} WHERE queue = "
                               "'leaf'").format(jobs_table(migrated)))
    assert cur.fetchone() == (25, 7)  # the leaf task's max_attempts


def test_followups_of_a_lost_job_are_not_inserted(migrated: Settings,
                                                  conn: psycopg.Connection[Any]) -> None:
    q = Queries(conn, migrated.schema_name, migrated.table)
    job_id = enqueue(conn, "x", {}, schema=migrated.schema_name)
    (claimed,) = q.claim_batch("x", 1, 60)
    followups = json.dumps([{"parent": job_id, "queue": "y", "payload": {}, "run_at": None,
                             "priority": 0, "max_attempts": 5, "dedup_key": None}])
    assert q.complete_many([job_id], [claimed.fence + 1], followups=followups) == set()
    cur = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE queue = 'y'").format(
        jobs_table(migrated)))
    assert cur.fetchone() == (0,)
    assert q.complete_many([job_id], [claimed.fence], followups=followups) == {job_id}
    cur = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE queue = 'y'").format(
        jobs_table(migrated)))
    assert cur.fetchone() == (1,)


def test_a_followup_for_later_is_not_waited_for(migrated: Settings, registry: Registry,
                                                conn: psycopg.Connection[Any]) -> None:
    @registry.task("later")
    def later(job: Job) -> None:
        if not job.payload:
            job.enqueue("later", {"again": True},
                        run_at=datetime.now(timezone.utc) + timedelta(hours=1))

    enqueue(conn, "later", {}, schema=migrated.schema_name)
    report = run_once(migrated, registry=registry)
    assert (report.succeeded, report.followups, report.remaining_due) == (1, 1, 0)
    assert report.next_due_at is not None


# -- retry linger (suspend-aware) -----------------------------------------------------------------


def test_retry_linger_runs_a_short_retry_in_the_same_drain(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any]) -> None:
    calls: list[int] = []

    @registry.task("flaky", retry=drainer.Retry(base=0.5, cap=1))
    def flaky(job: Job) -> None:
        calls.append(job.attempt)
        if len(calls) == 1:
            raise Transient("once")

    enqueue(conn, "flaky", {}, schema=migrated.schema_name)
    report = run_once(migrated.model_copy(update={"retry_linger": 5.0}), registry=registry)
    assert (report.retried, report.succeeded) == (1, 1) and calls == [1, 2]
    assert 0.5 <= report.lingered_s < 3
    calls.clear()
    enqueue(conn, "flaky", {}, schema=migrated.schema_name)
    report = run_once(migrated, registry=registry)  # linger off: left to the next wake
    assert (report.retried, report.succeeded, report.lingered_s) == (1, 0, 0.0)


# -- pause / resume -------------------------------------------------------------------------------


def test_pause_and_resume(migrated: Settings, registry: Registry,
                          conn: psycopg.Connection[Any]) -> None:
    ran: list[str] = []

    @registry.task("a")
    def a(job: Job) -> None:
        ran.append("a")

    @registry.task("b")
    def b(job: Job) -> None:
        ran.append("b")

    for queue in ("a", "b"):
        enqueue(conn, queue, {}, schema=migrated.schema_name)
    assert pause(migrated, ["a"]) == {"paused": ["a"], "already_paused": []}
    assert pause(migrated, ["a"]) == {"paused": [], "already_paused": ["a"]}
    report = run_once(migrated, registry=registry)
    assert ran == ["b"] and report.paused == ["a"] and report.queues == ["b"]
    st = collect_status(migrated)
    assert st["queues"]["a"]["paused"] and not st["queues"]["b"]["paused"]
    assert list(st["paused_queues"]) == ["a"]
    assert "paused queues:   a" in render_status(st)
    enqueue(conn, "a", {}, schema=migrated.schema_name)  # jobs keep arriving
    assert resume(migrated, ["a", "zzz"]) == {"resumed": ["a"], "not_paused": ["zzz"]}
    report = run_once(migrated, registry=registry)
    assert ran == ["b", "a", "a"] and report.paused == []


def test_a_paused_queue_is_untouched_by_four_concurrent_drainers(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any]) -> None:
    import threading

    @registry.task("held")
    def held(job: Job) -> None:
        raise AssertionError("a paused queue was claimed")

    @registry.task("open")
    def open_(job: Job) -> None:
        pass

    for _ in range(50):
        enqueue(conn, "held", {}, schema=migrated.schema_name)
        enqueue(conn, "open", {}, schema=migrated.schema_name)
    pause(migrated, ["held"])
    reports: list[Any] = []
    threads = [threading.Thread(target=lambda: reports.append(
        run_once(migrated, registry=registry))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.succeeded for r in reports) == 50 and all(r.paused == ["held"]
                                                           for r in reports)
    cur = conn.execute(sql.SQL("SELECT status, attempts, fence, count(*) FROM {} WHERE queue "
                               "= 'held' GROUP BY 1, 2, 3").format(jobs_table(migrated)))
    assert cur.fetchall() == [("queued", 0, 0, 50)]


def test_pause_resume_and_show_from_the_command_line(migrated: Settings, pg_url: str,
                                                     conn: psycopg.Connection[Any]) -> None:
    from tests.conftest import run_cli

    out = run_cli(["pause", "emails", "sms", "--json"], pg_url=pg_url,
                  schema=migrated.schema_name)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"paused": ["emails", "sms"], "already_paused": [],
                                      "never_seen": ["emails", "sms"]}
    out = run_cli(["status", "--json"], pg_url=pg_url, schema=migrated.schema_name)
    assert sorted(json.loads(out.stdout)["paused_queues"]) == ["emails", "sms"]
    out = run_cli(["resume", "sms"], pg_url=pg_url, schema=migrated.schema_name)
    assert out.returncode == 0 and json.loads(out.stdout) == {"resumed": ["sms"],
                                                              "not_paused": []}
    from drainer.cli.control import render_counts

    assert "resumed: sms" in render_counts(json.loads(out.stdout))
    assert run_cli(["pause"], pg_url=pg_url, schema=migrated.schema_name).returncode == 2
    q = Queries(conn, migrated.schema_name, migrated.table)
    job_id = enqueue(conn, "r", {}, schema=migrated.schema_name)
    (claimed,) = q.claim_batch("r", 1, 60)
    q.complete_many([job_id], [claimed.fence], results=['{"ok": [1, 2]}'])
    out = run_cli(["show", str(job_id), "--json"], pg_url=pg_url, schema=migrated.schema_name)
    assert json.loads(out.stdout)["result"] == {"ok": [1, 2]}
