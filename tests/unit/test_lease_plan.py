"""The heartbeat's plan against a declared idle timeout (drainer/drain/leases.py): a lease
is extended early only while the compute is up for a statement of the drain, else a third
of the lease before it ends; and whether a statement keeps the compute up (drain/link.py)."""

from __future__ import annotations

from datetime import datetime, timezone

from drainer.db import ClaimedRow
from drainer.drain.calls import Running, make_running
from drainer.drain.leases import heartbeat_interval, running_low
from drainer.drain.link import awake_within
from drainer.registry import Task

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _claimed(lease: float, at: float) -> Running:
    r = make_running(Task("a", lambda job: None), ClaimedRow(1, "a", {}, 1, 5, 0, T0, T0),
                     lease, None)
    r.lease_expires = at + lease
    return r


def test_a_lease_is_extended_early_only_while_the_compute_is_up() -> None:
    r = _claimed(300, at=0)
    # 150 s into a 300 s lease: below two thirds left, above one third
    assert running_low([r], 150, awake=True) == [r]
    assert running_low([r], 150, awake=False) == []  # would wake the compute for nothing yet
    assert running_low([r], 201, awake=False) == [r]  # a third left: time for a resume


def test_a_statement_keeps_the_compute_up_for_the_idle_timeout_less_a_margin() -> None:
    assert awake_within(100, 20, 117.9)
    assert not awake_within(100, 20, 118.1)  # the margin: a tenth of T (at least 0.5 s)
    assert awake_within(100, None, 10_000)  # not declared: the heartbeat as before


def test_the_heartbeat_looks_within_each_awake_time_and_before_a_third_is_left() -> None:
    assert heartbeat_interval([300]) == 100
    assert heartbeat_interval([300], 20) == 10  # half the idle timeout
    assert heartbeat_interval([30], 300) == 5  # half of a third of the lease
