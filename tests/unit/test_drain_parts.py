"""The drain's parts without a database: claim sizing, queue rotation, limits, outcome
buffers, the batch clock (tests/unit/fake_statements.py stands in for the table)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from drainer.drain.calls import Outcome, format_error, make_running
from drainer.drain.claims import Claims, claim_size, next_queue
from drainer.drain.clock import BatchClock
from drainer.drain.handlers import Handlers
from drainer.drain.limits import MAX_JOBS, MAX_RUNTIME, SIGNAL, Limits, record
from drainer.drain.outcomes import Outcomes
from drainer.drain.report import RunReport
from drainer.registry import Registry, Task
from tests.unit.fake_statements import FakeJobs


def _registry(*queues: str) -> Registry:
    registry = Registry()
    for q in queues:
        registry.task(q)(lambda job: None)
    return registry


def _parts(jobs: FakeJobs, registry: Registry, *, batch_size: int = 10,
           max_jobs: int | None = None, depth: int = 1) -> tuple[Claims, Outcomes, RunReport]:
    report = RunReport("test", registry.queues())
    outcomes = Outcomes(jobs, report, delete=False, retry_base=1.0, retry_cap=10.0,
                        pipeline=jobs if depth >= 2 else None)
    claims = Claims(jobs, outcomes, report, registry.tasks,
                    batch_size=batch_size, max_jobs=max_jobs, depth=depth, combine=True,
                    lease=lambda task: 60.0, run_in_transaction=lambda task, size: 0)
    return claims, outcomes, report


def _with_successes(claims: Claims, outcomes: Outcomes) -> tuple[list[Any], bool]:
    """The loop's claim that carries the buffered successes."""
    claim = claims.next()
    return claims.after_combined(claim, outcomes.with_claim(claim))


def _settle(claims: Claims, outcomes: Outcomes) -> list[Any]:
    read, error = outcomes.settle()
    assert error is None
    return [pair for claim, rows in read for pair in claims.after_ahead(claim, rows)]


def _outcome(jobs: FakeJobs, task: Task, ok: bool, claimed: list[int]) -> list[Outcome]:
    out = []
    for i in claimed:
        row = jobs.rows[i]
        from drainer.db import ClaimedRow
        r = make_running(task, ClaimedRow(i, row.queue, {}, row.attempts, 5, 0, row.run_at,
                                          row.run_at), 60.0, None)
        out.append(Outcome(r.job, task, ok, None if ok else "ValueError: no"))
    return out


# -- claim sizing and rotation -----------------------------------------------------------------
@pytest.mark.parametrize(("batch", "max_jobs", "claimed", "ahead", "size"), [
    (10, None, 0, 0, 10), (10, None, 500, 0, 10), (10, 43, 40, 0, 3), (10, 43, 43, 0, 0),
    (10, 43, 30, 10, 0), (10, 43, 30, 2, 8), (10, None, 0, 10, 0), (10, None, 0, 4, 6),
])
def test_claim_size(batch: int, max_jobs: int | None, claimed: int, ahead: int,
                    size: int) -> None:
    assert claim_size(batch, max_jobs, claimed, ahead) == size


@pytest.mark.parametrize(("batch", "max_jobs", "claimed", "ahead", "window", "size"), [
    (10, None, 0, 10, 30, 10), (10, None, 0, 25, 30, 5), (10, None, 0, 30, 30, 0),
    (10, 43, 30, 10, 30, 3), (10, 43, 0, 20, 30, 10), (10, 25, 0, 20, 30, 5),
])
def test_claim_size_within_a_window_of_claims_in_flight(
        batch: int, max_jobs: int | None, claimed: int, ahead: int, window: int,
        size: int) -> None:
    assert claim_size(batch, max_jobs, claimed, ahead, window) == size


