"""Handlers that outlive the idle timeout, started by a trigger on a long-lived drainer
(``schedule --wake-policy known-work --listen`` and ``serve``): the compute wakes for the
claim and for the outcome write, and for nothing else; it sleeps while they work."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.suspend import SuspendSimulator
from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings
from tests.acceptance._proc import DrainerProcess
from tests.reliability._helpers import jobs
from tests.suspend.conftest import COLD_START_S, IDLE_S, url_through

pytestmark = pytest.mark.slow

TOKEN = "suspend-test-token"
#: each handler waits this long without touching the database: the compute suspends under it
HANDLER_S = 2.4 * IDLE_S
JOBS = 3

COMMANDS = {
    # ticks every T/2, as bench.awake runs it; no safety net within the test
    "known-work": ["schedule", "--wake-policy", "known-work", "--interval", f"{IDLE_S / 2:g}",
                   "--max-sleep", "1h", "--listen", "127.0.0.1:0"],
    "serve": ["serve", "--port", "0"],
}


def _post_drain(port: int) -> dict[str, Any]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("POST", "/drain?wait=true", headers={"Authorization": f"Bearer {TOKEN}"})
        r = c.getresponse()
        body: dict[str, Any] = json.loads(r.read() or b"{}")
        assert r.status == 200, (r.status, body)
        return body
    finally:
        c.close()


@pytest.mark.parametrize("contender", sorted(COMMANDS))
def test_a_triggered_drain_of_long_handlers_wakes_the_compute_for_the_claim_and_the_outcomes(
        contender: str, pg_url: str, schema: str, migrated: Settings,
        conn: psycopg.Connection[Any], sim: SuspendSimulator, tmp_path: Path) -> None:
    proc = DrainerProcess([*COMMANDS[contender], "--queue", "sleepy", "--concurrency",
                           str(JOBS)], pg_url=url_through(pg_url, sim), schema=schema,
                          DRAINER_APP="suspend_jobs", REL_LOG_DIR=str(tmp_path),
                          DRAINER_IDLE_TIMEOUT=f"{IDLE_S:g}", DRAINER_CONNECT_RETRIES="4",
                          DRAINER_TRIGGER_TOKEN=TOKEN)
    try:
        port = int(proc.wait_log("listening on")["port"])
        if contender == "known-work":  # its first tick drains once (it knows nothing yet)
            proc.wait_log("run took", timeout=30)
            sim.wait_for("suspend", timeout=30)
        # the producer, straight to the server (its own wake is not what is measured)
        enqueue_many(conn, [JobSpec("sleepy", {"sleep": HANDLER_S}) for _ in range(JOBS)],
                     schema=schema)
        t0 = time.time()
        run = _post_drain(port)
        assert run["report"]["succeeded"] == JOBS, run
        ended = time.time()
        # long enough for a wake that should not come (a tick, a lease, a heartbeat) to come
        time.sleep(3 * IDLE_S + COLD_START_S)
        t1 = time.time()
        assert {r["status"] for r in jobs(conn, schema).values()} == {"done"}
    finally:
        proc.kill()
    resumes = sim.resumes(t0, t1)
    # the claim's, and the outcome write's once the handlers ended: none while they worked,
    # none after
    assert [p.cause for p in resumes] == ["drainer", "drainer"], sim.events()
    claim, outcomes = resumes
    assert claim.suspended_at is not None and claim.suspended_at < outcomes.resumed_at
    assert outcomes.resumed_at >= claim.resumed_at + HANDLER_S - 0.5, sim.events()
    assert outcomes.resumed_at <= ended
    # up T after the claim and T after the outcomes (their statements take milliseconds)
    assert sim.awake_seconds(t0, t1) <= 2 * IDLE_S + 1.0, sim.events()
