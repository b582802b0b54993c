"""Per-queue limits: where max_running and rate_limit come from (operator row,
setting, task: in that order), the rate limit's window on a real PostgreSQL, and the
next slot as the queue's due time (the drain exits; the report says when)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer import Job, run_once
from drainer.cli.control import render_limits
from drainer.cli.status import render_status
from drainer.db import Queries
from drainer.errors import ConfigError
from drainer.ops import limit
from drainer.producer import JobSpec, enqueue_many
from drainer.queue_limits import Rate
from drainer.registry import Registry
from drainer.settings import Settings
from drainer.status import collect_status
from tests.conftest import ROOT, cli_env, make_settings


def control(s: Settings) -> sql.Identifier:
    return sql.Identifier(s.schema_name, f"{s.table}_queues")


def enqueue_n(conn: psycopg.Connection[Any], s: Settings, queue: str, n: int) -> None:
    enqueue_many(conn, [JobSpec(queue, {"n": i}) for i in range(n)], schema=s.schema_name)


def queries(s: Settings, conn: psycopg.Connection[Any]) -> Queries:
    return Queries(conn, s.schema_name, s.table)


# -- precedence: operator, then setting, then task ------------------------------------------------


def test_limits_come_from_operator_then_setting_then_task(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any]) -> None:
    @registry.task("a", max_running=5, rate_limit="100/m")
    def a(job: Job) -> None:
        pass

    @registry.task("b", max_running=5)
    def b(job: Job) -> None:
        pass

    report = run_once(migrated, registry=registry)
    assert report.limits == {
        "a": {"max_running": 5, "max_running_from": "task", "rate_limit": "100/m",
              "rate_limit_from": "task"},
        "b": {"max_running": 5, "max_running_from": "task", "rate_limit": None,
              "rate_limit_from": None}}
    s = migrated.model_copy(update={"max_running": ["a=2", "b=3"], "rate_limit": ["b=7/s"]})
    report = run_once(s, registry=registry)
    assert report.limits["a"]["max_running"] == 2
    assert report.limits["a"]["max_running_from"] == "setting"
    assert (report.limits["a"]["rate_limit"], report.limits["a"]["rate_limit_from"]) == \
        ("100/m", "task")
    assert report.limits["b"] == {"max_running": 3, "max_running_from": "setting",
                                  "rate_limit": "7/s", "rate_limit_from": "setting"}
    # the operator's row wins over both, limit by limit
    limit(migrated, ["a"], max_running=1)
    limit(migrated, ["b"], rate="1/h")
    report = run_once(s, registry=registry)
    assert report.limits["a"] == {"max_running": 1, "max_running_from": "operator",
                                  "rate_limit": "100/m", "rate_limit_from": "task"}
    assert report.limits["b"] == {"max_running": 3, "max_running_from": "setting",
                                  "rate_limit": "1/h", "rate_limit_from": "operator"}
    # cleared: the setting's applies again
    limit(migrated, ["a"], clear_max_running=True)
    limit(migrated, ["b"], clear_rate=True)
    report = run_once(s, registry=registry)
    assert report.limits["a"]["max_running_from"] == "setting"
    assert report.limits["b"]["rate_limit_from"] == "setting"


def test_operator_max_running_caps_the_claim(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any]) -> None:
    lock = threading.Lock()
    running = [0, 0]  # now, most at once

    @registry.task("cap", max_running=6)
    def cap(job: Job) -> None:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    enqueue_n(conn, migrated, "cap", 12)
    limit(migrated, ["cap"], max_running=2)
    # a concurrency-8 drain would run 6 at once (the task's cap); the operator's caps it at 2
    s = migrated.model_copy(update={"concurrency": 8, "batch_size": 8})
    report = run_once(s, registry=registry)
    assert report.succeeded == 12 and report.limits["cap"]["max_running"] == 2
    assert running[1] == 2


def test_setting_naming_an_unknown_or_transaction_queue_is_a_config_error(
        migrated: Settings, registry: Registry) -> None:
    @registry.task("known")
    def known(job: Job) -> None:
        pass

    @registry.task("tx", transaction=True)
    def tx(job: Job, conn: Any = None) -> None:
        pass

    with pytest.raises(ConfigError, match="'knwon' with no handler"):
        run_once(migrated.model_copy(update={"max_running": ["knwon=2"]}), registry=registry)
    with pytest.raises(ConfigError, match="transaction=True"):
        run_once(migrated.model_copy(update={"rate_limit": ["tx=1/s"]}), registry=registry)


def test_bad_setting_values_are_refused(pg_url: str, schema: str) -> None:
    for kw, match in (({"max_running": "a=0"}, "at least 1"),
                      ({"max_running": "a"}, "QUEUE=VALUE"),
                      ({"rate_limit": "a=10/fortnight"}, "not a rate limit"),
                      ({"rate_limit": "a=0/s"}, "count must be")):
        with pytest.raises(ConfigError, match=match):
            make_settings(pg_url, schema, **kw)
    s = make_settings(pg_url, schema, max_running="a=3, b=1", rate_limit=["c=10/m,d=5/30s"])
    assert s.max_running == ["a=3", "b=1"] and s.rate_limit == ["c=10/m", "d=5/30s"]


# -- the rate limit's window ---------------------------------------------------------------------


def test_rate_window_claims_at_most_count_and_says_when_the_next_slot_opens(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    enqueue_n(conn, migrated, "r", 10)
    q = queries(migrated, conn)
    rate = Rate(3, 60.0)
    # leases longer than the window: the claimed jobs' expiries come after the next slot
    # (a lease left running counts in next_due_at too)
    rows, next_at, limited = q.claim_batch_rated("r", 2, 600, None, rate)
    assert (len(rows), next_at, limited) == (2, None, 0)  # room left: no next slot
    rows2, next_at, limited = q.claim_batch_rated("r", 5, 600, None, rate)
    assert len(rows2) == 1 and limited == 7  # 1 slot left: the 7 other due jobs wait
    assert next_at is not None
    # the window is full until the first claim (of 2) is a period old
    first = conn.execute(sql.SQL("SELECT rate_at[1], rate_n FROM {} WHERE queue = 'r'")
                         .format(control(migrated))).fetchone()
    assert first is not None and first[1] == [2, 1]
    assert next_at == first[0] + timedelta(seconds=60)
    rows3, next_at3, limited3 = q.claim_batch_rated("r", 5, 600, None, rate)
    assert (rows3, next_at3, limited3) == ([], next_at, 7)
    # the queue's due jobs count as due at the next slot: nothing due now, next due then
    remaining, next_due = q.queue_summary(["r"])
    assert (remaining, next_due) == (0, next_at)


def test_rate_window_slides(migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    enqueue_n(conn, migrated, "r", 10)
    q = queries(migrated, conn)
    rate = Rate(2, 0.4)
    got = [len(q.claim_batch_rated("r", 5, 60, None, rate)[0]) for _ in range(3)]
    assert got == [2, 0, 0]
    time.sleep(0.45)
    assert len(q.claim_batch_rated("r", 5, 60, None, rate)[0]) == 2
    # the entries that left the window are dropped from the row
    n = conn.execute(sql.SQL("SELECT rate_n FROM {} WHERE queue = 'r'")
                     .format(control(migrated))).fetchone()
    assert n == ([2],)


def test_rate_and_max_running_together(migrated: Settings,
                                       conn: psycopg.Connection[Any]) -> None:
    enqueue_n(conn, migrated, "r", 10)
    q = queries(migrated, conn)
    rows, _, limited = q.claim_batch_rated("r", 5, 60, 2, Rate(100, 60))
    assert len(rows) == 2 and limited == 0  # the cap, not the rate
    rows, _, limited = q.claim_batch_rated("r", 5, 60, 2, Rate(100, 60))
    assert rows == [] and limited == 0


def test_rate_limited_drain_exits_and_reports_the_next_slot(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any]) -> None:
    started: list[float] = []

    @registry.task("api", rate_limit="3/h")
    def api(job: Job) -> None:
        started.append(time.monotonic())

    enqueue_n(conn, migrated, "api", 5)
    t0 = time.monotonic()
    report = run_once(migrated, registry=registry)
    assert time.monotonic() - t0 < 5  # it did not wait for the next slot
    assert (report.claimed, report.succeeded, report.rate_limited) == (3, 3, 2)
    assert report.remaining_due == 0  # the 2 left are due at the next slot, not now
    assert report.next_due_at is not None
    slot = datetime.fromisoformat(report.next_due_at)
    assert timedelta(minutes=59) < slot - datetime.now(timezone.utc) <= timedelta(hours=1)
    # the jobs themselves are untouched: queued, due, in their order
    rows = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE status = 'queued' AND "
                                "run_at <= now()").format(
        sql.Identifier(migrated.schema_name, migrated.table))).fetchone()
    assert rows == (2,)
    # status: the limit and the next slot
    st = collect_status(migrated)
    assert st["queue_limits"][0]["queue"] == "api"
    assert st["queue_limits"][0]["rate_next_at"] is not None
    # an operator raising the rate opens the window at once (the old next slot is dropped)
    limit(migrated, ["api"], rate="10/h")
    report = run_once(migrated, registry=registry)
    assert (report.succeeded, report.rate_limited) == (2, 0)
    assert report.limits["api"]["rate_limit_from"] == "operator"
    assert "api" in render_status(collect_status(migrated))


def test_rate_slot_within_retry_linger_is_waited_for(
        migrated: Settings, registry: Registry, conn: psycopg.Connection[Any]) -> None:
    @registry.task("api", rate_limit="2/0.5s")
    def api(job: Job) -> None:
        pass

    enqueue_n(conn, migrated, "api", 5)
    s = migrated.model_copy(update={"retry_linger": 2.0})
    report = run_once(s, registry=registry)
    assert report.succeeded == 5 and report.rate_limited == 0
    # claims of 2, 2 and 1 jobs: the third no sooner than two windows after the first
    assert report.duration_s >= 1.0 and 0 < report.lingered_s < 2.5


# -- several drainer processes -------------------------------------------------------------------

#: One drainer process: run-once again and again, as a waker would, until nothing is queued.
#: --retry-linger 1 lets a drain wait for its queue's next slot (0.5 s away at most) instead
#: of exiting, so four processes keep contending for every slot of the window.
RATED_LOOP = """
import json, time
from drainer import load_settings, run_once
settings = load_settings()
succeeded, until = 0, time.monotonic() + 60
while time.monotonic() < until:
    report = run_once(settings)
    succeeded += report.succeeded
    if not report.claimed and not report.remaining_due and report.next_due_at is None:
        break