def test_pipeline_depth_adapts_to_the_round_trip_within_bounds() -> None:
    from drainer.drain.clock import ADAPT_SAMPLES

    clock = BatchClock(limit=0.1)
    assert clock.depth(10, 4) == 1  # nothing measured: one claim ahead
    for _ in range(10):
        clock.start(0.0)
    clock.finish(0.001)  # 0.1 ms a job: a batch of 10 runs 1 ms
    for _ in range(ADAPT_SAMPLES - 1):
        clock.round_trip(0.002)
    assert clock.depth(10, 4) == 1  # not before ADAPT_SAMPLES round trips
    clock.round_trip(0.002)
    assert clock.depth(10, 8) == 4  # two 2 ms round trips of 1 ms batches
    assert clock.depth(10, 2) == 2  # never deeper than --pipeline-depth
    assert clock.depth(10, 1) == 1
    assert clock.depth(100, 8) == 1  # a 10 ms batch covers two round trips alone
    far = BatchClock(limit=0.1)
    far.start(0.0)
    far.finish(0.03)  # 30 ms a job
    for _ in range(ADAPT_SAMPLES):
        far.round_trip(0.2)
    assert far.depth(1, 8) == 3  # what runs within the limit: 3 x 30 ms, not 14 claims


def test_next_queue_stays_while_batches_are_full() -> None:
    assert next_queue(0, 3, 10, 10) == 0
    assert next_queue(0, 3, 10, 9) == 1
    assert next_queue(2, 3, 10, 0) == 0
    assert next_queue(0, 1, 10, 3) == 0


def test_claims_rotate_queues_and_count_once() -> None:
    jobs = FakeJobs()
    jobs.add("a", 15)
    jobs.add("b", 3)
    claims, _, report = _parts(jobs, _registry("a", "b"))
    sizes = []
    while True:
        batch, progressed = claims.claim()
        if not progressed:
            break
        sizes.append((batch[0][0].queue, len(batch), claims.cursor))
    assert sizes == [("a", 10, 0), ("a", 5, 1), ("b", 3, 0)]
    assert report.claimed == 18
    # one due_queues says which queues to try; queues found dry are skipped; the last
    # round is one due_queues that finds nothing (it was one empty claim per queue)
    assert jobs.sent == ["due_queues"] + ["claim_batch"] * 3 + ["due_queues"]


def test_max_jobs_caps_the_claims() -> None:
    jobs = FakeJobs()
    jobs.add("a", 30)
    claims, _, report = _parts(jobs, _registry("a"), max_jobs=13)
    assert len(claims.claim()[0]) == 10
    assert len(claims.claim()[0]) == 3
    assert claims.claim() == ([], False)
    assert report.claimed == 13 and jobs.sent == ["claim_batch"] * 2


def test_successes_go_with_the_next_claim() -> None:
    jobs = FakeJobs()
    jobs.add("a", 12)
    registry = _registry("a")
    claims, outcomes, report = _parts(jobs, registry)
    first, _ = claims.claim()
    for o in _outcome(jobs, registry.tasks["a"], True, [r.id for _, r in first[:9]]):
        outcomes.add(o)
    for o in _outcome(jobs, registry.tasks["a"], False, [first[9][1].id]):
        outcomes.add(o)
    second, progressed = _with_successes(claims, outcomes)
    assert progressed and len(second) == 2
    # failures first, on their own; successes with the claim
    assert jobs.sent == ["claim_batch", "fail_many", "complete_many_and_claim"]
    assert (report.succeeded, report.retried, report.claimed, len(outcomes)) == (9, 1, 12, 0)


def test_a_deadlocked_combined_claim_is_written_and_claimed_in_two_statements() -> None:
    jobs = FakeJobs()
    jobs.add("a", 12)
    registry = _registry("a")
    claims, outcomes, report = _parts(jobs, registry)
    first, _ = claims.claim()
    for o in _outcome(jobs, registry.tasks["a"], True, [r.id for _, r in first]):
        outcomes.add(o)
    jobs.deadlock_next.add("complete_many_and_claim")
    second, progressed = _with_successes(claims, outcomes)
    assert progressed and len(second) == 2
    assert jobs.sent == ["claim_batch", "complete_many_and_claim", "complete_many",
                         "claim_batch"]
    assert (report.succeeded, report.claimed) == (10, 12)


