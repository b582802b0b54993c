"""A local HTTP server counting the drain-trigger POSTs it receives (the contrib tests)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Counter:
    def __init__(self) -> None:
        self.posts = 0
        self.lock = threading.Lock()
        self.url = ""

    def wait_for(self, n: int, timeout: float = 5.0) -> int:
        """The count once it reached ``n`` (or after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.posts >= n:
                    return self.posts
            time.sleep(0.01)
        return self.posts


@contextmanager
def counting_server() -> Iterator[Counter]:
    state = Counter()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with state.lock:
                state.posts += 1
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/drain"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
