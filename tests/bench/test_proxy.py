"""bench.proxy adds the round trip it says, keeps bytes in order, and accounts held time."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from bench.proxy import DelayProxy, Session, compute_seconds, held_seconds

ROOT = Path(__file__).resolve().parent.parent.parent


def _target(pg_url: str) -> tuple[str, int]:
    parts = urlsplit(pg_url)
    return parts.hostname or "127.0.0.1", parts.port or 5432


def _via(pg_url: str, proxy: DelayProxy) -> str:
    parts = urlsplit(pg_url)
    user = f"{parts.username}@" if parts.username else ""
    return f"postgresql://{user}{proxy.host}:{proxy.port}{parts.path or '/postgres'}"


def test_a_round_trip_through_the_proxy_costs_the_rtt(pg_url: str) -> None:
    with DelayProxy(10, _target(pg_url)) as proxy:
        url = _via(pg_url, proxy)
        started = time.monotonic()
        with psycopg.connect(url, autocommit=True) as conn:
            trips = []
            for i in range(15):
                t = time.perf_counter()
                row = conn.execute("SELECT %s::int", [i]).fetchone()
                trips.append(time.perf_counter() - t)
                assert row == (i,)
            # a large reply comes back whole and in order
            big = conn.execute("SELECT string_agg(g::text, ',') FROM generate_series(1, 200000) g"
                               ).fetchone()
            assert big is not None
            assert big[0] == ",".join(str(g) for g in range(1, 200_001))
        ended = time.monotonic()
        assert proxy.settle()
        sessions = proxy.take()
    assert min(trips) >= 0.010, trips
    assert statistics.median(trips) < 0.025, trips
    assert len(sessions) == 1
    s = sessions[0]
    assert s.closed is not None and not s.refused
    # held from accept to close: the client's whole session, plus the close's way to the server
    assert ended - started - 0.005 <= s.held <= ended - started + 0.05, (s.held, ended - started)
    assert s.counted and s.statements == 16  # 15 + the large one (psycopg sends Execute)
    # psycopg parses a statement each time until a run prepares it (prepare_threshold 5),
    # none after: 15 runs of one statement and a large one are 5-7 Parse messages, not 16
    assert 5 <= s.parses <= 7, s.parses
    assert held_seconds(sessions) == compute_seconds(sessions) == s.held


def test_rtt_zero_adds_next_to_nothing_and_many_connections_work(pg_url: str) -> None:
    with DelayProxy(0, _target(pg_url)) as proxy:
        url = _via(pg_url, proxy)
        conns = [psycopg.connect(url, autocommit=True) for _ in range(20)]
        trips = []
        try:
            for c in conns:
                t = time.perf_counter()
                assert c.execute("SELECT 1").fetchone() == (1,)
                trips.append(time.perf_counter() - t)
        finally:
            for c in conns:
                c.close()
        assert statistics.median(trips) < 0.010, trips  # the median: the machine is shared
        assert proxy.settle()
        sessions = proxy.take()
        assert len(sessions) == 20 and all(s.closed is not None for s in sessions)
        assert proxy.take() == []


def test_held_time_accounting_of_overlapping_sessions() -> None:
    a = Session(accepted=10.0, closed=12.0)
    b = Session(accepted=11.0, closed=13.0)  # overlaps a
    c = Session(accepted=20.0, closed=20.5)  # alone
    d = Session(accepted=20.1, closed=20.2)  # inside c
    refused = Session(accepted=0.0, closed=100.0, refused=True)
    sessions = [a, b, c, d, refused]
    assert abs(held_seconds(sessions) - (2 + 2 + 0.5 + 0.1)) < 1e-9
    assert abs(compute_seconds(sessions) - (3 + 0.5)) < 1e-9


def test_a_connection_over_the_limit_is_refused(pg_url: str) -> None:
    with DelayProxy(0, _target(pg_url), max_connections=1) as proxy:
        url = _via(pg_url, proxy)
        with psycopg.connect(url, autocommit=True) as first:
            try:
                psycopg.connect(url, connect_timeout=3).close()
                raise AssertionError("a second connection got through")
            except psycopg.OperationalError:
                pass
            assert first.execute("SELECT 1").fetchone() == (1,)
        proxy.settle()
        sessions = proxy.take()
    assert [s.refused for s in sessions] == [False, True]


def test_the_command_proxies_and_stops_by_itself(pg_url: str) -> None:
    host, port = _target(pg_url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.proxy", "--rtt", "2", "--listen", "127.0.0.1:0",
         "--target", f"{host}:{port}", "--idle-exit", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # "bench.proxy: HOST:PORT -> ..."
        listen = line.split()[1]
        parts = urlsplit(pg_url)
        user = f"{parts.username}@" if parts.username else ""
        with psycopg.connect(f"postgresql://{user}{listen}{parts.path or '/postgres'}",
                             autocommit=True) as conn:
            assert conn.execute("SELECT 41 + 1").fetchone() == (42,)
        out, _err = proc.communicate(timeout=15)  # exits after 1 s without a connection
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    lines = [json.loads(x) for x in out.splitlines()]
    assert lines[0]["statements"] == 1 and lines[0]["held_s"] > 0.004
    assert lines[-1]["connections"] == 1