def test_claims_ahead_are_sized_counted_and_settled_in_order() -> None:
    jobs = FakeJobs()
    jobs.add("a", 25)
    claims, outcomes, report = _parts(jobs, _registry("a"), max_jobs=24, depth=2)
    claims.claim()
    assert claims.last_full and claims.can_send_ahead()
    outcomes.send_ahead(claims.next(ahead=True))
    # a batch in flight leaves no room: the next claim's size counts it
    assert [a.claim.size for a in outcomes.ahead] == [10] and not claims.can_send_ahead()
    assert report.claimed == 10  # counted when read, not when sent
    assert len(_settle(claims, outcomes)) == 10 and report.claimed == 20
    assert not outcomes.ahead and claims.last_full and claims.can_send_ahead()
    outcomes.send_ahead(claims.next(ahead=True))  # the room left under --max-jobs: 24 - 20
    assert [a.claim.size for a in outcomes.ahead] == [4]
    assert len(claims.after_ahead(*outcomes.receive())) == 4 and report.claimed == 24
    assert not claims.can_send_ahead() and _settle(claims, outcomes) == []


def test_a_deadlocked_claim_ahead_puts_its_successes_back() -> None:
    jobs = FakeJobs()
    jobs.add("a", 20)
    registry = _registry("a")
    claims, outcomes, report = _parts(jobs, registry, depth=2)
    first, _ = claims.claim()
    for o in _outcome(jobs, registry.tasks["a"], True, [r.id for _, r in first]):
        outcomes.add(o)
    jobs.deadlock_next.add("complete_many_and_claim")
    outcomes.send_ahead(claims.next(ahead=True))
    assert claims.after_ahead(*outcomes.receive()) == []
    assert len(outcomes.ok) == 10 and not claims.last_full
    assert (report.succeeded, report.claimed) == (0, 10)


# -- limits --------------------------------------------------------------------------------------
def test_limits_are_questions() -> None:
    stop = threading.Event()
    limits = Limits(stop, deadline=100.0, max_jobs=5)
    assert limits.stopped_by(4, now=99.0) is None and not limits.must_release(now=99.0)
    assert limits.stopped_by(5, now=99.0) == MAX_JOBS and not limits.must_release(now=99.0)
    assert limits.stopped_by(0, now=100.0) == MAX_RUNTIME and limits.must_release(now=100.0)
    stop.set()
    assert limits.stopped_by(5, now=100.0) == SIGNAL and limits.must_release(now=0.0)
    assert Limits(threading.Event()).stopped_by(10**9) is None


def test_record_keeps_the_first_limit() -> None:
    report = RunReport("r", ["a"])
    record(report, None)
    assert (report.stopped_by, report.deadline_hit) == (None, False)
    record(report, SIGNAL)
    assert (report.stopped_by, report.deadline_hit) == (SIGNAL, False)
    record(report, MAX_JOBS)
    assert (report.stopped_by, report.deadline_hit) == (SIGNAL, True)


# -- outcomes ------------------------------------------------------------------------------------
def test_outcomes_are_buffered_then_written_one_statement_per_kind() -> None:
    jobs = FakeJobs()
    jobs.add("a", 5)
    registry = _registry("a")
    claims, outcomes, report = _parts(jobs, registry)
    batch, _ = claims.claim()
    ids = [r.id for _, r in batch]
    task = registry.tasks["a"]
    ok = _outcome(jobs, task, True, ids[:3])
    for o in ok:
        outcomes.add(o)
    outcomes.add(_outcome(jobs, task, False, ids[3:4])[0])
    outcomes.add(_outcome(jobs, task, True, ids[4:])[0], lost=True)
    assert (len(outcomes), report.lost) == (4, 1)
    taken = outcomes.take_successes()
    outcomes.put_back(taken)
    assert outcomes.ok == ok
    outcomes.write()
    assert jobs.sent == ["claim_batch", "complete_many", "fail_many"]
    assert (report.succeeded, report.retried, report.failed, len(outcomes)) == (3, 1, 0, 0)
    outcomes.write()  # nothing buffered: no statement
    assert len(jobs.sent) == 3


