"""Fencing: the writes of a worker that no longer owns a job change nothing. On the
statements themselves (``drainer.db.Queries``), under any interleaving of workers, process
deaths and the operator's moves (retry, cancel, purge); and through ``drainer run-once``
processes, a stalled owner's late verdict after the operator retried the job."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg import sql

from drainer.db import QUERIES, Queries, identifiers
from drainer.drain.calls import Outcome, raised, returned
from drainer.drain.outcomes import Outcomes
from drainer.drain.report import RunReport
from drainer.job import FollowUp, Job, Retry
from drainer.ops import purge_batches
from drainer.producer import JobSpec, enqueue, enqueue_many
from drainer.registry import Task
from drainer.settings import Settings
from tests.conftest import finish, run_cli
from tests.reliability._helpers import (
    executions,
    jobs,
    run_once,
    start_drainer,
    wait_for,
    wait_leases_expired,
)


def test_slow_workers_late_writes_update_nothing(
    migrated: Settings, conn: psycopg.Connection[Any], pg_url: str
) -> None:
    schema = migrated.schema_name
    job_id = enqueue(conn, "q", {"to": "a@example.com"}, max_attempts=1, schema=schema)
    with psycopg.connect(pg_url, autocommit=True) as ca, \
            psycopg.connect(pg_url, autocommit=True) as cb:
        slow, fast = Queries(ca, schema, "jobs"), Queries(cb, schema, "jobs")
        (mine,) = slow.claim_batch("q", 10, 0.2)
        assert (mine.id, mine.attempts) == (job_id, 1)
        wait_for(lambda: jobs(conn, schema)[job_id]["expired"], 5, "the lease to expire")
        # the claim proved no start: the attempt is given back, the job is a suspect
        assert fast.reap_expired(["q"]) == [(job_id, "queued", 0)]
        (theirs,) = fast.claim_batch("q", 10, 60)
        assert (theirs.attempts, theirs.fence) == (1, 2)
        before = jobs(conn, schema)[job_id]

        # The slow worker wakes up: every fenced write it tries is UPDATE 0.
        assert slow.complete_many([job_id], [1]) == set()
        assert slow.fail_many([job_id], [1], ["slow"], [None], 10, 3600) == []
        assert slow.extend_many([job_id], [1], [300]) == {}
        assert slow.release_many([job_id], [1]) == set()
        assert slow.complete_many([job_id], [1], delete=True) == set()
        assert jobs(conn, schema)[job_id] == before

        # The new owner's verdict stands, and the slow one still cannot overwrite it.
        assert fast.fail_many([job_id], [2], ["new owner's error"], [None], 10, 3600) == [
            (job_id, "failed", before["run_at"])]
        assert slow.complete_many([job_id], [1]) == set()
        after = jobs(conn, schema)[job_id]
        assert (after["status"], after["attempts"], after["last_error"]) == (
            "failed", 1, "new owner's error")



def test_retry_never_repeats_the_fence(
        migrated: Settings, conn: psycopg.Connection[Any], pg_url: str, tmp_path: Path
) -> None:
    """A stalled owner (SIGSTOP) whose job was reaped, failed and retried by the operator
    wakes while a new owner holds it: the new owner's verdict stands, the stalled one's
    report counts its job lost. A retry that reset the fence would let the old token match."""
    schema = migrated.schema_name
    app = "rel_task_options_jobs"
    enqueue_many(conn, [JobSpec("env_verdict", {"sleep": 2}, max_attempts=1)], schema=schema)
    (job_id,) = jobs(conn, schema)
    # a suspect (its lease expired before): its claim is charged, so the reap fails it
    conn.execute(sql.SQL("UPDATE {} SET suspect = true").format(
        sql.Identifier(schema, "jobs")))
    old = start_drainer(["run-once", "--lease", "1"], pg_url=pg_url, schema=schema,
                        log_dir=tmp_path, app=app, REL_VERDICT="ok")
    try:
        wait_for(lambda: executions(tmp_path), 20, "the first owner to start")
        os.kill(old.pid, signal.SIGSTOP)
        wait_leases_expired(conn, schema)
        # another run reaps it (max_attempts=1: failed), the operator retries it
        code, _out, err = run_once(pg_url, schema, tmp_path, "--lease", "30", app=app)
        assert code == 0, err[-2000:]
        assert jobs(conn, schema)[job_id]["status"] == "failed"
        p = run_cli(["retry", "--id", str(job_id)], pg_url=pg_url, schema=schema)
        assert p.returncode == 0, p.stderr
        new = start_drainer(["run-once", "--lease", "30"], pg_url=pg_url, schema=schema,
                            log_dir=tmp_path, app=app, REL_VERDICT="fail")
        wait_for(lambda: len(executions(tmp_path)) >= 2, 20, "the new owner to start")
    finally:
        os.kill(old.pid, signal.SIGCONT)
    code_old, out_old, err_old = finish(old, timeout=30)
    code_new, out_new, err_new = finish(new, timeout=30)
    assert (code_old, code_new) == (0, 0), (err_old[-1500:], err_new[-1500:])
    row = jobs(conn, schema)[job_id]
    old_report, new_report = json.loads(out_old), json.loads(out_new)
    assert row["status"] == "failed" and "new owner's verdict" in (row["last_error"] or ""), (
        f"job {row['status']} ({row['last_error']!r}): the stalled worker's report "
        f"{old_report}, the new owner's {new_report}")
    assert new_report["lost"] == 0 and old_report["lost"] == 1


WORKERS = 3

#: How a handler of the machine ends: ordinary, or hostile (what it hands back cannot be
#: stored, or its retry policy has no cap); see QueueMachine.handlers_finish.
ENDINGS = ("ok", "ok_followup", "bad_followup", "unchecked_followup", "bad_result",
           "uncapped_retry")
_PLAIN = Task("q", lambda job: None)
_UNCAPPED = Task("q", lambda job: None, retry=Retry(base=1e308, cap=float("inf")))


def _ending(kind: str, job: Job) -> Outcome:
    """The outcome a handler ending as ``kind`` comes to, as the drain makes it."""
    if kind == "ok":
        return returned(_PLAIN, job, {"r": 1}, 65536)
    if kind == "ok_followup":
        job.enqueue("q", {"child": job.id}, max_attempts=2)
        return returned(_PLAIN, job, None, 65536)
    if kind == "bad_followup":
        try:
            job.enqueue("q", {"k": "a\x00b"})
        except ValueError as exc:
            return raised(_PLAIN, job, exc, None)
        raise AssertionError("job.enqueue took a NUL")
    if kind == "unchecked_followup":  # past every check: the batch statement meets it
        job.followups.append(FollowUp("q", {}, priority=2**40))
        return Outcome(job, _PLAIN, True)
    if kind == "bad_result":
        return returned(_PLAIN, job, {"k": "\udc80"}, 65536)
    return raised(_UNCAPPED, job, RuntimeError("uncapped"), None)


@dataclass
class _Job:
    status: str
    attempts: int
    max_attempts: int
    priority: int
    due: bool = True
    expired: bool = False
    fence: int = 0  # the claim's token: +1 at every claim, never reset (not by retry)
    lease_kept: bool = False  # cancelled while running: its lease runs out on its own
    aged: bool = False  # finished long ago (finished_at moved back): an --older-than purges it
    suspect: bool = False  # its lease expired (reaped): its next claim is charged
    charged: bool = False  # the running claim is charged for certain (it was a suspect)


def _machine(conns: list[psycopg.Connection[Any]], observer: psycopg.Connection[Any],
             schema: str) -> type[RuleBasedStateMachine]:
    table = sql.Identifier(schema, "jobs")
    queries = [Queries(c, schema, "jobs") for c in conns]

    class QueueMachine(RuleBasedStateMachine):
        """Simulated workers claim, finish, extend, release; time passes; reaper and
        archiver run. A model says what the table must hold after every step."""

        def __init__(self) -> None:
            super().__init__()
            observer.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY").format(table))
            self.model: dict[int, _Job] = {}
            self.held: list[tuple[int, int, int]] = []  # (worker, id, fence), stale too
            self.enqueued: set[int] = set()  # every id ever enqueued
            self.gone: dict[int, str] = {}  # id -> "archived" (done) or "purged" (operator)
            self.tokens: set[tuple[int, int]] = set()  # every (id, fence) ever claimed

        def _owner(self, job_id: int, fence: int) -> bool:
            m = self.model.get(job_id)
            return m is not None and m.status == "running" and m.fence == fence

        @initialize(attempts=st.lists(st.integers(1, 3), min_size=1, max_size=6))
        def some_jobs(self, attempts: list[int]) -> None:
            for a in attempts:
                self.enqueue(a, 0)

        @rule(max_attempts=st.integers(1, 3), priority=st.integers(0, 2))
        def enqueue(self, max_attempts: int, priority: int) -> None:
            job_id = enqueue(observer, "q", {}, max_attempts=max_attempts, priority=priority,
                             schema=schema)
            assert job_id is not None
            assert job_id not in self.enqueued, "an id came back"
            self.enqueued.add(job_id)
            self.model[job_id] = _Job("queued", 0, max_attempts, priority)

        @rule(worker=st.integers(0, WORKERS - 1), batch=st.integers(1, 4))
        def claim(self, worker: int, batch: int) -> None:
            due = {i for i, m in self.model.items() if m.status == "queued" and m.due}
            rows = queries[worker].claim_batch("q", batch, 60.0)
            ids = {r.id for r in rows}
            assert ids <= due, "claimed a job that was not due and queued"
            assert len(rows) == len(ids) == min(batch, len(due)), "a due job was skipped"
            if ids and due - ids:
                assert min(self.model[i].priority for i in ids) >= max(
                    self.model[i].priority for i in due - ids)
            for r in rows:
                m = self.model[r.id]
                m.status, m.attempts, m.expired = "running", m.attempts + 1, False
                m.fence += 1
                m.charged, m.suspect = m.suspect, False
                assert (r.attempts, r.fence) == (m.attempts, m.fence)
                assert (r.id, r.fence) not in self.tokens, "a fence repeated"
                self.tokens.add((r.id, r.fence))
                self.held.append((worker, r.id, r.fence))

        @precondition(lambda self: self.held)
        @rule(data=st.data())
        def complete(self, data: st.DataObject) -> None:
            worker, job_id, attempt = data.draw(st.sampled_from(self.held))
            written = queries[worker].complete_many([job_id], [attempt])
            assert (job_id in written) == self._owner(job_id, attempt)
            if written:
                self.model[job_id].status = "done"

        @precondition(lambda self: self.held)
        @rule(data=st.data(), backoff=st.booleans())
        def fail(self, data: st.DataObject, backoff: bool) -> None:
            worker, job_id, attempt = data.draw(st.sampled_from(self.held))
            rows = queries[worker].fail_many([job_id], [attempt], [f"error {attempt}"], [None],
                                             3600.0 if backoff else 0.0, 3600.0)
            assert bool(rows) == self._owner(job_id, attempt)
            if rows:
                m = self.model[job_id]
                m.suspect = False
                m.status = "failed" if m.attempts >= m.max_attempts else "queued"
                m.due = m.status == "failed" or not backoff
                assert rows[0][1] == m.status

        @precondition(lambda self: self.held)
        @rule(data=st.data(), worker=st.integers(0, WORKERS - 1))
        def handlers_finish(self, data: st.DataObject, worker: int) -> None:
            """A batch of handlers ends, some of them hostile, and the drain's one writer of
            outcomes writes it: one statement per kind, split where a row cannot be stored.
            Each job gets its own verdict; a stale token's writes change nothing."""
            live = [h for h in self.held if self._owner(h[1], h[2])]
            tokens = st.sampled_from(self.held) if not live else st.one_of(
                st.sampled_from(live), st.sampled_from(self.held))  # mostly the owners'
            picks = data.draw(st.lists(st.tuples(tokens, st.sampled_from(ENDINGS)),
                                       min_size=1, max_size=4, unique_by=lambda t: t[0][1]))
            outcomes = Outcomes(queries[worker], RunReport("machine", ["q"]), delete=False,
                                retry_base=3600.0, retry_cap=3600.0)
            owned = {job_id: kind for (_w, job_id, fence), kind in picks
                     if self._owner(job_id, fence)}
            for (_w, job_id, fence), kind in picks:
                m = self.model.get(job_id)
                job = Job(job_id, "q", {}, m.attempts if m else 1, m.max_attempts if m else 1,
                          None, fence=fence)
                outcomes.add(_ending(kind, job))
            outcomes.write()
            assert outcomes.tally.report.succeeded == sum(
                k in ("ok", "ok_followup") for k in owned.values())
            for job_id, kind in owned.items():
                m = self.model[job_id]
                m.suspect = False
                if kind in ("ok", "ok_followup"):
                    m.status = "done"
                elif kind == "unchecked_followup":  # failed for good, at once
                    m.status = "failed"
                else:
                    m.status = "failed" if m.attempts >= m.max_attempts else "queued"
                    m.due = m.status == "failed"  # a retry waits an hour, or 9,500 years
            ids = {r[0] for r in observer.execute(sql.SQL("SELECT id FROM {}").format(table))}
            children = ids - set(self.model) - set(self.gone)
            assert len(children) == sum(k == "ok_followup" for k in owned.values())
            for job_id in children:
                self.enqueued.add(job_id)
                self.model[job_id] = _Job("queued", 0, 2, 0)
            errors = dict(observer.execute(sql.SQL(
                "SELECT id, last_error FROM {} WHERE id = ANY(%s)").format(table),
                [list(owned)]).fetchall())
            for job_id, kind in owned.items():
                if kind == "unchecked_followup":
                    assert errors[job_id].startswith("UnstorableOutcome: "), errors[job_id]
                elif kind not in ("ok", "ok_followup"):
                    assert errors[job_id].split(":")[0] in (
                        "ValueError", "ResultError", "RuntimeError"), errors[job_id]

        @precondition(lambda self: self.held)
        @rule(data=st.data())
        def extend(self, data: st.DataObject) -> None:
            worker, job_id, attempt = data.draw(st.sampled_from(self.held))
            kept = queries[worker].extend_many([job_id], [attempt], [60.0])
            assert (job_id in kept) == self._owner(job_id, attempt)
            if kept:
                self.model[job_id].expired = False

        @precondition(lambda self: self.held)
        @rule(data=st.data())
        def release(self, data: st.DataObject) -> None:
            worker, job_id, attempt = data.draw(st.sampled_from(self.held))
            released = queries[worker].release_many([job_id], [attempt])
            assert (job_id in released) == self._owner(job_id, attempt)
            if released:
                m = self.model[job_id]
                m.status, m.attempts, m.charged = "queued", m.attempts - 1, False

        @precondition(lambda self: any(m.status == "running" for m in self.model.values()))
        @rule(data=st.data())
        def time_passes(self, data: st.DataObject) -> None:
            """A running job's lease runs out (its worker stalled or died)."""
            job_id = data.draw(st.sampled_from(
                sorted(i for i, m in self.model.items() if m.status == "running")))
            observer.execute(sql.SQL(
                "UPDATE {} SET locked_until = now() - interval '1 second' WHERE id = %s"
            ).format(table), [job_id])
            self.model[job_id].expired = True

        @precondition(lambda self: any(m.status == "running" for m in self.model.values()))
        @rule(data=st.data(), worker=st.integers(0, WORKERS - 1), batch=st.integers(1, 4))
        def another_worker_takes_over(self, data: st.DataObject, worker: int,
                                      batch: int) -> None:
            """The interleaving the fence exists for: a lease runs out, the reaper puts the
            job back, another worker claims it while the first still holds it."""
            self.time_passes(data)
            self.reap(worker)
            self.claim(worker, batch)

        @rule(worker=st.integers(0, WORKERS - 1))
        def reap(self, worker: int) -> None:
            expected = {i for i, m in self.model.items() if m.status == "running" and m.expired}
            rows = queries[worker].reap_expired(["q"])
            assert {r[0] for r in rows} == expected
            for job_id, status, attempts in rows:
                m = self.model[job_id]
                # a claim proves no start: only a suspect's claim was charged for certain
                m.attempts -= not m.charged
                m.charged, m.suspect = False, True
                m.status = "failed" if m.attempts >= m.max_attempts else "queued"
                assert (status, attempts) == (m.status, m.attempts)

        @rule(worker=st.integers(0, WORKERS - 1))
        def worker_dies(self, worker: int) -> None:
            """A worker's process dies between two steps: it forgets every token it held,
            and the leases of the jobs it owned run out (nobody extends them)."""
            mine = sorted({j for w, j, f in self.held if w == worker and self._owner(j, f)})
            self.held = [h for h in self.held if h[0] != worker]
            if mine:
                observer.execute(sql.SQL(
                    "UPDATE {} SET locked_until = now() - interval '1 second' "
                    "WHERE id = ANY(%s)").format(table), [mine])
                for job_id in mine:
                    self.model[job_id].expired = True

        @precondition(lambda self: any(m.status in ("failed", "cancelled")
                                       for m in self.model.values()))
        @rule(data=st.data())
        def operator_retries(self, data: st.DataObject) -> None:
            """``drainer retry ID``: failed or cancelled -> queued, attempts 0; the fence is
            not reset, so a stalled former owner's token still matches nothing."""
            job_id = data.draw(st.sampled_from(sorted(
                i for i, m in self.model.items() if m.status in ("failed", "cancelled"))))
            observer.execute(sql.SQL(QUERIES["retry_many"]).format(
                **identifiers(schema, "jobs")), {"ids": [job_id]})
            m = self.model[job_id]
            m.status, m.attempts, m.due, m.expired, m.lease_kept = "queued", 0, True, False, \
                False
            m.aged = False  # finished_at is cleared; its next finish is now

        @precondition(lambda self: any(m.status in ("queued", "running")
                                       for m in self.model.values()))
        @rule(data=st.data())
        def operator_cancels(self, data: st.DataObject) -> None:
            """``drainer cancel``: queued or running -> cancelled (a running job keeps its
            lease; its owner's fenced writes then change nothing)."""
            job_id = data.draw(st.sampled_from(sorted(
                i for i, m in self.model.items() if m.status in ("queued", "running"))))
            observer.execute(sql.SQL(QUERIES["cancel_many"]).format(
                **identifiers(schema, "jobs")), {"ids": [job_id]})
            m = self.model[job_id]
            m.lease_kept = m.status == "running"
            m.status = "cancelled"

        @rule(worker=st.integers(0, WORKERS - 1))
        def archive(self, worker: int) -> None:
            done = {i for i, m in self.model.items() if m.status == "done"}
            assert queries[worker].archive_batch("done", 0.0, 1000, move=False) == len(done)
            assert queries[worker].archive_batch("failed", 86400.0, 1000, move=False) == 0
            for i in done:
                del self.model[i]
                self.gone[i] = "archived"

        @precondition(lambda self: any(m.status in ("done", "failed", "cancelled")
                                       for m in self.model.values()))
        @rule(data=st.data(), status=st.sampled_from(("done", "failed", "cancelled")),
              old=st.booleans(), batch=st.integers(1, 3))
        def operator_purges(self, data: st.DataObject, status: str, old: bool,
                            batch: int) -> None:
            """``drainer purge --status S --older-than T``: deletes the S jobs finished more
            than T ago, whatever their lease (a job cancelled while running goes too; its
            owner still holds a token). ``old``: --older-than 1h, after one finished job's
            finished_at is moved 2 h back; else --older-than 0 (every finished S job)."""
            if old:
                finished = sorted(i for i, m in self.model.items()
                                  if m.status in ("done", "failed", "cancelled"))
                job_id = data.draw(st.sampled_from(finished))
                observer.execute(sql.SQL(
                    "UPDATE {} SET finished_at = now() - interval '2 hours' WHERE id = %s"
                ).format(table), [job_id])
                self.model[job_id].aged = True
            doomed = {i for i, m in self.model.items()
                      if m.status == status and (m.aged or not old)}
            deleted, statements = purge_batches(queries[0], status, 3600.0 if old else 0.0,
                                                batch)
            assert deleted == len(doomed)
            assert statements == len(doomed) // batch + 1
            for i in doomed:
                del self.model[i]
                self.gone[i] = "purged"

        @precondition(lambda self: any(self.gone.get(j) == "purged" for _w, j, _f in self.held))
        @rule(data=st.data())
        def purged_jobs_stale_worker_writes(self, data: st.DataObject) -> None:
            """A worker still holding the token of a purged job (cancelled while it ran, then
            purged) finishes, fails, heartbeats, releases, and the operator retries it: every
            write matches nothing, no row comes back."""
            worker, job_id, fence = data.draw(st.sampled_from(sorted(
                h for h in self.held if self.gone.get(h[1]) == "purged")))
            q = queries[worker]
            assert q.complete_many([job_id], [fence]) == set()
            assert q.fail_many([job_id], [fence], ["late"], [None], 0.0, 3600.0) == []
            assert q.extend_many([job_id], [fence], [60.0]) == {}
            assert q.release_many([job_id], [fence]) == set()
            assert observer.execute(sql.SQL(QUERIES["retry_many"]).format(
                **identifiers(schema, "jobs")), {"ids": [job_id]}).fetchall() == []

        @invariant()
        def table_matches_model(self) -> None:
            rows = {r[0]: r for r in observer.execute(sql.SQL(
                "SELECT id, status, attempts, max_attempts, locked_until IS NOT NULL, "
                "locked_until < now(), run_at <= now(), finished_at IS NOT NULL, fence, "
                "last_error IS NOT NULL FROM {}"
            ).format(table))}
            # No job lost: every job ever enqueued is in the table (queued, running, done,
            # failed: checked below), or was archived when done, or purged by the operator;
            # a purged one never comes back.
            assert set(rows) == set(self.model)
            assert not set(rows) & set(self.gone)
            assert set(rows) | set(self.gone) == self.enqueued
            for job_id, (_i, status, attempts, max_attempts, leased, expired, due,
                         finished, fence, has_error) in rows.items():
                m = self.model[job_id]
                assert (status, attempts) == (m.status, m.attempts), job_id
                # the fence only grows, by one a claim: never reset, never repeated
                assert fence == m.fence, job_id
                if status == "running":
                    assert leased and not finished and attempts <= max_attempts
                    assert expired == m.expired
                elif status == "queued":
                    assert not leased and not finished and attempts < max_attempts
                    assert due == m.due
                else:  # done, failed, cancelled: not running, no lease (but a cancel's)
                    assert finished and (not leased or m.lease_kept)
                    assert status == "done" or has_error, f"{job_id} failed with no error"

    return QueueMachine


@pytest.mark.slow
def test_random_interleavings_keep_the_invariants(
    migrated: Settings, conn: psycopg.Connection[Any], pg_url: str
) -> None:
    conns = [psycopg.connect(pg_url, autocommit=True) for _ in range(WORKERS)]
    try:
        machine = _machine(conns, conn, migrated.schema_name)
        started = time.monotonic()
        run_state_machine_as_test(machine, settings=settings(
            max_examples=60, stateful_step_count=50, deadline=None, database=None,
            suppress_health_check=list(HealthCheck)))
        print(f"\nhypothesis: 60 examples x up to 50 steps in "
              f"{time.monotonic() - started:.1f}s")
    finally:
        for c in conns:
            c.close()
