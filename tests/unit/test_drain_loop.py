"""The drain loop's transitions, over the fake statement sender (no database)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from drainer.drain.claims import Claims
from drainer.drain.handlers import Handlers
from drainer.drain.limits import Limits
from drainer.drain.loop import Drain, Phase
from drainer.drain.outcomes import Outcomes
from drainer.drain.report import RunReport
from drainer.job import Job
from drainer.registry import Registry
from tests.unit.fake_statements import FakeJobs


def _drain(jobs: FakeJobs, registry: Registry, *, batch_size: int = 10, depth: int = 1,
           max_jobs: int | None = None, stop: threading.Event | None = None,
           concurrency: int = 1, grace: float = 5.0,
           progress: Callable[[RunReport], None] | None = None) -> Drain:
    report = RunReport("test", registry.queues())
    limits = Limits(stop or threading.Event(), None, max_jobs)
    outcomes = Outcomes(jobs, report, delete=False, retry_base=1.0, retry_cap=10.0,
                        pipeline=jobs if depth >= 2 else None)
    handlers = Handlers(concurrency, batch_size, None, lambda: not limits.must_release())
    claims = Claims(jobs, outcomes, report, registry.tasks,
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
    assert not d.outcomes.ahead and jobs.in_flight == 0


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


def _concurrent(jobs: FakeJobs, registry: Registry, concurrency: int) -> Drain:
    """A drain wired as run_once wires it: claims sized to the free handler slots."""
    d = _drain(jobs, registry, concurrency=concurrency)
    d.claims.room = d.handlers.free
    return d


def test_async_claims_go_out_as_slots_free_and_carry_the_successes() -> None:
    import asyncio

    jobs = FakeJobs()
    jobs.add("a", 300)
    ran: list[int] = []
    registry = Registry()

    @registry.task("a")
    async def handler(job: Job) -> None:
        ran.append(job.id)
        await asyncio.sleep(0.02)

    d = _concurrent(jobs, registry, 20)
    d.run()
    assert sorted(ran) == list(range(1, 301)) and jobs.statuses() == {"done": 300}
    assert (d.report.claimed, d.report.succeeded, d.report.lost) == (300, 300, 0)
    claims = [i for i, name in enumerate(jobs.sent)
              if name in ("claim_batch", "complete_many_and_claim")]
    # while claiming, every success went out with a claim: no completion on its own
    assert "complete_many" not in jobs.sent[:claims[-1]]
    assert jobs.sent[1] == "complete_many_and_claim"
    # a claim waits for a quarter of the slots (at least a batch, 10), not one per outcome
    assert len(claims) <= 300 // 10 + 2


def test_a_turn_of_the_event_loop_hands_back_its_outcomes_together() -> None:
    import asyncio

    from drainer.drain.calls import make_running
    from tests.unit.fake_statements import T0

    registry = Registry()

    @registry.task("a")
    async def handler(job: Job) -> None:
        await asyncio.sleep(0.05)

    from drainer.db import ClaimedRow

    task = registry.tasks["a"]
    h = Handlers(50, 10, None, lambda: True)
    try:
        rs = [make_running(task, ClaimedRow(i, "a", {}, 1, 5, 0, T0, T0, 1), 60.0, None)
              for i in range(1, 101)]
        h.start_many(rs)  # 50 run, 50 wait and start as the first end
        started = time.monotonic()
        first = h.wait(2.0, want=50)
        assert len(first) >= 50 and time.monotonic() - started < 1.5
        rest = first + h.wait(2.0, want=100 - len(first))
        assert sorted(r.job.id for _, r in rest) == list(range(1, 101))
        assert all(o.ok for o, _ in rest) and h.in_flight() == 0 and h.uncollected == 0
    finally:
        h.shutdown()


def test_an_async_job_cancelled_before_its_first_step_frees_its_slot() -> None:
    import asyncio

    from drainer.db import ClaimedRow
    from drainer.drain.calls import make_running
    from drainer.drain.execute import EventLoopThread
    from tests.unit.fake_statements import T0

    registry = Registry()
    ran: list[int] = []

    @registry.task("a")
    async def handler(job: Job) -> None:
        ran.append(job.id)
        await asyncio.sleep(0)

    r = make_running(registry.tasks["a"], ClaimedRow(1, "a", {}, 1, 5, 0, T0, T0, 1), 60.0,
                     None)
    got: list[object] = []
    done = threading.Event()
    loop = EventLoopThread(1, lambda: True)
    try:
        def back(outcomes: list[object]) -> None:
            got.extend(outcomes)
            done.set()
        # the loop's thread runs these in order: the task is made, then cancelled before
        # its first step (held until both are scheduled: on a loaded machine the thread
        # could otherwise take the task's first step before cancel() is called)
        hold = threading.Event()
        loop.loop.call_soon_threadsafe(hold.wait, 5)
        loop.submit(r, None, back)  # type: ignore[arg-type]
        loop.cancel(r)
        hold.set()
        assert done.wait(5)
        assert ran == [] and loop.active == 0 and not loop.tasks
        assert [getattr(o, "error", None) for o in got] == ["CancelledError: handler cancelled"]
    finally:
        loop.shutdown()


def test_fewer_collections_while_drains_run_then_the_process_thresholds() -> None:
    import gc

    from drainer.drain import collector

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with collector.fewer_collections():
            assert gc.get_threshold() == (collector.DRAIN_THRESHOLD, 10, 10)
            with collector.fewer_collections():  # a second drain at once (serve)
                assert gc.get_threshold()[0] == collector.DRAIN_THRESHOLD
            assert gc.get_threshold()[0] == collector.DRAIN_THRESHOLD  # one still runs
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(50_000, 10, 10)  # a process that set it higher keeps its own
        with collector.fewer_collections():
            assert gc.get_threshold()[0] == 50_000
        assert gc.get_threshold()[0] == 50_000
    finally:
        gc.set_threshold(*before)


def test_an_async_job_does_not_see_the_context_variables_of_the_job_before_it() -> None:
    import asyncio
    import contextvars

    from drainer.db import ClaimedRow
    from drainer.drain.calls import make_running
    from tests.unit.fake_statements import T0

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    seen: list[str] = []
    registry = Registry()

    @registry.task("a")
    async def handler(job: Job) -> None:
        seen.append(var.get())
        var.set(f"job {job.id}")  # a handler's own binding (a structlog context, say)
        await asyncio.sleep(0)

    task = registry.tasks["a"]
    h = Handlers(1, 10, None, lambda: True)  # one task at a time: each starts as one ends
    token = var.set("the caller's")
    try:
        h.start_many([make_running(task, ClaimedRow(i, "a", {}, 1, 5, 0, T0, T0, 1), 60.0,
                                   None) for i in range(1, 4)])
        got = h.wait(2.0, want=3)
        assert len(got) == 3 and h.in_flight() == 0
    finally:
        var.reset(token)
        h.shutdown()
    assert seen == ["the caller's"] * 3


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
    from drainer.drain.clock import ADAPT_SAMPLES

    jobs = FakeJobs()
    jobs.add("a", 3000)
    d = _drain(jobs, _registry(lambda job: None), depth=2)
    d.clock.rtt, d.clock.samples = 0.01, ADAPT_SAMPLES  # a database 10 ms away, measured
    d.clock.round_trip = lambda seconds: None  # type: ignore[method-assign]  # fakes answer at once
    # handlers of 20 us a job whatever the machine's load: measured under load, a job took
    # up to 1 ms now and then, the claims sized to it shrank, and a batch's successes
    # reached the shrunk claim's size while the batch was still handed over (written then)
    finish = d.clock.finish

    def finish_at_20us(now: float) -> None:
        finish(now)
        d.clock.per_job = 0.00002

    d.clock.finish = finish_at_20us  # type: ignore[method-assign]
    # nor does a batch of 512 "run slow" (over 0.1 s of the machine's time, which a loaded
    # machine takes to hand the fake jobs over): a slow batch reads its claims ahead out of
    # the socket and writes its successes alone, rightly, and that is another test's case
    d.clock.slow_now = lambda now: False  # type: ignore[method-assign]
    waiting: list[int] = []
    send = d.outcomes.send_ahead

    def send_ahead(claim: Any) -> None:
        waiting.append(len(d.pending))
        send(claim)

    d.outcomes.send_ahead = send_ahead  # type: ignore[method-assign]
    d.run()
    assert jobs.statuses() == {"done": 3000}
    assert d.report.succeeded == 3000
    assert max(d.claims.last_size, *(n for n in waiting)) > 10  # grown to the round trip
    assert any(n > 0 for n in waiting)  # sent with jobs still waiting to start
    # the successes went with the claims: a final write at most, not one per 10 jobs
    assert jobs.sent.count("complete_many") <= 1, [s for s in jobs.sent if s != "send"]
    assert not d.outcomes.ahead and jobs.in_flight == 0


def _timed_drain(jobs: FakeJobs, claim_rtt: float, per_job: float) -> tuple[Drain, list[int]]:
    """A pipelined drain whose clock has timed ADAPT_SAMPLES claims of ``claim_rtt`` and
    whose handlers take ``per_job`` (whatever the machine's load): the claims' sizes."""
    from drainer.drain.clock import ADAPT_SAMPLES

    d = _drain(jobs, _registry(lambda job: None), depth=2)
    d.clock.rtt, d.clock.samples = claim_rtt, ADAPT_SAMPLES
    d.clock.round_trip = lambda seconds: None  # type: ignore[method-assign]  # fakes answer at once
    finish = d.clock.finish

    def finish_at(now: float) -> None:
        finish(now)
        d.clock.per_job = per_job

    d.clock.finish = finish_at  # type: ignore[method-assign]
    sizes: list[int] = []
    send = jobs.send

    def sent(*args: Any, **kw: Any) -> None:
        sizes.append(args[3])
        send(*args, **kw)

    jobs.send = sent  # type: ignore[method-assign]
    return d, sizes


@pytest.mark.parametrize(("claim_rtt", "grown"), [(0.0004, 129), (0.005, 512)])
def test_a_local_database_grows_its_claims_to_the_work(claim_rtt: float, grown: int) -> None:
    """Locally (claims of 0.4 ms, no-op jobs of 25 us) and on a busy disk (claims of 5 ms,
    their commits waiting for the WAL flush) the claims grow as across a link, to 8 round
    trips of work, pipelined within half of MAX_CLAIM (they stayed at --batch-size)."""
    jobs = FakeJobs()
    jobs.add("a", 3000)
    d, sizes = _timed_drain(jobs, claim_rtt, 0.000025)
    d.run()
    assert jobs.statuses() == {"done": 3000} and d.report.succeeded == 3000
    assert sizes and max(sizes) == grown


def test_slow_handlers_keep_the_batch_size() -> None:
    """Jobs of 5 ms: a batch of --batch-size already runs for 8 claims of 3 ms."""
    jobs = FakeJobs()
    jobs.add("a", 30)
    d, sizes = _timed_drain(jobs, 0.003, 0.005)
    d.run()
    assert jobs.statuses() == {"done": 30} and sizes and max(sizes) == 10


def test_a_long_turn_of_the_event_loop_hands_back_its_outcomes_a_share_at_a_time() -> None:
    """600 tasks ending in one turn of the loop come back in lists of at most an eighth of
    the limit (the drain loop can send the claim that refills them while the turn goes
    on), and not one list a job."""
    from drainer.db import ClaimedRow
    from drainer.drain.calls import make_running
    from drainer.drain.execute import EventLoopThread
    from tests.unit.fake_statements import T0

    registry = Registry()

    @registry.task("a")
    async def handler(job: Job) -> None:
        return None  # ends in its first step: all 600 end in the same turn

    task = registry.tasks["a"]
    rs = [make_running(task, ClaimedRow(i, "a", {}, 1, 5, 0, T0, T0, 1), 60.0, None)
          for i in range(1, 601)]
    sizes: list[int] = []
    done = threading.Event()
    loop = EventLoopThread(1000, lambda: True)
    try:
        def back(outcomes: list[object]) -> None:
            sizes.append(len(outcomes))
            if sum(sizes) == len(rs):
                done.set()
        hold = threading.Event()  # every task is made before the first step runs
        loop.loop.call_soon_threadsafe(hold.wait, 5)
        loop.submit_many([(r, None) for r in rs], back)  # type: ignore[arg-type]
        hold.set()
        assert done.wait(5)
        assert max(sizes) <= 1000 // 8 and len(sizes) <= 600 // (1000 // 8) + 1, sizes
    finally:
        loop.shutdown()


def test_wait_takes_what_is_queued_once_it_has_enough_not_what_keeps_coming() -> None:
    """With outcomes arriving as fast as they are taken (1,000 tasks ending a few a turn),
    wait() returns once it has ``want`` and what was queued then: taking until the queue
    ran empty would hold the drain loop and the refilling claim meanwhile."""
    import queue as queue_mod

    from drainer.db import ClaimedRow
    from drainer.drain.calls import Outcome, make_running
    from tests.unit.fake_statements import T0

    registry = _registry(lambda job: None)
    task = registry.tasks["a"]

    class Trickle:
        """A queue in which one more outcome has arrived each time one is taken."""

        def __init__(self, n: int) -> None:
            self.left = n
            self.taken = 0

        def _next(self) -> Outcome:
            if not self.left:
                raise queue_mod.Empty
            self.left -= 1
            self.taken += 1
            r = make_running(task, ClaimedRow(self.taken, "a", {}, 1, 5, 0, T0, T0, 1), 60.0,
                             None)
            return Outcome(r.job, task, True)

        def get(self, timeout: float | None = None) -> Outcome:
            return self._next()

        def get_nowait(self) -> Outcome:
            return self._next()

        def qsize(self) -> int:
            return 1 if self.left else 0

    h = Handlers(1000, 10, None, lambda: True)
    trickle = Trickle(10_000)
    h.done_q = trickle  # type: ignore[assignment]
    h.wait(0.05, want=250)
    assert 250 <= trickle.taken <= 251, trickle.taken


def test_with_nothing_running_the_claims_the_window_holds_go_out_together() -> None:
    """10 ms away, measured, nothing running (the first batch done): the next claims go
    out ahead together, the successes with the first, instead of one claim in step and
    the others once it is back; and claims in flight hold more than MAX_CLAIM jobs when
    the handlers run that many within half the clock's limit."""
    from drainer.drain.claims import MAX_CLAIM

    jobs = FakeJobs()
    jobs.add("a", 6000)
    d, sizes = _timed_drain(jobs, 0.01, 0.000005)  # 512 jobs run in 2.6 ms: 4 in flight
    d.claims.depth = 4
    in_flight: list[int] = []
    send = jobs.send

    def counted(*args: Any, **kw: Any) -> None:
        send(*args, **kw)
        in_flight.append(jobs.in_flight)

    jobs.send = counted  # type: ignore[method-assign]
    d.run()
    assert jobs.statuses() == {"done": 6000} and d.report.succeeded == 6000
    # in step: the first claim (nothing measured before it runs) and the last successes
    # with a claim that finds nothing (this loop has no end of the run to carry them);
    # every claim between went ahead
    assert [s for s in jobs.sent if s != "send"] == ["claim_batch", "complete_many_and_claim"]
    assert jobs.sent[-1] == "complete_many_and_claim"
    assert max(in_flight) >= 3
    assert max(in_flight) * max(sizes) > MAX_CLAIM