def test_an_outcome_not_written_is_counted_lost() -> None:
    jobs = FakeJobs()
    jobs.add("a", 2)
    registry = _registry("a")
    claims, outcomes, report = _parts(jobs, registry)
    batch, _ = claims.claim()
    done = _outcome(jobs, registry.tasks["a"], True, [r.id for _, r in batch])
    jobs.rows[done[0].job.id].status = "queued"  # reaped meanwhile: no longer ours
    for o in done:
        outcomes.add(o)
    outcomes.write()
    assert (report.succeeded, report.lost) == (1, 1)


# -- handlers, the batch clock, maintenance configs ----------------------------------------------
def test_handlers_slots() -> None:
    registry = _registry("a")
    row_task = registry.tasks["a"]
    from drainer.db import ClaimedRow
    from tests.unit.fake_statements import T0
    r = make_running(row_task, ClaimedRow(1, "a", {}, 1, 5, 0, T0, T0), 60.0, None)
    assert Handlers(1, 10, None, lambda: True).slots(r) == 11  # sequential: a batch ahead
    assert Handlers(4, 10, None, lambda: True).slots(r) == 8
    timed = make_running(row_task, ClaimedRow(2, "a", {}, 1, 5, 0, T0, T0), 60.0, 1.0)
    assert Handlers(4, 10, None, lambda: True).slots(timed) == 4


def test_format_error_is_storable() -> None:
    text = format_error(ValueError("a\x00b"))
    assert text.startswith("ValueError: a\\x00b") and "\x00" not in text


def test_batch_clock() -> None:
    clock = BatchClock(limit=0.1)
    assert not clock.fast() and not clock.slow_now(0.0)
    clock.start(1.0)
    clock.start(1.05)  # the batch started at its first job
    assert not clock.slow_now(1.09) and clock.slow_now(1.2)
    clock.finish(1.08)
    assert clock.fast() and clock.started is None
    clock.start(2.0)
    clock.finish(2.5)
    assert not clock.fast()


def test_outcomes_tell_each_jobs_outcome_once() -> None:
    """Tally.on_outcome (the end of a job's OpenTelemetry span): succeeded, retried,
    failed, lost, whichever way the outcome went."""
    from datetime import datetime, timezone

    from drainer.job import Job

    class Statements:
        def complete_many(self, ids: Any, fences: Any, *, delete: bool = False,
                          **completion: Any) -> set[int]:  # results, follow-ups
            return {1}  # job 2's success is lost (UPDATE 0)

        def fail_many(self, ids: Any, *rest: Any, **policy: Any
                      ) -> list[tuple[int, str, datetime]]:  # per-task backoffs
            t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
            return [(3, "queued", t0), (4, "failed", t0)]  # job 5's failure is lost

    told: list[tuple[int, str]] = []
    outcomes = Outcomes(Statements(), RunReport("r", ["a"]),  # type: ignore[arg-type]
                        delete=False, retry_base=1, retry_cap=1)
    outcomes.tally.on_outcome = lambda job, outcome: told.append((job.id, outcome))
    task = Task(queue="a", func=lambda job: None)

    def outcome(i: int, ok: bool) -> Outcome:
        return Outcome(Job(i, "a", {}, 1, 5, None), task, ok, None if ok else "E: x")

    for i, ok in ((1, True), (2, True), (3, False), (4, False), (5, False)):
        outcomes.add(outcome(i, ok))
    outcomes.add(outcome(6, True), lost=True)
    outcomes.write()
    assert sorted(told) == [(1, "succeeded"), (2, "lost"), (3, "retried"), (4, "failed"),
                            (5, "lost"), (6, "lost")]


