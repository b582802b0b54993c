"""App module of the reliability tests: handlers that record every execution in a file.

Each execution appends ``job_id attempt pid event`` lines to ``$REL_LOG_DIR/<pid>.log``
(one ``os.write`` of a short line on an O_APPEND file: lines from concurrent threads and
processes never interleave). Recording to files rather than the database keeps the
recorder independent of the drainer's connection, which some tests kill.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from drainer import Job, task

_DIR = os.environ.get("REL_LOG_DIR", "")
_fd_lock = threading.Lock()
_fd: int | None = None


def record(job: Job, event: str) -> None:
    global _fd
    if not _DIR:
        return
    with _fd_lock:
        if _fd is None:
            _fd = os.open(str(Path(_DIR) / f"{os.getpid()}.log"),
                          os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, f"{job.id} {job.attempt} {os.getpid()} {event}\n".encode())


def _sleep(seconds: float) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(min(0.02, max(0.0, until - time.monotonic())))


@task("rec")
def rec(job: Job) -> None:
    """Record a start, sleep ``payload['sleep']`` seconds (default 0), record an end."""
    record(job, "start")
    _sleep(float((job.payload or {}).get("sleep", 0)))
    record(job, "end")


@task("first_slow_then_fail")
def first_slow_then_fail(job: Job) -> None:
    """The first claim (fence 1) is slow and succeeds late; later claims fail at once."""
    record(job, "start")
    if job.fence == 1:
        _sleep(float(job.payload.get("sleep", 2)))
        record(job, "end")
        return
    record(job, "end")
    raise RuntimeError(f"new owner's verdict: claim {job.fence} failed")


# -- poison jobs ----------------------------------------------------------------------------------


@task("p_raise")
def p_raise(job: Job) -> None:
    record(job, "start")
    raise RuntimeError(f"poison: always raises (job {job.id})")


@task("p_hang", timeout=0.5)
def p_hang(job: Job) -> None:
    record(job, "start")
    _sleep(30)  # ignores job.cancelled on purpose


@task("p_nul")
def p_nul(job: Job) -> None:
    """Fails with an error text PostgreSQL cannot store as is (NUL byte, lone surrogate)."""
    record(job, "start")
    raise ValueError("bad\x00byte and \udc80 surrogate")


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ itself fails")


@task("p_unprintable")
def p_unprintable(job: Job) -> None:
    record(job, "start")
    raise _Unprintable()


@task("p_returns_object")
def p_returns_object(job: Job) -> object:
    """Returns something no serialiser can handle: its job fails with a clear error."""
    record(job, "start")
    return threading.Lock()


@task("p_sysexit")
def p_sysexit(job: Job) -> None:
    record(job, "start")
    raise SystemExit(9)


class _Fatal(BaseException):
    pass


@task("p_base")
def p_base(job: Job) -> None:
    record(job, "start")
    raise _Fatal("poison: a BaseException that is no Exception")


@task("p_exit")
def p_exit(job: Job) -> None:
    """Kills the whole drainer process, as a segfaulting C extension would."""
    record(job, "start")
    os._exit(7)
