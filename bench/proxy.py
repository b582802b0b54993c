"""A TCP delay proxy on loopback: a database across a network, on one machine.

    python -m bench.proxy --rtt 10 --listen 127.0.0.1:6543 --target 127.0.0.1:5432

Every byte is held for RTT/2 in each direction (byte order kept per connection and direction),
so a statement's round trip costs the RTT a client across a network pays; pipelined statements
overlap as they would there. A client's first bytes wait one more RTT: on loopback ``connect()``
returns at once, across a network the TCP handshake costs one round trip (``--no-handshake``
turns that off). Bounded: at most ``--max-connections`` at once (more are refused), at most
``--max-buffer`` bytes held per direction (reading pauses), and the command exits by itself after
``--idle-exit`` seconds without a connection or ``--max-seconds`` in all.

For each client connection it records the time from accept to close (when both directions are
closed, the server's socket included): the time a server session was held through the proxy,
i.e. what a serverless database bills as compute. It also counts the statements the client
sent (simple ``Query`` and extended-protocol ``Execute`` messages) and its ``Parse`` messages
(statements parsed); neither is counted once a session negotiates TLS. The command prints
one JSON line per closed connection and a summary at exit.

As a library::

    with DelayProxy(10, target=("127.0.0.1", 5432)) as proxy:
        url = f"postgresql://postgres@{proxy.host}:{proxy.port}/postgres"
        ...
        proxy.settle()              # wait for the closes still in flight
        sessions = proxy.take()     # the connections recorded since the last take()
        held_seconds(sessions), compute_seconds(sessions)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from bench._loop import LoopThread, add_address_arguments

SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST, PROTOCOL_3 = 80877103, 80877104, 80877102, 196608
CHUNK = 65536


@dataclass
class Session:
    """One client connection through the proxy (times are ``time.monotonic()``)."""

    accepted: float
    closed: float | None = None
    statements: int = 0
    parses: int = 0  # Parse messages: statements parsed (unnamed each time, or prepared)
    bytes_up: int = 0
    bytes_down: int = 0
    counted: bool = True  # False once the session went to TLS (statements unknown)
    refused: bool = False

    @property
    def held(self) -> float:
        end = self.closed if self.closed is not None else time.monotonic()
        return end - self.accepted


def held_seconds(sessions: Iterable[Session]) -> float:
    """Session-seconds: the sum over connections of accept to close."""
    return sum(s.held for s in sessions if not s.refused)


def compute_seconds(sessions: Iterable[Session]) -> float:
    """Seconds during which at least one session was open (the union of their intervals)."""
    spans = sorted((s.accepted, s.accepted + s.held) for s in sessions if not s.refused)
    total, end = 0.0, float("-inf")
    for a, b in spans:
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


class _StatementCounter:
    """Counts Query and Execute messages (statements) and Parse messages in the frontend
    (client to server) byte stream."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.typed = False  # past the untyped start-up message
        self.head = bytearray()  # an incomplete message header
        self.skip = 0  # bytes of the current message body still to pass over

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view and self.session.counted:
            if self.skip:
                n = min(self.skip, len(view))
                self.skip -= n
                view = view[n:]
                continue
            want = 5 if self.typed else 8
            take = min(want - len(self.head), len(view))
            self.head += view[:take]
            view = view[take:]
            if len(self.head) < want:
                return
            if self.typed:
                kind, length = self.head[0], int.from_bytes(self.head[1:5], "big")
                if kind in (ord("Q"), ord("E")):
                    self.session.statements += 1
                elif kind == ord("P"):
                    self.session.parses += 1
                self.skip = max(0, length - 4)
            else:
                length = int.from_bytes(self.head[0:4], "big")
                code = int.from_bytes(self.head[4:8], "big")
                if not 8 <= length <= 100_000:
                    self.session.counted = False  # a TLS handshake, or not PostgreSQL
                    return
                if code == PROTOCOL_3:
                    self.typed = True
                elif code not in (SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST):
                    self.session.counted = False
                    return
                self.skip = length - 8
            self.head.clear()