print(json.dumps({"succeeded": succeeded}))
"""


def busiest_window(starts: list[float], period: float) -> int:
    """The most starts in any window [t, t + period) of the sorted start times."""
    most, j = 0, 0
    for i, t in enumerate(starts):
        while starts[j] <= t - period:
            j += 1
        most = max(most, i - j + 1)
    return most


def test_busiest_window_counts_a_sliding_window() -> None:
    assert busiest_window([0.0, 0.1, 0.2, 1.0, 1.05], 0.5) == 3
    assert busiest_window([0.0, 0.4, 0.5, 0.9], 0.5) == 2
    assert busiest_window([0.0, 0.4, 0.49, 0.5], 0.5) == 3


@pytest.mark.slow
def test_rate_limit_holds_across_four_drainer_processes(
        migrated: Settings, pg_url: str, conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    """3 jobs per 0.5 s, 4 processes x concurrency 8: the claims, on the database's clock
    as the guarantee says (the rate window's clock, read after the queue's claim lock, which
    a rated claim's lease starts from: read back from the lease), never number more than 3
    in any window of 0.5 s less 50 ms. (Taken from the transaction's now(), as the lease
    was, a claim that waited for the lock under a loaded CI machine counted from before its
    wait: 6 in a window.) The handlers' start times are not
    used: on a loaded machine a process may wait 0.1-0.2 s for a CPU between its claim and
    its handler (seen in CI beside the other test worker)."""
    jobs, count, period, slack = 18, 3, 0.5, 0.05
    enqueue_n(conn, migrated, "rated", jobs)
    log = tmp_path / "handlers.log"
    env = cli_env(pg_url, migrated.schema_name, RATED_LOG=str(log), DRAINER_APP="rated_jobs",
                  RATED_LIMIT=f"{count}/{period}s")
    env.update(DRAINER_CONCURRENCY="8", DRAINER_BATCH_SIZE="8", DRAINER_RETRY_LINGER="1")
    procs = [subprocess.Popen([sys.executable, "-c", RATED_LOOP], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for _ in range(4)]
    succeeded = 0
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        succeeded += json.loads(out)["succeeded"]
    lines = [line.split() for line in log.read_text().splitlines()]
    claims = sorted(float(c) for _kind, _t, _pid, _job, c in lines)
    assert succeeded == jobs == len(claims)
    assert busiest_window(claims, period - slack) <= count, claims
    assert busiest_window(claims, period - slack) == count  # the limit was reached
    # 18 jobs at 3 a window: at least 5 windows between the first and the last claim
    assert claims[-1] - claims[0] >= (jobs // count - 1) * period - slack
    assert len({pid for _k, _t, pid, _j, _c in lines}) >= 2, "shared between processes"
    cur = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE status = 'done'").format(
        sql.Identifier(migrated.schema_name, migrated.table)))
    assert cur.fetchone() == (jobs,)


# -- drainer limit ---------------------------------------------------------------------------------


def test_limit_from_the_command_line(migrated: Settings, pg_url: str) -> None:
    from tests.conftest import run_cli

    def cli(*args: str) -> Any:
        return run_cli(list(args), pg_url=pg_url, schema=migrated.schema_name)

    out = cli("limit", "emails", "sms", "--max-running", "3", "--rate", "10/m", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"limits": [
        {"queue": "emails", "max_running": 3, "rate_limit": "10/m"},
        {"queue": "sms", "max_running": 3, "rate_limit": "10/m"}],
        "never_seen": ["emails", "sms"]}
    assert "sms: max_running 3, rate -" in render_limits(
        limit(migrated, ["sms"], clear_rate=True))
    report = limit(migrated, ["emails"])  # no option: as they are
    assert "emails: max_running 3, rate 10/m" in render_limits(report)
    out = cli("status", "--json")
    limits = {e["queue"]: e for e in json.loads(out.stdout)["queue_limits"]}
    assert limits["emails"]["rate_limit"] == "10/m"
    assert limits["emails"]["max_running_from"] == "operator"
    assert "limits emails: max_running 3 (operator); rate 10/m (operator)" in \
        render_status(collect_status(migrated))
    limit(migrated, ["emails"], clear_max_running=True, clear_rate=True)
    assert limit(migrated, ["emails"])["limits"] == [
        {"queue": "emails", "max_running": None, "rate_limit": None}]
    # bad input: one line, exit 2 (the library raises ConfigError with the same line)
    out = cli("limit", "emails", "--rate", "ten/m")
    assert out.returncode == 2 and "not a rate limit" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    for kw, message in (({"max_running": 0}, "at least 1"),
                        ({"rate": "1/s", "clear_rate": True}, "not both")):
        with pytest.raises(ConfigError, match=message):
            limit(migrated, ["emails"], **kw)
    with pytest.raises(ConfigError, match="at least one queue"):
        limit(migrated, [])


def test_show_says_until_when_the_rate_holds_a_queued_job(
        migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    from drainer.cli.jobs import render_job
    from drainer.ops import get_job

    enqueue_n(conn, migrated, "r", 2)
    q = queries(migrated, conn)
    (claimed,), next_at, limited = q.claim_batch_rated("r", 2, 60, None, Rate(1, 3600))
    assert limited == 1 and next_at is not None
    waiting = get_job(migrated, claimed.id + 1)
    assert waiting["status"] == "queued"
    assert waiting["rate_limited_until"] == next_at.isoformat()
    assert f"rate_limited_until: {next_at.isoformat()}" in render_job(waiting)
    assert get_job(migrated, claimed.id)["rate_limited_until"] is None  # running
