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
    since = _since_start()
    return None if since is None else time.time() - since


def _since_start() -> float | None:
    """Seconds since this process started (Linux), or None.

    /proc/self/stat gives the start in clock ticks after boot; the boot is read from the
    same clock (CLOCK_BOOTTIME, which also counts a suspend, as the start time does), not
    from /proc/stat's btime: that is whole seconds, truncated, and put the start up to a
    second early (a 0.3 s start reported as 1.2 s)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            # the command name (field 2) may hold spaces and parentheses: fields after its ")"
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])  # field 22: starttime
        return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):  # no CLOCK_BOOTTIME: not Linux
        return None


def start_to_now_once() -> float | None:
    """Seconds from the process start to now, the first time this is asked in the process
    (None after, and where the OS does not say)."""
    if _REPORTED.is_set():
        return None
    _REPORTED.set()
    since = _since_start()
    return None if since is None else round(max(0.0, since), 3)
