"""``drainer serve``: an HTTP trigger that runs coalesced drains; no connection while idle."""

from __future__ import annotations

import contextlib
import hmac
import io
import json
import logging
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from drainer._redact import redact
from drainer.errors import ConfigError, DrainerError

if TYPE_CHECKING:
    from drainer.settings import Settings

logger = logging.getLogger(__name__)

#: Largest request body accepted (POST /drain needs none); larger ones get 413.
MAX_BODY_BYTES = 16 * 1024
#: Oversized bodies up to this size are read and dropped so the client sees the 413
#: instead of a connection reset; beyond it the connection is closed at once.
DISCARD_LIMIT_BYTES = 1024 * 1024
#: Finished runs kept for GET /runs/<id>.
KEEP_RUNS = 100
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
#: Shortest DRAINER_TRIGGER_TOKEN serve and schedule --listen accept.
MIN_TOKEN_LENGTH = 16
#: Port when neither --port nor $PORT is given (Cloud Run's default).
DEFAULT_PORT = 8080

DrainFunc = Callable[[threading.Event], dict[str, Any]]

_requested = threading.local()


def requested_run_id() -> str | None:
    """Inside a drain that POST /drain started: the run_id it answered (the drain passes
    it to ``run_once(run_id=...)`` so that report, logs and rows carry the same id)."""
    value = getattr(_requested, "run_id", None)
    return value if isinstance(value, str) else None


@dataclass
class Run:
    """One drain requested through POST /drain."""

    id: str
    status: str = "queued"  # queued, running, done, error, cancelled
    requested_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    report: dict[str, Any] | None = None
    error: str | None = None
    exit_code: int | None = None
    finished: threading.Event = field(default_factory=threading.Event, repr=False)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run_id": self.id, "status": self.status,
                               "requested_at": _iso(self.requested_at),
                               "started_at": _iso(self.started_at),
                               "finished_at": _iso(self.finished_at)}
        if self.report is not None:
            out["report"] = self.report
        if self.error is not None:
            out["error"] = self.error
            out["exit_code"] = self.exit_code
        return out


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


class Closed(Exception):
    """The server is shutting down: no new drains."""


class Coalescer:
    """One drain running, at most one queued behind it; later triggers join the queued one.

    A trigger that arrives while a drain runs may be for a job committed after that
    drain's last claim, so it gets the queued drain (which starts when the running one
    ends); every trigger that arrives while one is queued joins it.
    """

    def __init__(self, drain: DrainFunc, keep: int = KEEP_RUNS,
                 on_request: Callable[[], None] | None = None) -> None:
        self._drain = drain
        self._on_request = on_request
        self._keep = keep
        self._lock = threading.Lock()
        self.running: Run | None = None
        self.queued: Run | None = None
        self._finished: OrderedDict[str, Run] = OrderedDict()
        self._thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.started = 0

    def request(self) -> tuple[Run, bool]:
        """The run that will serve this trigger, and whether it joined an existing one."""
        with self._lock:
            if self.stop.is_set():
                raise Closed()
            if self._on_request is not None:
                self._on_request()  # e.g. drainer schedule notes the trigger for its ticks
            if self.queued is not None:
                return self.queued, True
            run = Run(uuid.uuid4().hex[:12])
            if self.running is None:
                run.status = "running"
                self.running = run
                self._thread = threading.Thread(target=self._loop, args=(run,),
                                                name="drainer-serve-drain", daemon=True)
                self._thread.start()
            else:
                self.queued = run
            return run, False

    def get(self, run_id: str) -> Run | None:
        with self._lock:
            for run in (self.running, self.queued):
                if run is not None and run.id == run_id:
                    return run
            return self._finished.get(run_id)

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {"draining": self.running is not None, "queued": self.queued is not None,
                    "runs_started": self.started, "stopping": self.stop.is_set()}

    def _loop(self, run: Run | None) -> None:
        while run is not None:
            with self._lock:
                run.status = "running"
                run.started_at = time.time()
                self.started += 1
            logger.info("drain %s started", run.id, extra={"run_id": run.id})
            _requested.run_id = run.id
            try:
                report = self._drain(self.stop)
                report["run_id"] = run.id
                run.report = report
                run.status = "done"
            except DrainerError as exc:
                run.status, run.error, run.exit_code = "error", redact(str(exc)), exc.exit_code
            except Exception as exc:
                run.status = "error"
                run.error = redact(f"{type(exc).__name__}: {' '.join(str(exc).split())}")
                run.exit_code = 1
            run.finished_at = time.time()
            _requested.run_id = None
            if run.status == "done":
                logger.info("drain %s done", run.id, extra={"run_id": run.id,
                                                            "report": run.report})
            else:
                logger.error("drain %s failed: %s", run.id, run.error,
                             extra={"run_id": run.id})
            with self._lock:
                self._remember(run)
                run.finished.set()
                nxt = self.queued
                self.queued = None
                if nxt is not None and self.stop.is_set():
                    nxt.status = "cancelled"
                    nxt.finished_at = time.time()
                    self._remember(nxt)
                    nxt.finished.set()
                    nxt = None
                self.running = nxt
            run = nxt

    def _remember(self, run: Run) -> None:
        self._finished[run.id] = run
        while len(self._finished) > self._keep:
            self._finished.popitem(last=False)

    def shutdown(self, timeout: float | None = None) -> None:
        """No new drains; ask the running one to stop (finish or release); wait for it."""
        with self._lock:
            self.stop.set()
            queued, self.queued = self.queued, None
            if queued is not None:
                queued.status = "cancelled"
                queued.finished_at = time.time()
                self._remember(queued)
                queued.finished.set()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)


