"""JobSpec keeps the frozen dataclass behaviour; the batch JSON encoder is json.dumps."""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drainer.job import DEFAULT_MAX_ATTEMPTS
from drainer.producer import JobSpec
from drainer.producer._copy_text import json_encoder

# Text with every code point, lone surrogates included (json.dumps escapes them).
_TEXT = st.text(st.characters(blacklist_categories=()), max_size=12)
_SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63)
            | st.floats(allow_nan=True, allow_infinity=True) | _TEXT)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner)
                   | st.dictionaries(_TEXT | st.integers() | st.booleans() | st.none()
                                     | st.floats(allow_nan=False), inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=400)
@given(st.lists(_JSON, max_size=5))
def test_the_batch_encoder_writes_what_json_dumps_writes(payloads: list[Any]) -> None:
    encode = json_encoder()  # one encoder for the whole batch, as enqueue_many uses it
    assert [encode(p) for p in payloads] == [json.dumps(p) for p in payloads]


def _error(fn: Any, value: Any) -> tuple[type[BaseException], str]:
    with pytest.raises(Exception) as info:
        fn(value)
    return info.type, str(info.value)


@pytest.mark.parametrize("bad", [
    {1, 2}, {"a": [object()]}, {(1, 2): 1}, b"bytes", [1, {"x": complex(1, 2)}],
])
def test_the_batch_encoder_fails_as_json_dumps_does(bad: Any) -> None:
    assert _error(json_encoder(), bad) == _error(json.dumps, bad)


def test_the_batch_encoder_finds_circular_references_and_starts_clean() -> None:
    loop: list[Any] = []
    loop.append(loop)
    assert _error(json_encoder(), loop) == _error(json.dumps, loop)
    shared = {"a": 1}
    encode = json_encoder()  # the same object in many payloads is not a cycle
    assert [encode([shared, shared]) for _ in range(3)] == [json.dumps([shared, shared])] * 3
    assert encode(math.inf) == "Infinity" and encode("\u2603") == '"\\u2603"'


def test_jobspec_is_a_frozen_slots_dataclass() -> None:
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
    assert not hasattr(job, "__dict__")  # slots: one is built per job in bulk enqueues
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.payload = {}  # type: ignore[misc]
    match job:
        case JobSpec(queue, payload):
            assert (queue, payload) == ("q", {"a": 1})
    with pytest.raises(TypeError, match="payload"):
        JobSpec("q")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="bogus"):
        JobSpec(**{"queue": "q", "payload": 1, "bogus": 2})
