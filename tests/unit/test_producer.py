"""JobSpec keeps the frozen dataclass behaviour."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from drainer.producer import JobSpec
from drainer.settings import DEFAULT_MAX_ATTEMPTS


def test_jobspec_is_the_same_frozen_dataclass() -> None:
    job = JobSpec("q", {"a": 1}, None, 2)
    assert (job.queue, job.payload, job.run_at, job.priority, job.max_attempts,
            job.dedup_key) == ("q", {"a": 1}, None, 2, DEFAULT_MAX_ATTEMPTS, None)
    assert job == JobSpec(queue="q", payload={"a": 1}, priority=2)
    assert job != JobSpec("q", {"a": 1}, priority=3)
    assert hash(JobSpec("q", 1, dedup_key="k")) == hash(JobSpec("q", 1, dedup_key="k"))
    assert repr(job) == ("JobSpec(queue='q', payload={'a': 1}, run_at=None, priority=2, "
                         f"max_attempts={DEFAULT_MAX_ATTEMPTS}, dedup_key=None)")
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.queue = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del job.priority  # type: ignore[misc]
    assert dataclasses.replace(job, queue="r").queue == "r"
    assert dataclasses.asdict(job)["max_attempts"] == DEFAULT_MAX_ATTEMPTS
    assert [f.name for f in dataclasses.fields(JobSpec)] == [
        "queue", "payload", "run_at", "priority", "max_attempts", "dedup_key"]
    assert pickle.loads(pickle.dumps(job)) == job
    assert vars(job)["payload"] == {"a": 1}
    match job:
        case JobSpec(queue, payload):
            assert (queue, payload) == ("q", {"a": 1})
    with pytest.raises(TypeError, match="payload"):
        JobSpec("q")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="bogus"):
        JobSpec(**{"queue": "q", "payload": 1, "bogus": 2})
