"""SIGTERM and SIGINT while a command runs: one way to install and restore the handlers."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def on_stop_signals(handler: Callable[[str], None]) -> Iterator[None]:
    """Call ``handler(signal_name)`` on SIGTERM/SIGINT inside the block; restore after.

    Off the main thread (where Python cannot install handlers) it does nothing, so the
    library functions that use it stay callable from any thread.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, frame: Any) -> None:
        handler(signal.Signals(signum).name)

    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def stop_on_signals(stop: threading.Event, first: Callable[[str], None],
                    again: Callable[[str], None] | None = None) -> Iterator[None]:
    """Inside the block, SIGTERM/SIGINT call ``first(name)`` and set ``stop``.

    A signal that comes when ``stop`` is already set calls ``again(name)`` instead (a
    second Ctrl-C that cuts a grace period short), or ``first`` again when none is given.
    """

    def handler(name: str) -> None:
        if stop.is_set() and again is not None:
            again(name)
            return
        first(name)
        stop.set()

    with on_stop_signals(handler):
        yield
