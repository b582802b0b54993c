"""A suspend simulator: a compute that suspends after T seconds without activity, on loopback.

    python -m bench.suspend --listen 127.0.0.1:6544 --target 127.0.0.1:5432 --idle 20 \\
        --cold-start 1.5

A TCP proxy in front of PostgreSQL that applies the activity rules of 'Postgres as a job
queue' (and Neon's, Aurora's): bytes from a client are activity; a session running a query
or inside a transaction is activity for as long as it is so (tracked from the protocol: a
client message that starts work, up to the server's ReadyForQuery, whose status byte 'T' or
'E' says the session is still in a transaction); an idle connection counts as of its last
state change only; bytes the server sends on its own (NOTIFY, ParameterStatus, notices)
are not activity. After ``idle`` seconds without activity the compute suspends: every
client connection is cut abruptly (a TCP reset: SO_LINGER 0) and its server connection
closed, so open sessions are gone as when a real compute stops. While suspended, a new
connection is read up to its StartupMessage (whose application_name names the resume's
cause), then held for ``cold_start`` seconds (the resume), then forwarded; connections that
arrive while the compute resumes wait for the same resume.

The simulator answers SSLRequest and GSSENCRequest with 'N' itself (it must read the
protocol, so sessions go unencrypted; a client with sslmode=require cannot connect).
CancelRequest connections are forwarded as they are.

As a library::

    with SuspendSimulator(idle=2, cold_start=1, target=("127.0.0.1", 5432)) as sim:
        url = f"postgresql://postgres@{sim.host}:{sim.port}/postgres"
        ...
        sim.events()               # resumes, wakes and suspends, with times and causes
        sim.periods()              # the awake periods, each with its sessions
        sim.awake_seconds(), sim.resumes()
        sim.suspend_now()          # cut everything now (a pooler restart, a network blip)

Awake seconds are the compute's time up and serving: from the end of each resume's cold
start to its suspend (the cold starts are counted apart, :meth:`SuspendSimulator.cold_seconds`).
The command prints one JSON line per event and a summary when it ends (SIGINT, SIGTERM, or
``--max-seconds``). docs/suspend.md says what it models and what it does not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from bench._loop import LoopThread, add_address_arguments

SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST, PROTOCOL_3 = 80877103, 80877104, 80877102, 196608
CHUNK = 65536
#: How often the simulator looks for T seconds without activity (its monitor's resolution).
TICK_S = 0.02
#: Frontend messages after which the server owes one ReadyForQuery: simple Query, Sync,
#: FunctionCall.
_ANSWERED = frozenset(b"QSF")
#: Extended-protocol messages that start work the next Sync ends (Parse, Bind, Execute,
#: Describe, Close): the session is active from them on, as pg_stat_activity shows it.
_EXTENDED = frozenset(b"PBEDC")
#: A StartupMessage longer than this is not PostgreSQL (or it is TLS): the link is closed.
MAX_STARTUP_BYTES = 10_000


@dataclass
class Event:
    """One thing the compute did. ``kind``: ``resume`` (a connection arrived while suspended:
    the cold start begins), ``awake`` (the cold start is over), ``suspend`` (``reason``:
    ``idle`` after T seconds without activity, ``forced`` by :meth:`suspend_now`)."""

    kind: str
    at: float  # time.time()
    application_name: str | None = None  # a resume's cause
    reason: str | None = None
    cut: int = 0  # connections cut by a suspend
    cut_applications: list[str] = field(default_factory=list)
    period: int = 0


@dataclass
class Session:
    """One client connection (times are ``time.time()``)."""

    id: int
    accepted: float
    application_name: str = ""
    database: str = ""
    user: str = ""
    kind: str = "session"  # or "cancel"
    period: int | None = None  # the awake period it was forwarded in
    held_s: float = 0.0  # waiting for a resume before it was forwarded
    statements: int = 0  # simple Query and extended-protocol Execute messages
    closed: float | None = None
    cut: bool = False  # ended by a suspend


@dataclass
class Period:
    """One awake period: a resume (or the start, awake), then up until a suspend."""

    index: int
    resumed_at: float  # the resume began (for a simulator started awake: its start)
    ready_at: float | None = None  # the cold start was over
    suspended_at: float | None = None
    cause: str | None = None  # application_name of the connection that resumed it
    sessions: list[Session] = field(default_factory=list)

    def awake_seconds(self, start: float | None = None, end: float | None = None,
                      now: float | None = None) -> float:
        if self.ready_at is None:
            return 0.0
        a = self.ready_at if start is None else max(self.ready_at, start)
        b = self.suspended_at if self.suspended_at is not None else (
            now if now is not None else time.time())
        if end is not None:
            b = min(b, end)
        return max(0.0, b - a)


class _Messages:
    """Splits one direction of a protocol stream into messages without holding their
    bodies: :meth:`feed` returns (type, first body byte) of each message completed."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.kind = 0
        self.left = 0  # body bytes of the current message still to come
        self.first = b""

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        i, n = 0, len(data)
        while i < n:
            if self.left:
                take = min(self.left, n - i)
                if not self.first:
                    self.first = data[i:i + 1]
                self.left -= take
                i += take
                if not self.left:
                    out.append((self.kind, self.first))
                continue
            take = min(5 - len(self.head), n - i)
            self.head += data[i:i + take]
            i += take
            if len(self.head) < 5:
                break
            self.kind = self.head[0]
            self.left = max(0, int.from_bytes(self.head[1:5], "big") - 4)
            self.first = b""
            self.head.clear()
            if not self.left:
                out.append((self.kind, b""))
        return out