def test_claim_size_adapts_to_the_measured_work_within_bounds() -> None:
    from drainer.drain.clock import ADAPT_SAMPLES, BATCH_ROUND_TRIPS, BatchClock

    clock = BatchClock(limit=0.1)
    assert clock.adapted(10, 1024) == 10  # nothing measured yet
    for _ in range(10):
        clock.start(0.0)
    clock.finish(0.001)  # 10 jobs in 1 ms: 0.1 ms a job
    assert clock.adapted(10, 1024) == 10  # no round trip timed yet
    for _ in range(ADAPT_SAMPLES):
        clock.round_trip(0.040)  # the run's first Query, the server's time included
    assert clock.adapted(10, 1024) == 500  # 8 x 40 ms of work: half the limit already
    clock.round_trip(0.0005)  # the fastest round trip counts: a claim, locally
    assert clock.adapted(10, 1024) == 41  # 8 x 0.5 ms / 0.1 ms
    clock.round_trip(0.010)
    assert clock.adapted(10, 1024) == 41  # a slower round trip since changes nothing
    clock.rtt = 0.010
    # BATCH_ROUND_TRIPS round trips of work (8 x 10 ms / 0.1 ms), within half the limit
    assert clock.adapted(10, 1024) == min(int(BATCH_ROUND_TRIPS * 100) + 1, 500) == 500
    assert clock.adapted(10, 150) == 150  # never more than the cap
    assert clock.adapted(800, 1024) == 800  # never less than --batch-size
    slow = BatchClock(limit=0.1)
    slow.start(0.0)
    slow.finish(0.02)  # 20 ms a job: a batch of 8 round trips would be slow to run
    for _ in range(5):
        slow.round_trip(0.05)
    assert slow.adapted(1, 1024) == 2  # at most what runs within half the limit (0.05 s)


def _timed_clock(claim_rtt: float, *, per_job: float = 0.0001, samples: int = 5
                 ) -> BatchClock:
    """A clock that has run a batch of 10 at ``per_job`` seconds a job and timed ``samples``
    claims of ``claim_rtt`` seconds."""
    clock = BatchClock(limit=0.1)
    for _ in range(10):
        clock.start(0.0)
    clock.finish(10 * per_job)
    for _ in range(samples):
        clock.round_trip(claim_rtt)
    return clock


def test_a_local_database_grows_its_claims_like_a_link() -> None:
    """The same rule on any connection: a local claim of 0.4 ms with no-op jobs of 25 us
    grows to 8 round trips of work (it stayed at --batch-size 10, half the rate of the best
    --batch-size locally), a busy disk's 5 ms claims and a link's grow further, within the
    bounds; slow handlers keep the batch size."""
    from drainer.drain.clock import ADAPT_SAMPLES

    assert _timed_clock(0.0004, per_job=0.000025, samples=ADAPT_SAMPLES - 1) \
        .adapted(10, 1024) == 10  # too soon
    local = _timed_clock(0.0004, per_job=0.000025)
    assert local.adapted(10, 1024) == 129  # 8 x 0.4 ms / 25 us
    assert local.depth(129, 8) == 1  # a batch runs longer than two round trips: one ahead
    busy = _timed_clock(0.005, per_job=0.000025)
    assert busy.adapted(10, 1024) == 1024
    link = _timed_clock(0.0025)  # 2.5 ms away, 0.1 ms a job
    assert link.adapted(10, 1024) == 201 and link.adapted(10, 30) == 30
    assert link.depth(10, 8) == 5  # two 2.5 ms round trips of 1 ms batches
    assert link.depth(10, 2) == 2  # never deeper than --pipeline-depth
    # a slow handler: a batch of 10 at 3 ms a job runs longer than 8 round trips already
    assert _timed_clock(0.0025, per_job=0.003).adapted(10, 1024) == 10


@pytest.mark.parametrize(("batch", "concurrency", "max_jobs"), [
    (10, 1, None), (10, 4, None), (10, 200, None), (50, 8, None), (10, 1000, None),
    (10, 4, 3), (10, 1, 0),
])
def test_the_first_claim_sent_with_run_start_has_the_loops_first_size(
        batch: int, concurrency: int, max_jobs: int | None) -> None:
    """first_claim_size (claim_first's size, known before connecting) is what the loop's
    first claim would ask: Claims.size with fresh handlers, nothing claimed or measured."""
    from drainer.drain.claims import first_claim_size

    registry = _registry("a")
    report = RunReport("test", registry.queues())
    jobs = FakeJobs()
    outcomes = Outcomes(jobs, report, delete=False, retry_base=1.0, retry_cap=10.0,
                        pipeline=jobs)
    handlers = Handlers(concurrency, batch, None, may_start=lambda: True)
    try:
        claims = Claims(jobs, outcomes, report, registry.tasks, batch_size=batch,
                        max_jobs=max_jobs, depth=2, combine=True, lease=lambda task: 60.0,
                        run_in_transaction=lambda task, size: 0, room=handlers.free)
        assert first_claim_size(batch, concurrency, max_jobs) == claims.size(0)
    finally:
        handlers.shutdown()


