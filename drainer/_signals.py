"""SIGTERM and SIGINT while a command runs: one way to install and restore the handlers."""

from __future__ import annotations

import logging
import queue
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def on_stop_signals(handler: Callable[[str], None]) -> Iterator[None]:
    """Call ``handler(signal_name)`` on SIGTERM/SIGINT inside the block; restore after.

    ``handler`` runs on a thread of the block's own, one signal after the other, not in
    the signal handler: Python runs a signal handler in the main thread between two of its
    bytecodes, possibly while that thread holds a lock the handler wants. The main thread
    waiting in ``stop.wait()`` holds the event's lock for a moment each time it wakes,
    that lock is not reentrant, and ``stop.set()`` takes it: a signal in that moment hung
    the process for good (CPython issue 126434 is the same deadlock in
    ``multiprocessing.Event``). The signal handler only puts the signal's name on a
    :class:`queue.SimpleQueue`, whose ``put`` is reentrant.

    Off the main thread (where Python cannot install handlers) it does nothing, so the
    library functions that use it stay callable from any thread.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    names: queue.SimpleQueue[str | None] = queue.SimpleQueue()

    def dispatch() -> None:
        while (name := names.get()) is not None:
            try:
                handler(name)
            except Exception:  # the next signal must still be handled
                logger.exception("handling %s failed", name)

    def on_signal(signum: int, frame: Any) -> None:
        names.put(signal.Signals(signum).name)

    thread = threading.Thread(target=dispatch, name="drainer-signals", daemon=True)
    thread.start()
    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        names.put(None)  # after the signals queued before it
        thread.join()


@contextmanager
def stop_on_signals(stop: threading.Event, first: Callable[[str], None],
                    again: Callable[[str], None] | None = None) -> Iterator[None]:
    """Inside the block, SIGTERM/SIGINT call ``first(name)`` and set ``stop``.

    A signal that comes when ``stop`` is already set calls ``again(name)`` instead (a
    second Ctrl-C that cuts a grace period short), or ``first`` again when none is given.
    Both run on :func:`on_stop_signals`' thread, never inside a signal handler.
    """

    def handler(name: str) -> None:
        if stop.is_set() and again is not None:
            again(name)
            return
        first(name)
        stop.set()

    with on_stop_signals(handler):
        yield