_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
         b"Content-Length: 39\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
         b'{"error": "too many open connections"}\n')


class _Conn:
    """One open connection's state, shared by its handler thread and the accepting thread:
    since when it waits for a request's headers (None: its headers are in), and whether
    the accepting thread evicted it to make room."""

    __slots__ = ("awaiting_since", "evicted", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.awaiting_since: float | None = time.monotonic()
        self.evicted = False


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 drops a burst of triggers' SYNs (clients then
    # retry after 1 s); a burst of producers committing at once is the normal case here.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], coalescer: Coalescer,
                 token: str | None, max_connections: int | None = None) -> None:
        super().__init__(address, _Handler)
        self.coalescer = coalescer
        self.expected = None if token is None else f"Bearer {token}".encode()
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
        with self._conns_lock:
            conn.awaiting_since = time.monotonic() if waiting else None

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


class _Handler(BaseHTTPRequestHandler):
    server: _Server
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

    def _authorized(self) -> bool:
        expected = self.server.expected
        if expected is None:
            return True
        given = self.headers.get("Authorization", "").encode("utf-8", "replace")
        return hmac.compare_digest(given, expected)

    def _read_body(self) -> bool:
        """Read (and drop) the body; False when a 4xx was sent instead."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            self._send(411, {"error": "send a Content-Length (chunked bodies are refused)"})
            return False
        raw = self.headers.get("Content-Length") or "0"
        try:
            length = int(raw)
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            self._send(400, {"error": "bad Content-Length"})
            return False
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            if length <= DISCARD_LIMIT_BYTES:
                self.rfile.read(length)
            self._send(413, {"error": f"body too large (at most {MAX_BODY_BYTES} bytes)"})
            return False
        if length:
            self.rfile.read(length)
        return True

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
                self._send(404, {"error": f"no such run (the last {KEEP_RUNS} are kept)"})
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
        if not self._read_body():
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


def drain_func(settings: Settings) -> DrainFunc:
    """The drain each POST /drain runs: :func:`drainer.drain.run_once` with the stop event."""

    def drain(stop: threading.Event) -> dict[str, Any]:
        from drainer.drain import run_once

        return run_once(settings, stop=stop, run_id=requested_run_id()).as_dict()

    return drain


def make_server(settings: Settings, host: str, port: int, *, token: str | None,
                drain: DrainFunc | None = None,
                on_request: Callable[[], None] | None = None) -> _Server:
    """The HTTP server, bound and ready for ``serve_forever`` (used by tests too).

    ``drainer schedule --listen`` uses it too, with its own ``drain`` (which waits for a
    scheduled run to end) and ``on_request`` (called under the coalescer's lock for every
    accepted POST /drain).
    """
    coalescer = Coalescer(drain or drain_func(settings), on_request=on_request)
    try:
        return _Server((host, port), coalescer, token)
    except OSError as exc:
        raise DrainerError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


class HttpHost:
    """The HTTP side of ``drainer serve`` and ``drainer schedule --listen``, one shutdown order.

    :meth:`start` serves a bound server on its own thread and logs where. Leaving the
    ``with`` block shuts down in this order: stop accepting requests and release the port,
    refuse new drains (a queued one is cancelled, the running one is asked to stop through
    its stop event), then wait up to ``grace`` + 60 s for the running drain to finish or
    release its jobs. :meth:`close` does the first part early, for a caller that has its
    own work to end before the wait (the scheduler's run in progress).
    """

    def __init__(self, server: _Server | None, *, name: str, grace: float = 0.0) -> None:
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


def serve_until(server: _Server, stop: threading.Event, *, grace: float, note: str,
                on_listening: Callable[[str, int], None] | None = None) -> int:
    """Serve POST /drain until ``stop`` is set, shut down in order; return drains started.

    The library form of ``drainer serve`` (no signal handlers installed: set ``stop``).
    """
    with HttpHost(server, name="drainer-serve-http", grace=grace) as http:
        http.start(note, on_listening)
        while not stop.wait(0.5):
            pass
    return http.started


def trigger_token(settings: Settings, no_auth: bool) -> str | None:
    """The bearer token POST /drain wants (None with --no-auth); ConfigError when unset."""
    token = settings.trigger_token.get_secret_value() if settings.trigger_token else None
    if not token and not no_auth:
        raise ConfigError("no trigger token: set DRAINER_TRIGGER_TOKEN (or --trigger-token), "
                          "or pass --no-auth when something in front authenticates")
    if no_auth:
        logger.warning("--no-auth: anyone who can reach this port can start drains")
        return None
    assert token is not None
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"DRAINER_TRIGGER_TOKEN is too short ({len(token)} characters): use "
                          f"at least {MIN_TOKEN_LENGTH}, e.g. python3 -c 'import secrets; "
                          "print(secrets.token_urlsafe(32))'")
    return token


def parse_listen(value: str, flag: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT``, ``[::1]:PORT`` or ``:PORT`` (all interfaces) -> (host, port)."""
    host, sep, port_s = value.rpartition(":")
    if not sep or not port_s.isascii() or not port_s.isdigit() or int(port_s) > 65535:
        raise ConfigError(f"{flag}: expected HOST:PORT (e.g. 127.0.0.1:8080), got {value!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port_s)