def test_the_process_start_is_reported_once_a_process() -> None:
    import time

    from drainer import process

    at = process.started_at()
    assert at is not None and 0 < time.time() - at < 24 * 3600  # this test process's start
    process._REPORTED.clear()
    first = process.start_to_now_once()
    assert first is not None and first >= 0
    assert process.start_to_now_once() is None  # a worker's later runs


def test_a_retry_due_after_the_last_claim_was_sent_is_kept_for_the_linger() -> None:
    """The retry_linger race: a retry due between the last empty claim and the tail's look
    was not seen by that claim; it is kept (due now), not dropped as if it had been."""
    from datetime import datetime, timedelta, timezone

    from drainer.drain.report import Tally

    tally = Tally(RunReport("r", ["q"]))
    sent = datetime(2026, 1, 1, tzinfo=timezone.utc)
    seen_by_claim, after_claim = sent - timedelta(seconds=0.03), sent + timedelta(seconds=0.03)
    tally.retry_times = [seen_by_claim, after_claim, sent + timedelta(seconds=5)]
    now = sent + timedelta(seconds=0.05)
    assert tally.next_retry_at(now, sent) == after_claim
    assert tally.next_retry_at(now) == sent + timedelta(seconds=5)  # seen now: as before


@pytest.mark.parametrize("is_async", [False, True])
def test_a_batch_is_timed_without_the_start_of_the_handler_threads(
        monkeypatch: pytest.MonkeyPatch, is_async: bool) -> None:
    """The run's first batch starts the handler threads (or the event loop's): that start
    is not the jobs' time, or the claims after the first batch are sized for a per-job
    time many times the handlers' (10 no-op jobs and a 3 ms thread start: 350 us a job)."""
    import time
    from collections import deque
    from datetime import datetime, timezone

    from drainer.db import ClaimedRow
    from drainer.drain import execute
    from drainer.drain import handlers as handlers_mod
    from drainer.drain.pending import Pending

    started = 0.2  # seconds a thread start takes here: far more than 10 no-op jobs

    def slow(cls: type) -> type:
        class Slow(cls):  # type: ignore[misc, valid-type]
            def __init__(self, *a: Any, **kw: Any) -> None:
                time.sleep(started)
                super().__init__(*a, **kw)
        return Slow

    monkeypatch.setattr(handlers_mod, "HandlerThreads", slow(execute.HandlerThreads))
    monkeypatch.setattr(handlers_mod, "EventLoopThread", slow(execute.EventLoopThread))
    registry = Registry()
    if is_async:
        async def noop_async(job: Any) -> None:
            return None
        registry.task("a")(noop_async)
    else:
        registry.task("a")(lambda job: None)
    task = registry.tasks["a"]
    report = RunReport("test", registry.queues())
    outcomes = Outcomes(FakeJobs(), report, delete=False, retry_base=1.0, retry_cap=10.0)
    handlers = Handlers(1, 10, None, may_start=lambda: True)
    pending = Pending(handlers, outcomes, lambda t: 60.0, lambda job, s: False)
    now = datetime.now(timezone.utc)
    pending.jobs = deque(make_running(task, ClaimedRow(i, "a", {}, 1, 5, 0, now, now), 60.0,
                                      None) for i in range(10))
    clock = BatchClock()
    try:
        while pending or handlers.in_flight():
            pending.start(clock)
            for outcome, _r in handlers.wait(1.0, 10):
                assert outcome.ok, outcome.error
        clock.finish(time.monotonic())
    finally:
        handlers.shutdown()
    assert clock.last is not None and clock.last < started / 2
    assert clock.per_job is not None and clock.per_job < started / 20
