"""The HTTP side of ``drainer serve``, ``drainer schedule --listen`` and ``drainer ui``: the
server and its defences (:class:`GuardedServer`: a cap on open connections that evicts the
slowest header sender; :class:`GuardedHandler`: a deadline on the request headers, bounded
bodies), the trigger's routes (POST /drain, GET /healthz, GET /runs/<id>) and
:class:`HttpHost`, its start and shutdown order. What a trigger does (the coalesced drains)
is in drainer/serve.py; the dashboard's routes are in drainer/ui/routes.py."""

from __future__ import annotations

import contextlib
import hmac
import io
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from drainer.serve import Coalescer

# logs as drainer.serve: to whoever reads the logs these lines are the trigger's (drainer
# serve, schedule --listen), and one logger name covers them all in a logging config
logger = logging.getLogger("drainer.serve")

#: Largest request body accepted (POST /drain needs none); larger ones get 413.
MAX_BODY_BYTES = 16 * 1024
#: Oversized bodies up to this size are read and dropped so the client sees the 413
#: instead of a connection reset; beyond it the connection is closed at once.
DISCARD_LIMIT_BYTES = 1024 * 1024
#: Seconds a client may take to send its request (socket timeout of each read).
REQUEST_TIMEOUT_S = 15.0
#: Seconds a client has to send the request line and all its headers, in total: a client
#: that trickles a byte at a time (slowloris) is cut off here, not after 15 s a byte.
HEADER_DEADLINE_S = 10.0
#: Connections served at once (one thread each). At the cap, a new connection takes the
#: place of the one that has waited longest for its request headers (a slow or idle
#: client: a flood of them cannot lock out health checks and triggers); when every open
#: connection has its headers in (requests being answered), it is answered 503 and closed
#: at once, without a thread, so slow or idle connections cannot pile up threads.
MAX_CONNECTIONS = 64
#: Seconds the accepting thread waits for an evicted connection's thread to end and free
#: its slot (it ends at once: its socket is shut down under its read).
EVICT_WAIT_S = 1.0


_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
         b"Content-Length: 39\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
         b'{"error": "too many open connections"}\n')


class Closed(Exception):
    """The server is shutting down: no new drains."""


class _Conn:
    """One open connection's state, shared by its handler thread and the accepting thread:
    since when it waits for a request's headers (None: its headers are in), and whether
    the accepting thread evicted it to make room."""

    __slots__ = ("awaiting_since", "evicted", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.awaiting_since: float | None = time.monotonic()
        self.evicted = False


class GuardedServer(ThreadingHTTPServer):
    """A threading HTTP server with at most ``max_connections`` open connections (see
    MAX_CONNECTIONS), for handlers derived from :class:`GuardedHandler`."""

    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 drops a burst of triggers' SYNs (clients then
    # retry after 1 s); a burst of producers committing at once is the normal case here.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[GuardedHandler],
                 max_connections: int | None = None) -> None:
        super().__init__(address, handler)
        self.max_connections = max_connections or MAX_CONNECTIONS
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._conns: dict[Any, _Conn] = {}
        self._conns_lock = threading.Lock()
        self.refused = 0
        self.evicted = 0

    def conn(self, request: Any) -> _Conn:
        """The state of an open connection (registered when it was accepted)."""
        with self._conns_lock:
            return self._conns[request]

    def awaiting_headers(self, conn: _Conn, waiting: bool) -> None:
        """The connection waits for a request's headers from now (a kept-alive one, once
        its last request was answered), or no longer. A new connection waits from its
        accept (the accepting thread's order), not from its thread's start: threads start
        in any order, and the connection that makes room at the cap is the one accepted
        first."""
        with self._conns_lock:
            if not waiting:
                conn.awaiting_since = None
            elif conn.awaiting_since is None:
                conn.awaiting_since = time.monotonic()

    def _evict_oldest_awaiting(self) -> bool:
        """Shut down the connection waiting longest for its request headers; False when
        every open connection has its headers in."""
        with self._conns_lock:
            waiting = [c for c in self._conns.values()
                       if c.awaiting_since is not None and not c.evicted]
            if not waiting:
                return False
            oldest = min(waiting, key=lambda c: c.awaiting_since or 0.0)
            oldest.evicted = True
        self.evicted += 1
        with contextlib.suppress(OSError):
            # it has written nothing since its last response: say why, then its read
            # returns at once and its thread ends
            oldest.sock.send(_BUSY, getattr(socket, "MSG_DONTWAIT", 0))
        with contextlib.suppress(OSError):
            oldest.sock.shutdown(socket.SHUT_RDWR)
        return True

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the connection while fewer than ``max_connections`` are open; at
        the cap, the slot of the connection waiting longest for its headers; else 503 and
        close, from the accepting thread (no thread started)."""
        if not self._slots.acquire(blocking=False) and not (
                self._evict_oldest_awaiting() and self._slots.acquire(timeout=EVICT_WAIT_S)):
            self.refused += 1
            try:
                request.setblocking(False)
                request.send(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        with self._conns_lock:
            self._conns[request] = _Conn(request)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.pop(request, None)
        self._slots.release()


class Server(GuardedServer):
    """The server of POST /drain: the guarded server with the trigger's routes."""

    def __init__(self, address: tuple[str, int], coalescer: Coalescer,
                 token: str | None, max_connections: int | None = None,
                 screen: Callable[[str], tuple[Any, ...] | None] | None = None) -> None:
        super().__init__(address, Handler, max_connections)
        self.coalescer = coalescer
        # what a POST /drain's query asks before its drain (tenant=: drainer/fleet/trigger.py)
        self.screen = screen
        self.expected = None if token is None else f"Bearer {token}".encode()


