"""bench.suspend applies the activity rules: what keeps the compute up, what it cuts, how it
resumes, and what its log says."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from bench.link import target_of, via
from bench.suspend import PROTOCOL_3, SSL_REQUEST, SuspendSimulator

ROOT = Path(__file__).resolve().parent.parent.parent
IDLE = 1.0
COLD = 0.6


@pytest.fixture
def sim(pg_url: str) -> Iterator[SuspendSimulator]:
    with SuspendSimulator(IDLE, COLD, target_of(pg_url)) as s:
        yield s


def _connect(pg_url: str, sim: SuspendSimulator, name: str) -> psycopg.Connection[Any]:
    return psycopg.connect(via(pg_url, sim), autocommit=True, application_name=name,
                           connect_timeout=10)


def _alive(conn: psycopg.Connection[Any]) -> bool:
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


def test_an_idle_connection_is_cut_after_the_idle_timeout(pg_url: str,
                                                          sim: SuspendSimulator) -> None:
    with _connect(pg_url, sim, "idler") as conn:
        conn.execute("SELECT 1")
        last = time.time()
        suspend = sim.wait_for("suspend", timeout=IDLE + 5)
        # (the client returns from the query a moment after the simulator saw it end)
        assert IDLE - 0.2 <= suspend.at - last <= IDLE + 1.0, suspend.at - last
        assert suspend.reason == "idle" and suspend.cut == 1
        assert suspend.cut_applications == ["idler"]
        assert not _alive(conn)
    assert sim.state == "suspended" and sim.open_connections == 0
    (session,) = sim.sessions()
    assert session.cut and session.closed is not None and session.statements == 1


def test_a_cut_is_a_tcp_reset(pg_url: str, sim: SuspendSimulator) -> None:
    """The client sees a reset (ECONNRESET), not an orderly end of stream."""
    user = (urlsplit(pg_url).username or "postgres").encode()
    with socket.create_connection((sim.host, sim.port), timeout=10) as s:
        s.sendall(struct.pack("!II", 8, SSL_REQUEST))
        assert s.recv(1) == b"N"  # the simulator refuses TLS itself, to read the protocol
        body = struct.pack("!I", PROTOCOL_3) + b"user\0" + user + b"\0database\0postgres\0\0"
        s.sendall(struct.pack("!I", len(body) + 4) + body)
        seen = b""
        while b"Z\0\0\0\x05I" not in seen:  # ReadyForQuery, idle
            chunk = s.recv(65536)
            assert chunk, seen
            seen += chunk
        sim.wait_for("suspend", timeout=IDLE + 5)
        with pytest.raises(ConnectionResetError):
            s.recv(1)


def test_a_query_longer_than_the_idle_timeout_is_not_cut(pg_url: str,
                                                         sim: SuspendSimulator) -> None:
    with _connect(pg_url, sim, "sleeper") as conn:
        conn.execute("SELECT pg_sleep(%s)", [IDLE * 2.5])
        assert not [e for e in sim.events() if e.kind == "suspend"]
        assert _alive(conn)
        ended = time.time()
        suspend = sim.wait_for("suspend", timeout=IDLE + 5)
    # idle from the query's end on (its last state change), not from its start
    assert suspend.at - ended >= IDLE - 0.3


def test_an_open_transaction_keeps_the_compute_awake(pg_url: str,
                                                     sim: SuspendSimulator) -> None:
    """Idle in transaction is activity: the session is not idle while its transaction is
    open, however long nothing is sent."""
    with _connect(pg_url, sim, "in-tx") as conn:
        with conn.transaction():
            conn.execute("SELECT 1")
            time.sleep(IDLE * 2.5)
            assert sim.state == "awake"
            conn.execute("SELECT 2")
        committed = time.time()
        suspend = sim.wait_for("suspend", timeout=IDLE + 5)
    assert suspend.at - committed >= IDLE - 0.3
    assert sim.resumes() == sim.periods()[:1]


def test_a_failed_transaction_keeps_the_compute_awake(pg_url: str,
                                                      sim: SuspendSimulator) -> None:
    """ReadyForQuery 'E' (in a failed transaction) is still in a transaction."""
    with _connect(pg_url, sim, "failed-tx") as conn:
        conn.autocommit = False
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        time.sleep(IDLE * 2)
        assert sim.state == "awake"
        conn.rollback()
        sim.wait_for("suspend", timeout=IDLE + 5)


def test_notifications_from_the_server_are_not_activity(pg_url: str,
                                                        sim: SuspendSimulator) -> None:
    """A LISTEN connection that only receives NOTIFYs is idle: it is cut after T."""
    channel = f"suspend_test_{id(sim)}"
    received: list[str] = []
    with _connect(pg_url, sim, "listener") as listener, \
            psycopg.connect(pg_url, autocommit=True) as direct:
        listener.execute(f"LISTEN {channel}")
        listened = time.time()
        stop = threading.Event()

        def notify() -> None:
            while not stop.wait(0.2):
                direct.execute("SELECT pg_notify(%s, 'ping')", [channel])

        t = threading.Thread(target=notify, daemon=True)
        t.start()
        try:
            with pytest.raises(psycopg.OperationalError):
                for n in listener.notifies(timeout=IDLE + 5):
                    received.append(n.payload)
        finally:
            stop.set()
            t.join(5)
        suspend = sim.wait_for("suspend", timeout=1)
    assert len(received) >= 2  # the notifications came through, and did not keep it up
    assert suspend.cut_applications == ["listener"]
    assert IDLE - 0.2 <= suspend.at - listened <= IDLE + 1.0


def test_a_connection_while_suspended_waits_the_cold_start(pg_url: str,
                                                           sim: SuspendSimulator) -> None:
    started = time.monotonic()
    with _connect(pg_url, sim, "first-wake") as conn:
        waited = time.monotonic() - started
        assert conn.execute("SELECT 41 + 1").fetchone() == (42,)
    assert COLD - 0.02 <= waited <= COLD + 1.0, waited
    sim.wait_for("suspend", timeout=IDLE + 5)
    # a connection that arrives while the compute resumes waits for that resume, not another
    threads, waits = [], {}

    def connect(name: str, delay: float) -> None:
        time.sleep(delay)
        t = time.monotonic()
        with _connect(pg_url, sim, name) as c:
            waits[name] = time.monotonic() - t
            c.execute("SELECT 1")

    for name, delay in (("second-wake", 0.0), ("joins-the-resume", COLD / 2)):
        threads.append(threading.Thread(target=connect, args=(name, delay)))
        threads[-1].start()
    for t in threads:
        t.join(10)
    assert COLD - 0.02 <= waits["second-wake"] <= COLD + 1.0, waits
    assert waits["joins-the-resume"] < waits["second-wake"], waits
    resumes = sim.resumes()
    assert [p.cause for p in resumes] == ["first-wake", "second-wake"]
    assert sorted(s.application_name for s in resumes[1].sessions) == [
        "joins-the-resume", "second-wake"]


def test_the_log_names_what_resumed_the_compute(pg_url: str, sim: SuspendSimulator) -> None:
    with _connect(pg_url, sim, "the-producer") as conn:
        conn.execute("SELECT 1")
    sim.wait_for("suspend", timeout=IDLE + COLD + 5)
    with _connect(pg_url, sim, "the-drainer") as conn:
        conn.execute("SELECT 1")
    sim.wait_for("suspend", count=2, timeout=IDLE + COLD + 5)
    kinds = [(e.kind, e.application_name) for e in sim.events()]
    assert kinds == [("resume", "the-producer"), ("awake", "the-producer"),
                     ("suspend", None), ("resume", "the-drainer"), ("awake", "the-drainer"),
                     ("suspend", None)]
    summary = sim.summary()
    assert summary["resumes"] == summary["suspends"] == 2
    assert summary["resumed_by"] == ["the-producer", "the-drainer"]
    # awake: from each wake to its suspend; the cold starts are counted apart
    periods = sim.periods()
    assert sim.awake_seconds() == pytest.approx(
        sum(p.suspended_at - p.ready_at for p in periods if p.suspended_at and p.ready_at))
    assert 2 * IDLE <= sim.awake_seconds() <= 2 * IDLE + 3
    assert sim.cold_seconds() == pytest.approx(2 * COLD, abs=0.3)


def test_a_forced_suspend_cuts_a_running_query(pg_url: str, sim: SuspendSimulator) -> None:
    """suspend_now(): a compute restart or a network cut, whatever the sessions do."""
    with _connect(pg_url, sim, "busy") as conn:
        timer = threading.Timer(0.3, sim.suspend_now)
        timer.start()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT pg_sleep(5)")
        timer.join()
    (suspend,) = [e for e in sim.events() if e.kind == "suspend"]
    assert suspend.reason == "forced" and suspend.cut_applications == ["busy"]
    assert sim.suspend_now() == 0  # already suspended


def test_a_simulator_started_awake_counts_no_resume(pg_url: str) -> None:
    with SuspendSimulator(IDLE, 5.0, target_of(pg_url), asleep=False) as s:
        started = time.monotonic()
        with _connect(pg_url, s, "no-wait") as conn:
            assert time.monotonic() - started < 5.0  # no cold start
            conn.execute("SELECT 1")
        s.wait_for("suspend", timeout=IDLE + 5)
        assert s.resumes() == [] and len(s.periods()) == 1


def test_the_command_prints_its_events_and_a_summary(pg_url: str) -> None:
    host, port = target_of(pg_url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.suspend", "--target", f"{host}:{port}", "--idle", "0.5",
         "--cold-start", "0.2", "--max-seconds", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()
        assert banner.startswith("bench.suspend: 127.0.0.1:"), banner
        listen = banner.split()[1]
        sim_port = int(listen.rsplit(":", 1)[1])
        user = urlsplit(pg_url).username or "postgres"
        with psycopg.connect(f"postgresql://{user}@127.0.0.1:{sim_port}/postgres",
                             application_name="cli-check", connect_timeout=10) as conn:
            conn.execute("SELECT 1")
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [e["event"] for e in lines[:-1]] == ["resume", "awake", "suspend"]
    assert lines[0]["application_name"] == "cli-check"
    assert lines[-1]["summary"]["resumes"] == 1
    assert lines[-1]["summary"]["resumed_by"] == ["cli-check"]
