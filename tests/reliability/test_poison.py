"""Poison jobs end ``failed`` after max_attempts with a useful last_error, and
the rest of the queue drains around them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings
from tests.conftest import finish
from tests.reliability._helpers import (
    jobs,
    runs_per_job,
    start_drainer,
    wait_for,
)

# queue -> (max_attempts, expected status, what last_error must say)
POISON = {
    "p_raise": (3, "failed", "RuntimeError: poison: always raises"),
    "p_hang": (2, "failed", "TimeoutError: handler exceeded its timeout of 0.5s"),
    "p_nul": (2, "failed", "ValueError: bad"),
    "p_unprintable": (2, "failed", "_Unprintable"),
    "p_sysexit": (2, "failed", "SystemExit: 9"),
    "p_base": (2, "failed", "_Fatal: poison: a BaseException that is no Exception"),
    # a return value is kept as the job's result: one no serialiser can handle
    # fails its job with a clear error, and poisons nothing else
    "p_returns_object": (2, "failed", "ResultError: the handler's return value is not "
                         "JSON-serialisable"),
}


def _unfinished(conn: psycopg.Connection[Any], schema: str) -> int:
    return sum(1 for r in jobs(conn, schema).values() if r["status"] in ("queued", "running"))


@pytest.mark.slow
def test_poison_jobs_fail_after_max_attempts_and_the_rest_drains(
    migrated: Settings, conn: psycopg.Connection[Any], pg_url: str, tmp_path: Path
) -> None:
    schema = migrated.schema_name
    specs = [JobSpec(q, {"kind": q}, max_attempts=m) for q, (m, _s, _e) in POISON.items()]
    specs += [JobSpec("rec", {"n": i}, max_attempts=1) for i in range(60)]
    enqueue_many(conn, specs, schema=schema)

    codes = []
    for _ in range(8):  # each run drains what is due; retries come back 20-40 ms later
        code, _out, err = finish(start_drainer(
            ["run-once", "--concurrency", "4", "--retry-base", "0.01", "--lease", "5"],
            pg_url=pg_url, schema=schema, log_dir=tmp_path), timeout=60)
        codes.append(code)
        assert code == 0, err[-3000:]
        assert "Traceback" not in "\n".join(
            json.loads(line).get("msg", "") for line in err.splitlines())
        if not _unfinished(conn, schema):
            break
        time.sleep(0.1)
    table = jobs(conn, schema)
    runs = runs_per_job(tmp_path)
    by_queue = {r["queue"]: r for r in table.values() if r["queue"] != "rec"}
    for queue, (max_attempts, status, error) in POISON.items():
        row = by_queue[queue]
        assert row["status"] == status, (queue, row)
        if status == "failed":
            assert row["attempts"] == max_attempts, (queue, row)
            assert runs[row["id"]] == max_attempts, (queue, runs[row["id"]])
            assert error in row["last_error"], (queue, row["last_error"])
            assert row["locked_until"] is None and row["finished_at"] is not None
        else:
            assert runs[row["id"]] == 1 and row["last_error"] is None
    rec = [r for r in table.values() if r["queue"] == "rec"]
    assert len(rec) == 60 and {(r["status"], r["attempts"]) for r in rec} == {("done", 1)}
    assert all(runs[r["id"]] == 1 for r in rec)
    print(f"\npoison: drained in {len(codes)} runs; last_error of p_nul: "
          f"{by_queue['p_nul']['last_error'].splitlines()[0]!r}")


@pytest.mark.slow
def test_handler_that_kills_its_process_fails_after_max_attempts(
    migrated: Settings, conn: psycopg.Connection[Any], pg_url: str, tmp_path: Path
) -> None:
    """os._exit in a handler takes the whole drainer down with it (exit 7): the first
    death is free (a claim proves no start), then the job is a suspect, charged at each
    claim, and the reaper gives up at max_attempts ('lease expired'): max_attempts + 1
    runs."""
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("p_exit", {}, max_attempts=2)] +
                 [JobSpec("rec", {"n": i}, max_attempts=3) for i in range(10)], schema=schema)
    args = ["run-once", "--queue", "p_exit", "--queue", "rec", "--lease", "1",
            "--batch-size", "1"]
    codes = []
    for _ in range(5):
        def expired() -> bool:
            return all(r["expired"] for r in jobs(conn, schema).values()
                       if r["status"] == "running")
        wait_for(expired, 10, "the dead drainer's leases to expire")
        code, _out, _err = finish(start_drainer(args, pg_url=pg_url, schema=schema,
                                               log_dir=tmp_path), timeout=60)
        codes.append(code)
        if code == 0:
            break
    assert codes == [7, 7, 7, 0], codes
    table = jobs(conn, schema)
    (poison,) = [r for r in table.values() if r["queue"] == "p_exit"]
    assert poison["status"] == "failed" and poison["attempts"] == 2
    assert poison["last_error"] == "lease expired"
    assert runs_per_job(tmp_path)[poison["id"]] == 3
    assert {r["status"] for r in table.values() if r["queue"] == "rec"} == {"done"}