class _DeadlineReader(io.RawIOBase):
    """The socket's reads, each bounded by what is left until ``deadline`` (monotonic):
    a total limit on the request line and headers, however slowly they trickle in."""

    def __init__(self, sock: socket.socket, conn: _Conn) -> None:
        self.sock = sock
        self.conn = conn
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.conn.evicted:
            raise TimeoutError("evicted: the connection cap was reached")
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("request headers took too long")
            self.sock.settimeout(min(left, REQUEST_TIMEOUT_S))
        else:
            self.sock.settimeout(REQUEST_TIMEOUT_S)
        n = self.sock.recv_into(buffer)
        if self.conn.evicted:  # shut down under this read: not the client's end of stream
            raise TimeoutError("evicted: the connection cap was reached")
        return n


class GuardedHandler(BaseHTTPRequestHandler):
    """The request side of :class:`GuardedServer`: the header deadline, the per-read
    timeout, eviction at the connection cap, bounded bodies, JSON answers."""

    server: GuardedServer
    server_version = "drainer"
    sys_version = ""
    timeout = REQUEST_TIMEOUT_S  # a client that sends nothing does not hold a thread forever

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)

    def setup(self) -> None:
        super().setup()
        self._conn = self.server.conn(self.request)
        self._reader = _DeadlineReader(self.connection, self._conn)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        # the request line and headers of each request (also the next one on a kept-alive
        # connection) within HEADER_DEADLINE_S in total; a body gets the per-read timeout.
        # Until they are in, the connection may be evicted at the connection cap.
        self._reader.deadline = time.monotonic() + HEADER_DEADLINE_S
        self.server.awaiting_headers(self._conn, True)
        try:
            super().handle_one_request()
        except TimeoutError:
            self.close_connection = True

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self._reader.deadline = None  # the headers are in
        self.server.awaiting_headers(self._conn, False)
        return ok

    # -- responses --------------------------------------------------------------------------------
    def _send(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
              ) -> None:
        data = (json.dumps(body) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _read_body(self) -> bytes | None:
        """The request body (at most MAX_BODY_BYTES); None when a 4xx was sent instead."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            self._send(411, {"error": "send a Content-Length (chunked bodies are refused)"})
            return None
        given = self.headers.get_all("Content-Length") or ["0"]
        # 1*DIGIT, once (RFC 9110): int() also takes '0_0', '+0', '-0' and other scripts'
        # digits, which a proxy in front reads otherwise (a smuggled request)
        if len(given) != 1 or not (given[0].isascii() and given[0].isdigit()):
            self.close_connection = True
            self._send(400, {"error": "bad Content-Length"})
            return None
        length = int(given[0])
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            if length <= DISCARD_LIMIT_BYTES:
                self.rfile.read(length)
            self._send(413, {"error": f"body too large (at most {MAX_BODY_BYTES} bytes)"})
            return None
        return self.rfile.read(length) if length else b""


class Handler(GuardedHandler):
    """The trigger's routes: POST /drain, GET /healthz, GET /runs/<id>."""

    server: Server

    def _authorized(self) -> bool:
        expected = self.server.expected
        if expected is None:
            return True
        given = self.headers.get("Authorization", "").encode("utf-8", "replace")
        return hmac.compare_digest(given, expected)

    # -- routes -----------------------------------------------------------------------------------
    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/healthz":
            # Answered from the process: a health check that queried the database would
            # keep a suspendable compute awake.
            self._send(200, {"status": "ok", **self.server.coalescer.state()})
        elif path.startswith("/runs/"):
            if not self._authorized():
                self._unauthorized()
                return
            run = self.server.coalescer.get(path[len("/runs/"):])
            if run is None:
                keep = self.server.coalescer.keep
                self._send(404, {"error": f"no such run (the last {keep} are kept)"})
            else:
                self._send(200 if run.finished.is_set() else 202, run.as_dict())
        elif path == "/drain":
            self._send(405, {"error": "use POST /drain"}, {"Allow": "POST"})
        else:
            self._send(404, {"error": "not found"})

    do_HEAD = do_GET

    def do_POST(self) -> None:
        parts = urlsplit(self.path)
        if parts.path != "/drain":
            self.close_connection = True
            self._send(404, {"error": "not found"})
            return
        if not self._authorized():
            self._unauthorized()
            return
        if self._read_body() is None:
            return
        answer = None if self.server.screen is None else self.server.screen(parts.query)
        if answer is not None:
            self._send(*answer)
            return
        try:
            run, joined = self.server.coalescer.request()
        except Closed:
            self._send(503, {"error": "shutting down"}, {"Retry-After": "1"})
            return
        wait = parse_qs(parts.query).get("wait", ["0"])[-1].lower() in {"1", "true", "yes"}
        if wait:
            # For platforms that stop an instance's CPU (or the instance) once no request
            # is open: hold this request until the drain ends.
            run.finished.wait()
            self._send(200, run.as_dict())
            return
        self._send(202, {"run_id": run.id, "status": run.status, "coalesced": joined},
                   {"Location": f"/runs/{run.id}"})

    def do_PUT(self) -> None:
        self.close_connection = True
        self._send(404 if urlsplit(self.path).path != "/drain" else 405,
                   {"error": "not found"}, {"Allow": "POST"})

    do_DELETE = do_PATCH = do_PUT

    def _unauthorized(self) -> None:
        self.close_connection = True
        self._send(401, {"error": "missing or wrong bearer token"},
                   {"WWW-Authenticate": 'Bearer realm="drainer"'})


class HttpHost:
    """The HTTP side of ``drainer serve`` and ``drainer schedule --listen``, one shutdown order.

    :meth:`start` serves a bound server on its own thread and logs where. Leaving the
    ``with`` block shuts down in this order: stop accepting requests and release the port,
    refuse new drains (a queued one is cancelled, the running one is asked to stop through
    its stop event), then wait up to ``grace`` + 60 s for the running drain to finish or
    release its jobs. :meth:`close` does the first part early, for a caller that has its
    own work to end before the wait (the scheduler's run in progress).
    """

    def __init__(self, server: Server | None, *, name: str, grace: float = 0.0) -> None:
        self.server = server
        self._name = name
        self._wait_s = grace + 60
        self._closed = False

    @classmethod
    def nothing(cls) -> HttpHost:
        """A host with no server (``drainer schedule`` without ``--listen``)."""
        return cls(None, name="none")

    @property
    def started(self) -> int:
        """Drains started through POST /drain."""
        return 0 if self.server is None else self.server.coalescer.started

    def start(self, note: str, on_listening: Callable[[str, int], None] | None = None
              ) -> tuple[str, int]:
        """Serve on a thread; log ``listening on ...; <note>``; return the bound address."""
        assert self.server is not None
        host, port = self.server.server_address[:2]
        assert isinstance(host, str)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                         name=self._name, daemon=True).start()
        logger.info("listening on http://%s:%d (POST /drain, GET /healthz, GET /runs/<id>); "
                    "%s", host, port, note, extra={"port": port})
        if on_listening is not None:
            on_listening(host, port)
        return host, port

    def close(self) -> None:
        """Stop accepting, release the port, start no new drain (the running one goes on)."""
        if self.server is None or self._closed:
            return
        self._closed = True
        self.server.shutdown()
        self.server.server_close()
        self.server.coalescer.shutdown(timeout=0)

    def __enter__(self) -> HttpHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        if self.server is not None:
            self.server.coalescer.shutdown(timeout=self._wait_s)
