"""App module of the hostile-outcome tests: handlers that hand back what the table refuses.

``hostile`` records its start (tests/apps/rel_jobs.record) and, when its payload says
``bad``, does one hostile thing: a follow-up with a NUL, a lone surrogate or an integer out
of range, or a follow-up appended past ``job.enqueue``'s checks. The ``retry_*`` tasks fail
with a retry policy no interval can hold. ``forks`` forks and returns in both processes.
"""

from __future__ import annotations

import os
from typing import Any

from drainer import Job, Retry, task
from drainer.job import FollowUp
from tests.apps.rel_jobs import record

#: kind -> the follow-up's arguments (queue, payload, keyword arguments of job.enqueue)
BAD_FOLLOWUPS: dict[str, tuple[str, Any, dict[str, Any]]] = {
    "nul_in_payload": ("child", {"k": "a\x00b"}, {}),
    "nul_in_key": ("child", {"a\x00b": 1}, {}),
    "nul_in_queue": ("ch\x00ild", {}, {}),
    "nul_in_dedup_key": ("child", {}, {"dedup_key": "d\x00k"}),
    "lone_surrogate": ("child", {"k": "\udc80"}, {}),
    "huge_priority": ("child", {}, {"priority": 2**40}),
    "huge_max_attempts": ("child", {}, {"max_attempts": 2**40}),
    "nan": ("child", {"k": float("nan")}, {}),
}


@task("hostile")
def hostile(job: Job) -> None:
    record(job, "start")
    bad = (job.payload or {}).get("bad")
    if bad in BAD_FOLLOWUPS:
        queue, payload, kw = BAD_FOLLOWUPS[bad]
        job.enqueue(queue, payload, **kw)
    elif bad == "appended":  # past job.enqueue: straight into the list it fills
        job.followups.append(FollowUp("child", {"k": "a\x00b"}))
    else:
        job.enqueue("child", {"parent": job.id})


@task("child")
def child(job: Job) -> None:
    record(job, "start")


@task("retry_inf_cap", retry=Retry(base=3600, cap=float("inf")))
def retry_inf_cap(job: Job) -> None:
    record(job, "start")
    raise RuntimeError("fails, retried with an uncapped policy")


@task("retry_huge_base", retry=Retry(base=1e308))
def retry_huge_base(job: Job) -> None:
    record(job, "start")
    raise RuntimeError("fails, retried with a base no interval holds")


@task("forks")
def forks(job: Job) -> None:
    """Forks; the parent and the child both return (a handler that forgot the child)."""
    record(job, "start")
    os.fork()


@task("forks_async")
async def forks_async(job: Job) -> None:
    record(job, "start")
    os.fork()


@task("chaos", max_attempts=50)
def chaos(job: Job) -> None:
    """Records ``id fence attempt pid`` at its start (tests/reliability/test_chaos.py: no
    two runs under one fence), then works ``payload['sleep']`` seconds."""
    import time

    line = f"{job.id} {job.fence} {job.attempt} {os.getpid()}\n"
    os.write(_chaos_fd(), line.encode())
    time.sleep(float((job.payload or {}).get("sleep", 0)))


_chaos: list[int] = []


def _chaos_fd() -> int:
    if not _chaos:
        path = os.path.join(os.environ["REL_LOG_DIR"], f"chaos-{os.getpid()}.log")
        _chaos.append(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    return _chaos[0]
