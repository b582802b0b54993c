"""When the I/O benchmark's handlers ran: first start, last end, count; written at exit.

Imported by the handlers of every contender (drainer's and the peers' venv alike, so no
drainer import here). ``BENCH_IO_STAMPS`` names the file, ``BENCH_IO_SLEEP`` the seconds each
job waits (0.05 by default).
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time

SLEEP = float(os.environ.get("BENCH_IO_SLEEP", "0.05"))
_lock = threading.Lock()
_first = float("inf")
_last = float("-inf")
_count = 0
#: BENCH_IO_TRACE names a file for every start and end time (profiling the ramp and tail).
_TRACE = os.environ.get("BENCH_IO_TRACE")
_starts: list[float] = []
_ends: list[float] = []


def began() -> float:
    global _first
    now = time.time()
    if now < _first:
        with _lock:
            _first = min(_first, now)
    if _TRACE:
        _starts.append(now)
    return now


def ended() -> None:
    global _last, _count
    now = time.time()
    with _lock:
        _last = max(_last, now)
        _count += 1
    if _TRACE:
        _ends.append(now)


def _write() -> None:
    path = os.environ.get("BENCH_IO_STAMPS")
    if path and _count:
        with open(path, "w") as f:
            json.dump({"first": _first, "last": _last, "count": _count}, f)
    if _TRACE and _count:
        with open(_TRACE, "w") as f:
            json.dump({"starts": _starts, "ends": _ends}, f)


atexit.register(_write)