class _Link:
    """A forwarded connection's protocol state: whether its session is active."""

    def __init__(self, session: Session, client: asyncio.StreamWriter) -> None:
        self.session = session
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.owed = 1  # ReadyForQuery messages owed by the server (the start-up's first)
        self.unsynced = False  # extended-protocol work sent and not yet ended by a Sync
        self.status = b"I"  # the last ReadyForQuery's transaction status
        self.cut = False
        self.parsed = session.kind == "session"  # a cancel's bytes are passed on unread
        self._up = _Messages()
        self._down = _Messages()

    @property
    def busy(self) -> bool:
        """In a query or in a transaction: activity continuously (never idle)."""
        return self.parsed and (self.owed > 0 or self.unsynced or self.status in (b"T", b"E"))

    def client_sent(self, data: bytes) -> None:
        """Frontend messages (client to server): what starts work."""
        if not self.parsed:
            return
        for kind, _first in self._up.feed(data):
            if kind in _ANSWERED:
                self.owed += 1
                if kind == ord("S"):
                    self.unsynced = False
            elif kind in _EXTENDED:
                self.unsynced = True
            if kind in (ord("Q"), ord("E")):
                self.session.statements += 1

    def server_sent(self, data: bytes) -> bool:
        """Backend messages (server to client); True when the session just went idle."""
        if not self.parsed:
            return False
        was = self.busy
        for kind, first in self._down.feed(data):
            if kind == ord("Z"):
                self.owed = max(0, self.owed - 1)
                self.status = first
        return was and not self.busy


