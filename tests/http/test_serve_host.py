"""HttpHost and serve_until without a database: the shutdown order serve and
schedule --listen share (stop accepting, no new drains, wait for the running one)."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from types import SimpleNamespace
from typing import Any

from drainer._http import HttpHost
from drainer.serve import make_server, serve_until


def post(port: int, path: str = "/drain") -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.status, json.loads(resp.read())


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


def test_serve_until_shuts_down_in_order() -> None:
    started = threading.Event()
    seen: dict[str, Any] = {}

    def drain(stop: threading.Event) -> dict[str, Any]:
        started.set()
        assert stop.wait(10)  # asked to stop (release jobs, finish) by the shutdown
        seen["port_closed_before_the_drain_ended"] = refused(seen["port"])
        return {"claimed": 0}

    server = make_server(SimpleNamespace(), "127.0.0.1", 0, token=None,  # type: ignore[arg-type]
                         drain=drain)
    stop = threading.Event()
    bound = threading.Event()
    result: list[int] = []

    def on_listening(host: str, port: int) -> None:
        seen["port"] = port
        bound.set()

    t = threading.Thread(target=lambda: result.append(
        serve_until(server, stop, grace=0, note="test", on_listening=on_listening)))
    t.start()
    assert bound.wait(5)
    port = seen["port"]
    status, body = post(port)
    assert status == 202 and not body["coalesced"]
    assert started.wait(5)
    _, queued = post(port)  # queued behind the running drain
    stop.set()
    t.join(15)
    assert not t.is_alive() and result == [1]  # the queued drain never started
    assert seen["port_closed_before_the_drain_ended"] is True
    assert server.coalescer.get(queued["run_id"]).status == "cancelled"  # type: ignore[union-attr]
    assert refused(port)


def test_close_early_then_the_caller_ends_its_own_work_then_the_wait() -> None:
    order: list[str] = []
    release = threading.Event()

    def drain(stop: threading.Event) -> dict[str, Any]:
        release.wait(10)
        order.append("drain ended")
        return {}

    server = make_server(SimpleNamespace(), "127.0.0.1", 0, token=None,  # type: ignore[arg-type]
                         drain=drain)
    with HttpHost(server, name="t", grace=0) as http:
        _, port = http.start("test")
        post(port)
        http.close()
        order.append("closed")
        assert refused(port)
        http.close()  # again: nothing
        release.set()  # the caller's own shutdown (the scheduler's run) happens here
    order.append("exited")
    assert order == ["closed", "drain ended", "exited"]
    assert http.started == 1


def test_nothing_hosts_nothing() -> None:
    with HttpHost.nothing() as http:
        http.close()
    assert http.started == 0
