"""Without a database: which claims charge an attempt, what a reaped job becomes, the fence
never repeats, the run_at range (the in-memory fake follows queries.sql; the real statements
are tested in tests/reliability/: test_charging.py, test_fencing.py, test_undecodable_rows.py)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from drainer.producer import check_run_at
from tests.unit.fake_statements import FakeJobs


def test_a_death_charges_no_job_that_was_not_a_suspect() -> None:
    jobs = FakeJobs()
    jobs.add("a", 5)
    rows = jobs.claim_batch("a", 5, 60.0, start_now=5, run_id="r1")
    assert [r.attempts for r in rows] == [1] * 5
    # started at once or not, a claim proves no start: nothing is charged for certain
    assert [jobs.rows[r.id].charged for r in rows] == [False] * 5
    assert {jobs.rows[r.id].run_id for r in rows} == {"r1"}
    jobs.reap()  # the drainer died: every lease expires
    assert [jobs.rows[r.id].attempts for r in rows] == [0] * 5
    assert all(jobs.rows[r.id].suspect for r in rows)


def test_a_suspect_runs_only_where_it_is_charged() -> None:
    jobs = FakeJobs()
    jobs.add("a", 3)
    jobs.claim_batch("a", 3, 60.0, start_now=1)
    jobs.reap()
    # sent ahead (start_now=0): suspects are left queued
    assert jobs.claim_batch("a", 3, 60.0, start_now=0) == []
    # in step: the head suspect is taken, and charged; the others wait for their turn
    (row,) = jobs.claim_batch("a", 3, 60.0, start_now=1)
    assert jobs.rows[row.id].charged and not jobs.rows[row.id].suspect


def test_a_job_that_kills_its_drainer_fails_after_at_most_max_attempts_plus_one_runs() -> None:
    jobs = FakeJobs()
    (poison,) = jobs.add("a", 1)
    jobs.rows[poison].max_attempts = 2
    runs = 0
    while jobs.rows[poison].status == "queued" and runs < 10:
        # first claimed uncharged (no suspect yet); a suspect only in step, charged
        assert jobs.claim_batch("a", 5, 60.0, start_now=0 if runs == 0 else 1)
        runs += 1
        jobs.reap()
    assert jobs.rows[poison].status == "failed" and runs <= 3


def test_the_fence_grows_at_every_claim_and_a_release_does_not_repeat_it() -> None:
    jobs = FakeJobs()
    (job_id,) = jobs.add("a", 1)
    (first,) = jobs.claim_batch("a", 1, 60.0)
    assert jobs.release_many([job_id], [first.fence]) == {job_id}
    (second,) = jobs.claim_batch("a", 1, 60.0)
    assert (first.attempts, second.attempts) == (1, 1)
    assert second.fence == first.fence + 1
    assert jobs.complete_many([job_id], [first.fence]) == set()  # the old token: nothing
    assert jobs.complete_many([job_id], [second.fence]) == {job_id}


@pytest.mark.parametrize("when", [datetime(1969, 12, 31, tzinfo=timezone.utc),
                                  datetime(9999, 6, 1, tzinfo=timezone.utc)])
def test_a_run_at_the_table_refuses_is_a_value_error(when: datetime) -> None:
    with pytest.raises(ValueError, match="run_at must be between 1970-01-01 and 9999-01-01"):
        check_run_at(when)


def test_a_run_at_in_range_passes() -> None:
    check_run_at(None)
    check_run_at(datetime(2030, 1, 1))  # naive: UTC
