"""``drainer ui``'s server: :class:`~drainer.ui.routes.Dashboard` on drainer's guarded HTTP
server (drainer/_http.py: the connection cap, the header deadline and the bounded bodies of
``drainer serve``). The browser may keep its HTTP connection to the server alive between
two pages; that holds no database connection.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from drainer._http import GuardedHandler, GuardedServer
from drainer.errors import DrainerError
from drainer.ui.routes import Dashboard

logger = logging.getLogger("drainer.ui")


class UiHandler(GuardedHandler):
    server: UiServer

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)

    def _answer(self, body: bytes | None) -> None:
        started = time.monotonic()
        resp = self.server.dashboard.handle(self.command, self.path, self.headers, body)
        data_ = resp.body.encode("utf-8")
        self.send_response(resp.status)
        for k, v in resp.headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data_)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data_)
        logger.debug("%s %s %d in %.0f ms", self.command, urlsplit(self.path).path,
                     resp.status, (time.monotonic() - started) * 1000)

    def do_GET(self) -> None:
        self._answer(None)

    do_HEAD = do_GET

    def do_POST(self) -> None:
        body = self._read_body()
        if body is not None:
            self._answer(body)

    def do_PUT(self) -> None:
        self.close_connection = True
        self._send(405, {"error": "use GET, or POST from a page's form"}, {"Allow": "GET, POST"})

    do_DELETE = do_PATCH = do_PUT


class UiServer(GuardedServer):
    def __init__(self, address: tuple[str, int], dashboard: Dashboard,
                 max_connections: int | None = None) -> None:
        super().__init__(address, UiHandler, max_connections)
        self.dashboard = dashboard


def make_ui_server(dashboard: Dashboard, host: str, port: int) -> UiServer:
    """The bound server (port 0: a free one), ready for :func:`serve_ui`."""
    try:
        return UiServer((host, port), dashboard)
    except OSError as exc:
        raise DrainerError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def serve_ui(server: UiServer, stop: threading.Event) -> None:
    """Serve until ``stop`` is set; then stop accepting and release the port."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              name="drainer-ui-http", daemon=True)
    thread.start()
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
