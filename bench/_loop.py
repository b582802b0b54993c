"""A server on an asyncio event loop of its own, in a daemon thread: the library face of
bench/proxy.py and bench/suspend.py (a context manager that starts and stops it)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import TracebackType
    from typing import Self


class LoopThread:
    """Runs ``self.serve()`` on its own loop; ``serve`` sets ``_ready`` once it listens and
    returns when ``_stopping`` is set."""

    name = "bench-server"

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    async def serve(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._thread_main, name=self.name,
                                        daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error
        if not self._ready.is_set():
            raise RuntimeError(f"{self.name} did not start")

    def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(10)

    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self.serve())
        except BaseException as exc:  # handed to start()
            self._error = exc
            self._ready.set()
        finally:
            loop.close()


def address(text: str) -> tuple[str, int]:
    """HOST:PORT (or :PORT) of the command lines."""
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def add_address_arguments(p: argparse.ArgumentParser) -> None:
    """--listen and --target, as the proxy commands take them."""
    p.add_argument("--listen", type=address, default=("127.0.0.1", 0),
                   help="HOST:PORT to listen on [127.0.0.1:0, a free port, printed].")
    p.add_argument("--target", type=address, default=("127.0.0.1", 5432),
                   help="HOST:PORT of the server [127.0.0.1:5432].")
