"""When this process started, as the OS says: what a wake pays before its session opens
(the interpreter, the imports, the settings, the app), reported beside the session's time."""

from __future__ import annotations

import os
import threading
import time

#: Set once the process start has been reported: a worker's later runs do not repeat it.
_REPORTED = threading.Event()


def started_at() -> float | None:
    """The process start as a ``time.time()`` instant (Linux: /proc, to the clock tick, 10
    ms), or None where the OS does not say."""
    try:
        with open("/proc/self/stat", "rb") as f:
            # the command name (field 2) may hold spaces and parentheses: fields after its ")"
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def start_to_now_once() -> float | None:
    """Seconds from the process start to now, the first time this is asked in the process
    (None after, and where the OS does not say)."""
    if _REPORTED.is_set():
        return None
    _REPORTED.set()
    at = started_at()
    return None if at is None else round(max(0.0, time.time() - at), 3)
