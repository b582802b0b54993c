"""serve's defences against slow and idle connections: a deadline on the request headers,
and a cap on open connections so 300 slow unauthenticated clients do not hold 300 threads;
at the cap a new connection takes the slot of the one waiting longest for its headers, so a
flood of them cannot lock out health checks."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest

from drainer import _http
from drainer._http import HttpHost
from drainer.serve import make_server


def _server(monkeypatch: pytest.MonkeyPatch, deadline: float) -> Any:
    monkeypatch.setattr(_http, "HEADER_DEADLINE_S", deadline)  # the HTTP side reads it
    return make_server(SimpleNamespace(), "127.0.0.1", 0, token="a-token-of-16-chars-or-more",
                       drain=lambda stop: {"claimed": 0})  # type: ignore[arg-type]


def _trickle(socks: list[socket.socket]) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.send(b"X")


def _healthz(port: int, timeout: float = 5) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=timeout) as resp:
        assert json.loads(resp.read())["status"] == "ok"
        return int(resp.status)


def test_300_slow_connections_do_not_hold_300_threads(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    server = _server(monkeypatch, deadline=3.0)
    with HttpHost(server, name="test-serve-limits") as http:
        _host, port = http.start("test")
        before = threading.active_count()
        socks = []
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"POST /drain HTTP/1.1\r\nHost: x\r\n")  # headers never finished
            socks.append(s)
        try:
            peak = before
            until = time.monotonic() + 2.0
            while time.monotonic() < until:  # trickle a header byte now and then
                _trickle(socks)
                peak = max(peak, threading.active_count())
                time.sleep(0.25)
            assert peak - before <= _http.MAX_CONNECTIONS + 2, (before, peak)
            # beyond the cap each one took the place of an older slow one
            assert server.refused + server.evicted >= 300 - _http.MAX_CONNECTIONS - 2
            # past the header deadline, the slow ones are cut off and their threads end
            until = time.monotonic() + 15
            while time.monotonic() < until and threading.active_count() > before + 2:
                _trickle(socks)
                time.sleep(0.25)
            assert threading.active_count() <= before + 2, threading.active_count()
            assert _healthz(port) == 200  # and the server still answers
        finally:
            for s in socks:
                s.close()


def test_the_header_deadline_is_total_not_per_read(monkeypatch: pytest.MonkeyPatch) -> None:
    server = _server(monkeypatch, deadline=1.5)
    with HttpHost(server, name="test-serve-deadline") as http:
        _host, port = http.start("test")
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        started = time.monotonic()
        s.sendall(b"GET /healthz HTTP/1.1\r\n")
        closed_after = None
        try:
            while time.monotonic() - started < 8:
                try:
                    s.sendall(b"X")  # a byte every 0.2 s: no single read waits long
                except OSError:
                    closed_after = time.monotonic() - started
                    break
                s.settimeout(0.2)
                try:
                    if s.recv(1024) == b"":
                        closed_after = time.monotonic() - started
                        break
                except (TimeoutError, BlockingIOError):
                    pass
        finally:
            s.close()
        assert closed_after is not None and closed_after < 4, closed_after
        assert _healthz(port) == 200


def test_100_slow_connections_do_not_lock_out_health_checks(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    server = _server(monkeypatch, deadline=10.0)  # the default header deadline
    with HttpHost(server, name="test-serve-flood") as http:
        _host, port = http.start("test")
        before = threading.active_count()
        socks = []
        try:
            for _ in range(100):
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
                socks.append(s)
            time.sleep(0.2)  # every slot is held by a slow one
            assert threading.active_count() - before <= _http.MAX_CONNECTIONS + 1
            for _ in range(3):  # while the flood is held, each check answers at once
                started = time.monotonic()
                assert _healthz(port, timeout=1.0) == 200
                assert time.monotonic() - started < 1.0
                peak = threading.active_count()
                assert peak - before <= _http.MAX_CONNECTIONS + 1, (before, peak)
            assert server.evicted >= 100 - _http.MAX_CONNECTIONS and server.refused == 0
            # the evicted ones were told why, then closed
            told = 0
            for s in socks[:100 - _http.MAX_CONNECTIONS]:
                s.settimeout(1.0)
                answer = s.recv(4096)
                told += answer.startswith(b"HTTP/1.1 503")
            assert told == 100 - _http.MAX_CONNECTIONS
        finally:
            for s in socks:
                s.close()


def test_a_connection_beyond_the_cap_gets_503_at_once(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    """Every slot held by a connection whose headers are in (a request being answered:
    here a POST /drain whose body never comes): nothing to evict, 503."""
    monkeypatch.setattr(_http, "MAX_CONNECTIONS", 2)
    server = _server(monkeypatch, deadline=5.0)
    assert server.max_connections == 2
    with HttpHost(server, name="test-serve-cap") as http:
        _host, port = http.start("test")
        held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
        for s in held:
            s.sendall(b"POST /drain HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                      b"a-token-of-16-chars-or-more\r\nContent-Length: 10\r\n\r\n")
        try:
            time.sleep(0.3)
            extra = socket.create_connection(("127.0.0.1", port), timeout=5)
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = extra.recv(4096)
            extra.close()
            assert answer.startswith(b"HTTP/1.1 503"), answer
            assert b"too many open connections" in answer
        finally:
            for s in held:
                s.close()
        time.sleep(0.5)
        assert _healthz(port) == 200


def _until_closed(s: socket.socket) -> bytes:
    """What the server sent until it closed (a refused request closes the connection)."""
    chunks = []
    while chunk := s.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("value", [b"0_0", b"+0", b" -0", b"\xd9\xa0", b"0x0", b"1e0", b""])
def test_a_content_length_of_anything_but_ascii_digits_is_refused(
        monkeypatch: pytest.MonkeyPatch, value: bytes) -> None:
    """Python's int() takes '0_0', '+0', ' -0' and other scripts' digits; HTTP's
    Content-Length is 1*DIGIT: a front proxy that reads it otherwise frames the body
    otherwise (request smuggling)."""
    server = _server(monkeypatch, deadline=5.0)
    with HttpHost(server, name="test-serve-length") as http:
        _host, port = http.start("test")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /drain HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                      b"a-token-of-16-chars-or-more\r\nContent-Length: " + value +
                      b"\r\n\r\n")
            answer = _until_closed(s)
        assert answer.split(b" ")[1] == b"400", answer
        assert b"bad Content-Length" in answer


def test_two_content_lengths_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    server = _server(monkeypatch, deadline=5.0)
    with HttpHost(server, name="test-serve-length2") as http:
        _host, port = http.start("test")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /drain HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                      b"a-token-of-16-chars-or-more\r\nContent-Length: 0\r\n"
                      b"Content-Length: 5\r\n\r\n")
            answer = _until_closed(s)
        assert answer.split(b" ")[1] == b"400", answer