class DelayProxy(LoopThread):
    """The proxy on its own event loop in a daemon thread; a context manager (see the module)."""

    name = "delay proxy"

    def __init__(self, rtt_ms: float, target: tuple[str, int] = ("127.0.0.1", 5432), *,
                 listen: tuple[str, int] = ("127.0.0.1", 0), handshake: bool = True,
                 max_connections: int = 500, max_buffer: int = 8 << 20,
                 idle_exit: float | None = None, max_seconds: float | None = None,
                 on_close: Callable[[Session], None] | None = None) -> None:
        super().__init__()
        self.rtt = rtt_ms / 1000.0
        self.target = target
        self.listen = listen
        self.handshake = handshake
        self.max_connections = max_connections
        self.max_buffer = max_buffer
        self.idle_exit = idle_exit
        self.max_seconds = max_seconds
        self.on_close = on_close
        self.host, self.port = listen
        self._sessions: list[Session] = []
        self._open = 0
        self._lock = threading.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the library face -------------------------------------------------------------------

    @property
    def open_connections(self) -> int:
        return self._open

    def sessions(self) -> list[Session]:
        with self._lock:
            return list(self._sessions)

    def take(self) -> list[Session]:
        """The connections recorded since the last take() (closed or not), and forget them."""
        with self._lock:
            out, self._sessions = self._sessions, []
        return out

    def settle(self, timeout: float = 5.0) -> bool:
        """Wait until no connection is open (closes travel RTT/2 too); False on timeout."""
        deadline = time.monotonic() + timeout
        while self._open and time.monotonic() < deadline:
            time.sleep(0.002)
        return self._open == 0

    # -- the proxy ---------------------------------------------------------------------------

    async def serve(self) -> None:
        """Listen until stop() or a limit; used by the thread and by the command."""
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._handle, *self.listen, backlog=1024)
        sock = server.sockets[0].getsockname()
        self.host, self.port = sock[0], sock[1]
        self._ready.set()
        started = last_busy = time.monotonic()
        try:
            while not self._stopping.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), 0.5)
                now = time.monotonic()
                if self._open:
                    last_busy = now
                if self.max_seconds is not None and now - started > self.max_seconds:
                    break
                if self.idle_exit is not None and now - last_busy > self.idle_exit:
                    break
        finally:
            server.close()
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        session = Session(accepted=time.monotonic())
        with self._lock:
            self._sessions.append(session)
        self._open += 1
        up_w: asyncio.StreamWriter | None = None
        try:
            if self._open > self.max_connections:
                session.refused = True
                return
            try:
                up_r, up_w = await asyncio.open_connection(*self.target)
            except OSError:
                return
            counter = _StatementCounter(session)
            not_before = session.accepted + (self.rtt if self.handshake else 0.0)
            pipes = [asyncio.ensure_future(self._pipe(reader, up_w, session, not_before,
                                                      counter)),
                     asyncio.ensure_future(self._pipe(up_r, writer, session, 0.0, None))]
            try:
                await asyncio.gather(*pipes)
            finally:
                for p in pipes:
                    p.cancel()
                await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            for w in (writer, up_w):
                if w is not None:
                    w.close()
                    with contextlib.suppress(Exception):
                        await w.wait_closed()
            session.closed = time.monotonic()
            self._open -= 1
            self._tasks.discard(task)
            if self.on_close is not None:
                self.on_close(session)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    session: Session, not_before: float,
                    counter: _StatementCounter | None) -> None:
        """Copy src to dst, each chunk delivered RTT/2 after it was read, in order."""
        half = self.rtt / 2
        held: collections.deque[tuple[float, bytes]] = collections.deque()
        arrived = asyncio.Event()
        room = asyncio.Event()
        buffered = 0

        async def deliver() -> None:
            nonlocal buffered
            while True:
                while not held:
                    arrived.clear()
                    await arrived.wait()
                due, data = held[0]
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                held.popleft()
                if not data:  # the end of the stream, due now
                    with contextlib.suppress(OSError, RuntimeError):
                        if dst.can_write_eof():
                            dst.write_eof()
                    return
                parts = [data]
                now = time.monotonic()
                while held and held[0][1] and held[0][0] <= now:
                    parts.append(held.popleft()[1])
                out = b"".join(parts)
                buffered -= len(out)
                room.set()
                dst.write(out)
                await dst.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                try:
                    data = await src.read(CHUNK)
                except OSError:
                    data = b""
                now = time.monotonic()
                held.append((max(now, not_before) + half, data))
                arrived.set()
                if not data:
                    break
                if counter is not None:
                    session.bytes_up += len(data)
                    counter.feed(data)
                else:
                    session.bytes_down += len(data)
                buffered += len(data)
                while buffered > self.max_buffer:
                    room.clear()
                    await room.wait()
            await sender
        except (OSError, ConnectionError):
            pass
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError, ConnectionError):
                await sender


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.proxy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rtt", type=float, required=True, help="Round-trip time to add, in ms.")
    add_address_arguments(p)
    p.add_argument("--no-handshake", dest="handshake", action="store_false",
                   help="Do not hold a client's first bytes for one more RTT.")
    p.add_argument("--max-connections", type=int, default=500)
    p.add_argument("--max-buffer", type=int, default=8 << 20, help="Bytes per direction.")
    p.add_argument("--idle-exit", type=float, default=600.0,
                   help="Exit after this many seconds without a connection [600].")
    p.add_argument("--max-seconds", type=float, default=6 * 3600.0,
                   help="Exit after this many seconds in all [21600].")
    args = p.parse_args(argv)
    started = time.monotonic()

    def closed(s: Session) -> None:
        line = {"accepted_s": round(s.accepted - started, 6), **asdict(s)}
        del line["accepted"], line["closed"]
        line["held_s"] = round(s.held, 6)
        print(json.dumps(line), flush=True)

    proxy = DelayProxy(args.rtt, args.target, listen=args.listen, handshake=args.handshake,
                       max_connections=args.max_connections, max_buffer=args.max_buffer,
                       idle_exit=args.idle_exit, max_seconds=args.max_seconds,
                       on_close=closed)

    async def run() -> None:
        task = asyncio.ensure_future(proxy.serve())
        while not proxy._ready.is_set() and not task.done():
            await asyncio.sleep(0.01)
        sys.stderr.write(f"bench.proxy: {proxy.host}:{proxy.port} -> "
                         f"{args.target[0]}:{args.target[1]}, rtt {args.rtt:g} ms\n")
        sys.stderr.flush()
        await task

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    s = proxy.sessions()
    print(json.dumps({"connections": len(s), "held_s": round(held_seconds(s), 6),
                      "compute_s": round(compute_seconds(s), 6),
                      "statements": sum(x.statements for x in s),
                      "parses": sum(x.parses for x in s)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
