"""The drain loop's transitions, over the fake statement sender (no database)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from drainer.drain.claims import Claims
from drainer.drain.handlers import Handlers
from drainer.drain.limits import Limits
from drainer.drain.loop import Drain, Phase
from drainer.drain.outcomes import Outcomes
from drainer.drain.report import RunReport
from drainer.registry import Job, Registry
from tests.unit.fake_statements import FakeJobs


def _drain(jobs: FakeJobs, registry: Registry, *, batch_size: int = 10, depth: int = 1,
           max_jobs: int | None = None, stop: threading.Event | None = None,
           concurrency: int = 1, grace: float = 5.0,
           progress: Callable[[RunReport], None] | None = None) -> Drain:
    report = RunReport("test", registry.queues())
    limits = Limits(stop or threading.Event(), None, max_jobs)
    outcomes = Outcomes(jobs, report, delete=False, retry_base=1.0, retry_cap=10.0)
    handlers = Handlers(concurrency, batch_size, None, lambda: not limits.must_release())
    claims = Claims(jobs, jobs if depth >= 2 else None, outcomes, report, registry.tasks,
                    batch_size=batch_size, max_jobs=max_jobs, depth=depth, combine=True,
                    lease=lambda task: 60.0, run_in_transaction=lambda task, size: 0)
    return Drain(report, jobs, claims, handlers, outcomes, limits, None,
                 batch_size=batch_size, grace=grace, hurry=threading.Event(),
                 lease=lambda task: 60.0, progress=progress)


def _registry(handler: Callable[[Job], None], *queues: str) -> Registry:
    registry = Registry()
    for q in queues or ("a",):
        registry.task(q)(handler)
    return registry


def test_an_empty_queue_is_one_claim_and_one_step() -> None:
    jobs = FakeJobs()
    d = _drain(jobs, _registry(lambda job: None))
    d.step()
    assert d.phase is Phase.DONE
    assert jobs.sent == ["claim_batch"]
    assert (d.report.claimed, d.report.stopped_by) == (0, None)


def test_a_stop_before_the_first_claim_claims_nothing() -> None:
    jobs = FakeJobs()
    jobs.add("a", 5)
    stop = threading.Event()
    stop.set()
    d = _drain(jobs, _registry(lambda job: None), stop=stop)
    d.run()
    assert d.phase is Phase.DONE and jobs.sent == []
    assert (d.report.stopped_by, d.report.deadline_hit) == ("signal", False)


def test_drains_in_step_every_job_once() -> None:
    jobs = FakeJobs()
    jobs.add("a", 25)
    ran: list[int] = []
    d = _drain(jobs, _registry(lambda job: ran.append(job.id)))
    d.run()
    assert sorted(ran) == list(range(1, 26))
    assert jobs.statuses() == {"done": 25}
    assert (d.report.claimed, d.report.succeeded, d.report.lost) == (25, 25, 0)
    assert "send" not in jobs.sent and "complete_many_and_claim" in jobs.sent
    assert jobs.sent[0] == "claim_batch"


def test_drains_with_claims_ahead_every_job_once() -> None:
    jobs = FakeJobs()
    jobs.add("a", 205)
    ran: list[int] = []
    d = _drain(jobs, _registry(lambda job: ran.append(job.id)), depth=2)
    d.run()
    assert sorted(ran) == list(range(1, 206))
    assert jobs.statuses() == {"done": 205}
    assert (d.report.claimed, d.report.succeeded) == (205, 205)
    assert "send" in jobs.sent  # fast batches: the next claim went out ahead
    assert not d.claims.ahead and jobs.in_flight == 0


def test_failures_are_written_apart_and_counted() -> None:
    jobs = FakeJobs()
    jobs.add("a", 30)

    def handler(job: Job) -> None:
        if job.id % 3 == 0:
            raise ValueError("every third")

    d = _drain(jobs, _registry(handler), depth=2)
    d.run()
    assert jobs.statuses() == {"done": 20, "queued": 10}
    assert (d.report.succeeded, d.report.retried, d.report.claimed) == (20, 10, 30)
    assert "fail_many" in jobs.sent


def test_max_jobs_stops_claiming_and_runs_what_was_claimed() -> None:
    jobs = FakeJobs()
    jobs.add("a", 40)
    d = _drain(jobs, _registry(lambda job: None), max_jobs=13, depth=2)
    d.run()
    assert jobs.statuses() == {"done": 13, "queued": 27}
    assert (d.report.claimed, d.report.stopped_by, d.report.deadline_hit) == (
        13, "max_jobs", True)


def test_two_queues_are_both_drained() -> None:
    jobs = FakeJobs()
    jobs.add("a", 23)
    jobs.add("b", 7)
    d = _drain(jobs, _registry(lambda job: None, "a", "b"), depth=2)
    d.run()
    assert jobs.statuses() == {"done": 30} and d.report.claimed == 30


def test_a_deadlocked_claim_ahead_is_written_again() -> None:
    jobs = FakeJobs()
    jobs.add("a", 60)
    seen = 0

    def handler(job: Job) -> None:
        nonlocal seen
        seen += 1
        if seen == 25:  # pipelining has started: the next statement ahead deadlocks
            jobs.deadlock_next.add("complete_many_and_claim")

    d = _drain(jobs, _registry(handler), depth=2)
    d.run()
    assert jobs.statuses() == {"done": 60}
    assert (d.report.succeeded, d.report.lost) == (60, 0)


def test_a_stop_releases_what_did_not_start_and_waits_for_the_running() -> None:
    jobs = FakeJobs()
    jobs.add("a", 30)
    stop = threading.Event()
    started = threading.Event()
    go = threading.Event()

    def handler(job: Job) -> None:
        if not started.is_set():
            started.set()
            go.wait(5)

    d = _drain(jobs, _registry(handler), stop=stop)
    while not started.is_set():
        d.step()
    stop.set()
    d.step()  # the queued-ahead jobs go back; the running one keeps running
    assert d.phase is Phase.STOPPING and d.report.released >= 9
    assert d.handlers.in_flight() == 1
    threading.Timer(0.1, go.set).start()
    t0 = time.monotonic()
    d.run()
    assert d.phase is Phase.DONE and time.monotonic() - t0 < 4
    assert jobs.statuses().get("running", 0) == 0
    assert jobs.statuses()["done"] == 1
    assert d.report.released == d.report.claimed - 1
    assert d.report.stopped_by == "signal"


def test_the_progress_line_is_drawn_after_writes_and_counts_at_most_each_second() -> None:
    jobs = FakeJobs()
    jobs.add("a", 50)
    drawn: list[tuple[int, int]] = []
    d = _drain(jobs, _registry(lambda job: None),
               progress=lambda r: drawn.append((r.succeeded, r.remaining_due)))
    t0 = time.monotonic()
    d.run()
    elapsed = time.monotonic() - t0
    assert drawn and drawn[-1][0] == 50
    assert [s for s, _ in drawn] == sorted(s for s, _ in drawn)
    assert jobs.sent.count("queue_summary") <= elapsed + 1


def test_a_rate_limited_queue_is_claimed_in_step_up_to_its_window_then_the_drain_ends() -> None:
    jobs = FakeJobs()
    jobs.add("a", 8)
    registry = Registry()
    registry.task("a", rate_limit="3/m")(lambda job: None)
    d = _drain(jobs, registry, concurrency=2)
    d.claims.free_slots = lambda: 2 - d.handlers.in_flight()  # as run_once wires it
    d.run()
    assert jobs.statuses() == {"done": 3, "queued": 5}
    assert (d.report.claimed, d.report.rate_limited) == (3, 5)
    # never combined with completions nor sent ahead; each asks for the free handlers only
    assert set(jobs.sent) == {"claim_batch_rated", "complete_many"}
    assert jobs.rated_sizes and all(n <= 2 for n in jobs.rated_sizes)
    # claims of 2, 1 (the window is full), 0 (nothing more: drained); the next slot
    # (T0 + 60 s) is long past by this clock: claimed again once, not in a loop
    assert jobs.rated_sizes == [2, 2, 2, 2]
    assert jobs.sent.count("claim_batch_rated") == 4


def test_a_far_database_claims_ahead_before_the_batch_is_handed_over() -> None:
    """Measured 10 ms away with fast handlers: claims grow, the next goes out while the
    sequential handlers still take the batch in hand a few at a time, and the batch's
    successes go with those claims, not in a statement of their own each --batch-size."""
    from drainer.drain.claims import ADAPT_SAMPLES

    jobs = FakeJobs()
    jobs.add("a", 3000)
    d = _drain(jobs, _registry(lambda job: None), depth=2)
    d.clock.rtt, d.clock.samples = 0.01, ADAPT_SAMPLES  # a database 10 ms away, measured
    d.clock.round_trip = lambda seconds: None  # type: ignore[method-assign]  # fakes answer at once
    waiting: list[int] = []
    send = d.claims.send_ahead

    def send_ahead() -> None:
        waiting.append(len(d.pending))
        send()

    d.claims.send_ahead = send_ahead  # type: ignore[method-assign]
    d.run()
    assert jobs.statuses() == {"done": 3000}
    assert d.report.succeeded == 3000
    assert max(d.claims.last_size, *(n for n in waiting)) > 10  # grown to the round trip
    assert any(n > 0 for n in waiting)  # sent with jobs still waiting to start
    # the successes went with the claims: a final write at most, not one per 10 jobs
    assert jobs.sent.count("complete_many") <= 1, jobs.sent.count("complete_many")
    assert not d.claims.ahead and jobs.in_flight == 0