class SuspendSimulator(LoopThread):
    """The simulator on its own event loop in a daemon thread; a context manager (see the
    module)."""

    name = "suspend simulator"

    def __init__(self, idle: float, cold_start: float, target: tuple[str, int] = (
            "127.0.0.1", 5432), *, listen: tuple[str, int] = ("127.0.0.1", 0),
            asleep: bool = True, max_connections: int = 500,
            on_event: Callable[[Event], None] | None = None) -> None:
        super().__init__()
        if idle <= 0 or cold_start < 0:
            raise ValueError("idle must be > 0 and cold_start >= 0 seconds")
        self.idle = idle
        self.cold_start = cold_start
        self.target = target
        self.listen = listen
        self.max_connections = max_connections
        self.on_event = on_event
        self.host, self.port = listen
        self.state = "suspended" if asleep else "awake"
        self._asleep = asleep
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._periods: list[Period] = []
        self._sessions: list[Session] = []
        self._links: set[_Link] = set()
        self._last = time.monotonic()  # the last activity
        self._awake: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ids = 0

    # -- the library face -------------------------------------------------------------------

    def url(self, database: str = "postgres", user: str = "postgres") -> str:
        """A URL of ``database`` through the simulator."""
        return f"postgresql://{user}@{self.host}:{self.port}/{database}"

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def periods(self) -> list[Period]:
        with self._lock:
            return list(self._periods)

    def sessions(self) -> list[Session]:
        with self._lock:
            return list(self._sessions)

    def resumes(self, start: float | None = None, end: float | None = None) -> list[Period]:
        """The awake periods a resume began in [start, end] (time.time(); None: open)."""
        return [p for p in self.periods() if p.cause is not None
                and (start is None or p.resumed_at >= start)
                and (end is None or p.resumed_at <= end)]

    def awake_seconds(self, start: float | None = None, end: float | None = None) -> float:
        """Seconds up and serving within [start, end] (cold starts not included)."""
        now = time.time()
        return sum(p.awake_seconds(start, end, now) for p in self.periods())

    def cold_seconds(self, start: float | None = None, end: float | None = None) -> float:
        """Seconds spent resuming (cold starts) that began within [start, end]."""
        return sum((p.ready_at or time.time()) - p.resumed_at
                   for p in self.resumes(start, end))

    @property
    def open_connections(self) -> int:
        return len(self._links)

    def suspend_now(self, timeout: float = 5.0) -> int:
        """Suspend at once whatever the sessions are doing (a compute restart, a pooler
        cut, a network blip), cutting every connection; the number cut (0 if suspended)."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the simulator is not running")

        async def now() -> int:
            return self._suspend("forced") if self.state == "awake" else 0

        return asyncio.run_coroutine_threadsafe(now(), loop).result(timeout)

    def wait_for(self, kind: str, count: int = 1, timeout: float = 30.0) -> Event:
        """The ``count``-th event of ``kind`` (waits for it); AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            found = [e for e in self.events() if e.kind == kind]
            if len(found) >= count:
                return found[count - 1]
            if time.monotonic() > deadline:
                raise AssertionError(f"no {kind} event #{count} within {timeout:g} s: "
                                     f"{self.events()}")
            time.sleep(0.01)

    def suspends(self, start: float | None = None, end: float | None = None) -> list[Event]:
        """The suspend events in [start, end] (time.time(); None: open)."""
        return [e for e in self.events() if e.kind == "suspend"
                and (start is None or e.at >= start) and (end is None or e.at <= end)]

    def summary(self, start: float | None = None, end: float | None = None) -> dict[str, object]:
        """Counts over [start, end]: resumes, suspends, awake and cold-start seconds."""
        resumes = self.resumes(start, end)
        return {"resumes": len(resumes), "suspends": len(self.suspends(start, end)),
                "awake_s": round(self.awake_seconds(start, end), 3),
                "cold_start_s": round(self.cold_seconds(start, end), 3),
                "resumed_by": [p.cause for p in resumes]}

    # -- the event loop ----------------------------------------------------------------------

    async def serve(self, max_seconds: float | None = None) -> None:
        """Listen until stop() (or ``max_seconds``); used by the thread and by the command."""
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._awake = asyncio.Event()
        if not self._asleep:
            self._new_period(None, ready=True)
            self._awake.set()
        server = await asyncio.start_server(self._handle, *self.listen, backlog=1024)
        sock = server.sockets[0].getsockname()
        self.host, self.port = sock[0], sock[1]
        self._ready.set()
        started = time.monotonic()
        try:
            while not self._stopping.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), TICK_S)
                now = time.monotonic()
                if self.state == "awake" and now - self._last >= self.idle \
                        and not any(link.busy for link in self._links):
                    self._suspend("idle")
                if max_seconds is not None and now - started > max_seconds:
                    break
        finally:
            server.close()
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await server.wait_closed()

    def _emit(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)
        if self.on_event is not None:
            self.on_event(event)

    def _new_period(self, cause: str | None, ready: bool) -> Period:
        now = time.time()
        with self._lock:
            period = Period(index=len(self._periods), resumed_at=now, cause=cause,
                            ready_at=now if ready else None)
            self._periods.append(period)
        return period

    def _resume(self, session: Session) -> None:
        """A connection arrived while suspended: the cold start begins."""
        assert self._awake is not None and self._loop is not None
        self.state = "resuming"
        period = self._new_period(session.application_name, ready=False)
        self._emit(Event("resume", period.resumed_at, application_name=period.cause,
                         period=period.index))

        def awake() -> None:
            assert self._awake is not None
            period.ready_at = time.time()
            self.state = "awake"
            self._last = time.monotonic()
            self._awake.set()
            self._emit(Event("awake", period.ready_at, application_name=period.cause,
                             period=period.index))

        self._loop.call_later(self.cold_start, awake)

    def _suspend(self, reason: str) -> int:
        """Cut every connection (a reset to the client, a close to the server)."""
        assert self._awake is not None
        links = list(self._links)
        for link in links:
            link.cut = link.session.cut = True
            _reset(link.client)
            if link.server is not None:
                link.server.transport.abort()
        self.state = "suspended"
        self._awake.clear()
        now = time.time()
        period = self._periods[-1]
        period.suspended_at = now
        self._emit(Event("suspend", now, reason=reason, cut=len(links),
                         cut_applications=sorted(link.session.application_name
                                                 for link in links),
                         period=period.index))
        return len(links)

    # -- one connection -----------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._connection(reader, writer)
        except asyncio.CancelledError:
            pass  # stop(): asyncio logs a connection callback that ends cancelled
        finally:
            self._tasks.discard(task)

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        assert self._awake is not None
        self._ids += 1
        session = Session(id=self._ids, accepted=time.time())
        if self.state == "awake":
            self._last = time.monotonic()  # a new connection is activity
        link: _Link | None = None
        try:
            if len(self._links) >= self.max_connections:
                return
            startup = await self._startup(reader, writer, session)
            if startup is None:
                return
            with self._lock:
                self._sessions.append(session)
            if self.state == "suspended":
                self._resume(session)
            if not self._awake.is_set():
                waited = time.monotonic()
                await self._awake.wait()
                session.held_s = round(time.monotonic() - waited, 6)
            period = self._periods[-1]
            session.period = period.index
            with self._lock:
                period.sessions.append(session)
            link = _Link(session, writer)
            self._links.add(link)  # busy (the start-up owes a ReadyForQuery): no suspend now
            self._last = time.monotonic()
            try:
                up_r, up_w = await asyncio.open_connection(*self.target)
            except OSError:
                return
            link.server = up_w
            if link.cut:  # suspended while the server connection opened
                up_w.transport.abort()
                return
            up_w.write(startup)
            pipes = [asyncio.ensure_future(self._pipe(reader, up_w, link, upstream=True)),
                     asyncio.ensure_future(self._pipe(up_r, writer, link, upstream=False))]
            try:
                await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for p in pipes:
                    p.cancel()
                await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            if link is not None:
                self._links.discard(link)
                if link.server is not None:
                    link.server.close()
            if link is None or not link.cut:
                writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            session.closed = time.time()
            if self.state == "awake" and link is not None and not link.cut and link.busy:
                self._last = time.monotonic()  # a session that ended mid-work: its last change

    async def _startup(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       session: Session) -> bytes | None:
        """Read up to the StartupMessage (refusing TLS and GSS encryption with 'N'); its
        bytes, or a CancelRequest's; None when the client went away or is not PostgreSQL."""
        while True:
            try:
                head = await reader.readexactly(8)
            except (asyncio.IncompleteReadError, OSError):
                return None
            if self.state == "awake":
                self._last = time.monotonic()
            length, code = struct.unpack("!II", head)
            if code in (SSL_REQUEST, GSSENC_REQUEST) and length == 8:
                writer.write(b"N")
                await writer.drain()
                continue
            if not 8 <= length <= MAX_STARTUP_BYTES:
                return None
            try:
                body = await reader.readexactly(length - 8)
            except (asyncio.IncompleteReadError, OSError):
                return None
            if code == CANCEL_REQUEST:
                session.kind = "cancel"
                return head + body
            if code >> 16 != 3:
                return None
            params = body.split(b"\0")
            named = dict(zip(params[0::2], params[1::2], strict=False))
            session.application_name = named.get(b"application_name", b"").decode(
                "utf-8", "replace")
            session.user = named.get(b"user", b"").decode("utf-8", "replace")
            session.database = named.get(b"database", b"").decode("utf-8", "replace") \
                or session.user
            return head + body

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, link: _Link,
                    *, upstream: bool) -> None:
        """Copy src to dst, noting activity: client bytes are; a session going idle is its
        last state change; server bytes otherwise are not."""
        try:
            while True:
                data = await src.read(CHUNK)
                if not data or link.cut:
                    return
                if upstream:
                    self._last = time.monotonic()
                    link.client_sent(data)
                elif link.server_sent(data):
                    self._last = time.monotonic()
                dst.write(data)
                await dst.drain()
        except (OSError, ConnectionError, RuntimeError):
            return
        finally:
            if upstream and not link.cut:
                with contextlib.suppress(OSError, RuntimeError):
                    if dst.can_write_eof():
                        dst.write_eof()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0): the client sees ECONNRESET, as when a compute
    goes away, not an orderly end of stream."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.suspend", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_address_arguments(p)
    p.add_argument("--idle", type=float, required=True,
                   help="Seconds without activity before the compute suspends (fractions "
                   "allowed).")
    p.add_argument("--cold-start", type=float, default=1.5,
                   help="Seconds a connection waits while the compute resumes [1.5].")
    p.add_argument("--awake", action="store_true",
                   help="Start awake (by default the compute starts suspended).")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="Exit after this many seconds [never: until SIGINT or SIGTERM].")
    args = p.parse_args(argv)
    if args.idle <= 0 or args.cold_start < 0:
        p.error("--idle must be > 0 and --cold-start >= 0")
    started = time.time()

    def show(e: Event) -> None:
        line = {"event": e.kind, "at_s": round(e.at - started, 3), **asdict(e)}
        del line["kind"]
        print(json.dumps(line), flush=True)

    sim = SuspendSimulator(args.idle, args.cold_start, args.target, listen=args.listen,
                           asleep=not args.awake, on_event=show)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(sim.serve(args.max_seconds))

        def halt() -> None:
            if sim._stopping is not None:
                sim._stopping.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, halt)
        while not sim._ready.is_set() and not task.done():
            await asyncio.sleep(0.01)
        sys.stderr.write(f"bench.suspend: {sim.host}:{sim.port} -> {args.target[0]}:"
                         f"{args.target[1]}, idle {args.idle:g} s, cold start "
                         f"{args.cold_start:g} s, {sim.state}\n")
        sys.stderr.flush()
        await task

    try:
        asyncio.run(run())
    except OSError as exc:
        sys.stderr.write(f"bench.suspend: cannot listen on {args.listen[0]}:"
                         f"{args.listen[1]}: {exc}\n")
        return 2
    print(json.dumps({"summary": sim.summary(),
                      "sessions": len(sim.sessions())}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
