"""CancelEvent: a threading.Event whose condition is made on first use."""

from __future__ import annotations

import threading
import time

from drainer.job import CancelEvent, Job


def test_behaves_as_an_event_across_threads() -> None:
    e = CancelEvent()
    assert isinstance(e, threading.Event) and not e.is_set()
    assert e.wait(0.01) is False
    waiters: list[bool] = []
    threads = [threading.Thread(target=lambda: waiters.append(e.wait(5))) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    e.set()
    for t in threads:
        t.join(5)
    assert waiters == [True] * 4 and e.is_set() and e.wait(0)
    e.clear()
    assert not e.is_set() and e.wait(0.01) is False


def test_a_job_gets_its_own_and_makes_no_condition_until_used() -> None:
    a, b = Job(1, "q", {}, 1, 5, None), Job(2, "q", {}, 1, 5, None)
    assert a.cancelled is not b.cancelled
    assert isinstance(a.cancelled, CancelEvent) and a.cancelled._lazy_cond is None
    assert not a.cancelled.is_set() and a.cancelled._lazy_cond is None
    a.cancelled.set()
    assert a.cancelled.is_set() and not b.cancelled.is_set()
