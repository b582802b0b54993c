"""serve's coalescing, without a database: one drain running, at most one queued."""

from __future__ import annotations

import threading
from typing import Any

from drainer._http import Closed
from drainer.serve import Coalescer


class _Gate:
    """A fake drain that blocks until released, counting how often it ran."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = threading.Semaphore(0)
        self.release = threading.Semaphore(0)
        self.stops: list[threading.Event] = []

    def __call__(self, stop: threading.Event) -> dict[str, Any]:
        self.calls += 1
        self.stops.append(stop)
        self.entered.release()
        self.release.acquire()
        return {"claimed": self.calls}


def test_triggers_join_the_queued_drain() -> None:
    gate = _Gate()
    c = Coalescer(gate)
    first, joined = c.request()
    assert not joined and first.status == "running"
    assert gate.entered.acquire(timeout=5)
    second, joined = c.request()  # may be for a job the running drain already passed
    assert not joined and second.id != first.id and second.status == "queued"
    for _ in range(18):
        again, joined = c.request()
        assert joined and again is second
    gate.release.release()
    assert first.finished.wait(5)
    assert gate.entered.acquire(timeout=5)  # the queued drain started
    assert second.status == "running"
    third, joined = c.request()  # behind the now-running second drain
    assert not joined and third.id not in {first.id, second.id}
    gate.release.release()
    gate.release.release()
    assert third.finished.wait(5)
    assert gate.calls == 3
    assert [r.report for r in (first, second, third)] == [{"claimed": 1, "run_id": first.id},
                                                          {"claimed": 2, "run_id": second.id},
                                                          {"claimed": 3, "run_id": third.id}]
    assert c.get(first.id) is first and c.state()["runs_started"] == 3


def test_shutdown_stops_the_running_drain_and_cancels_the_queued_one() -> None:
    gate = _Gate()
    c = Coalescer(gate)
    running, _ = c.request()
    assert gate.entered.acquire(timeout=5)
    queued, _ = c.request()
    threading.Timer(0.2, gate.release.release).start()
    c.shutdown(timeout=5)
    assert gate.stops[0].is_set()  # run_once's stop event: finish or release in-flight jobs
    assert running.status == "done" and queued.status == "cancelled"
    assert gate.calls == 1
    try:
        c.request()
    except Closed:
        pass
    else:
        raise AssertionError("a stopping server accepted a drain")


def test_errors_are_recorded_and_the_next_drain_still_runs() -> None:
    from drainer.errors import DatabaseUnavailable

    calls = []

    def drain(stop: threading.Event) -> dict[str, Any]:
        calls.append(1)
        raise DatabaseUnavailable("database unreachable after 1 attempts: boom")

    c = Coalescer(drain)
    run, _ = c.request()
    assert run.finished.wait(5)
    assert run.status == "error" and run.exit_code == 3 and "unreachable" in (run.error or "")
    again, joined = c.request()
    assert not joined and again.finished.wait(5) and len(calls) == 2


def test_only_the_last_runs_are_kept() -> None:
    c = Coalescer(lambda stop: {}, keep=3)
    runs = []
    for _ in range(5):
        run, _ = c.request()
        assert run.finished.wait(5)
        runs.append(run)
    assert [c.get(r.id) is not None for r in runs] == [False, False, True, True, True]
