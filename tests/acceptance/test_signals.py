"""drainer._signals in a process of its own: a signal that lands while the main thread
holds the stop event's lock still stops the run, and nothing hangs."""

from __future__ import annotations

import subprocess
import sys

# The main thread waiting in stop.wait() holds the event's (non-reentrant) lock for a moment
# each time it wakes; Python runs a signal handler between two bytecodes of that thread, so
# a handler that called stop.set() there would wait on a lock its own thread holds. Here the
# moment is made to last: raise_signal runs the Python handler before it returns. In a
# process of its own, since a handler that deadlocks hangs that process for good.
_SIGNAL_WHILE_THE_EVENT_IS_LOCKED = """
import signal, sys, threading
from drainer._signals import stop_on_signals
stop = threading.Event()
with stop_on_signals(stop, lambda name: print("first", name, flush=True)):
    with stop._cond:
        signal.raise_signal(signal.SIGINT)
    print("set" if stop.wait(10) else "not set", flush=True)
"""


def test_a_signal_while_the_main_thread_holds_the_stop_events_lock_does_not_hang() -> None:
    proc = subprocess.run([sys.executable, "-c", _SIGNAL_WHILE_THE_EVENT_IS_LOCKED],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["first SIGINT", "set"]
