"""bench/awake_suspend.py: the least possible awake time, wasted resumes, latency."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from bench.awake_suspend import (
    HARD_WORKLOAD,
    LONG_WORKLOAD,
    Burst,
    Latency,
    due_instants,
    least_awake,
    union_seconds,
    wasted,
)
from bench.suspend import Period, Session


def test_union_merges_what_overlaps_and_clips_to_the_window() -> None:
    assert union_seconds([(0, 10), (5, 15), (30, 40)], 0, 100) == 25
    assert union_seconds([(0, 10), (5, 15), (30, 40)], 8, 35) == 12


def test_the_least_possible_groups_wakes_due_within_the_idle_timeout() -> None:
    """Two due instants 5 s apart are one wake at T = 20 ([0, 27] with a 2 s drain); one
    30 s later is another; the producer's session adds its own T."""
    due = [100.0, 105.0, 160.0]
    assert least_awake(due, [], 2.0, 20.0, 0, 1000) == pytest.approx(27 + 22)
    # a producer at 150-151 s: [150, 171] joins the wake at 160 ([160, 182])
    assert least_awake(due, [(150.0, 151.0)], 2.0, 20.0, 0, 1000) == pytest.approx(27 + 32)


def test_due_instants_follow_the_plan() -> None:
    start = datetime(2026, 1, 1, 0, 0, 30, tzinfo=timezone.utc).timestamp()
    burst = Burst("B", 0.1, 10, True, failing=2, delayed=3, delay=0.2)
    assert due_instants([burst], start, 100, 5) == [start + 10, start + 15, start + 30]
    # a recurring definition every 2 minutes: occurrences at :02:00 and :04:00 of a 300 s
    # window that starts at :00:30
    occurrences = [t for t in due_instants([], start, 300, 5, "*/2 * * * *")]
    assert [t - start for t in occurrences] == [90, 210]
    assert sum(b.jobs for b in HARD_WORKLOAD) == 620


def test_the_least_possible_for_long_handlers_is_the_claim_and_the_outcome_write() -> None:
    """10 handlers of 60 s enqueued at 10 s, T = 20: the compute is up for the claim (T
    after it) and for the outcomes when the handlers end (T after them), 40 s, and may
    sleep in between; handlers shorter than T keep it up from the claim to T after them."""
    start = 1000.0
    due = due_instants(LONG_WORKLOAD, start, 420, 5)
    assert [d - start for d in due] == pytest.approx([10, 70])
    assert least_awake(due, [], 0.0, 20.0, start, start + 420) == pytest.approx(40)
    short = Burst("L", 10 / 420, 10, True, sleep=5.0)
    assert least_awake(due_instants([short], start, 420, 5), [], 0.0, 20.0, start,
                       start + 420) == pytest.approx(25)


def test_a_resume_is_wasted_when_no_producer_and_no_handler_ran_in_it() -> None:
    producer = Session(1, 10.0, application_name="bench-producer")
    drainer = Session(2, 50.0, application_name="drainer")
    periods = [
        Period(0, 10.0, ready_at=11.0, suspended_at=40.0, cause="bench-producer",
               sessions=[producer]),
        Period(1, 50.0, ready_at=51.0, suspended_at=80.0, cause="drainer",
               sessions=[drainer]),  # a handler ran in it
        Period(2, 90.0, ready_at=91.0, suspended_at=120.0, cause="drainer",
               sessions=[drainer]),  # nothing ran: wasted
        Period(3, 200.0, ready_at=201.0, suspended_at=230.0, cause="drainer"),  # out of window
    ]
    attempts = [(52.0, 53.0)]
    assert [p.index for p in wasted(periods, attempts, [], 0, 150)] == [2]
    # without an attempt log, a job finished in the period makes it useful
    assert [p.index for p in wasted(periods, [], [95.0], 0, 150)] == [1]
    # a resume that writes the outcomes of handlers that ran while the compute slept
    # (their attempts ended before it) is not wasted either
    assert [p.index for p in wasted(periods, [(60.0, 89.0)], [91.5], 0, 150)] == []


def test_latency_median_p95_max() -> None:
    lat = Latency.of([float(x) for x in range(1, 101)])
    assert (lat.median, lat.p95, lat.max) == (50.5, 95.0, 100.0)
    assert Latency.of([]).text() == "—"
