"""``drainer serve`` as a real subprocess: auth, coalescing, healthz, SIGTERM."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings
from tests.acceptance._proc import DrainerProcess
from tests.conftest import run_cli

TOKEN = "serve-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _request(port: int, method: str, path: str, headers: dict[str, str] | None = None,
             body: bytes | None = None) -> tuple[int, dict[str, Any]]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        return r.status, json.loads(data) if data else {}
    finally:
        c.close()


def _executions(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(sql.SQL("CREATE TABLE {} (job_id bigint, attempt int, pid int, note text, "
                         "at timestamptz DEFAULT clock_timestamp())")
                 .format(sql.Identifier(schema, "executions")))


def _sessions(conn: psycopg.Connection[Any], app_name: str, settle: float = 2.0) -> int:
    """The server sessions of the app open now, once they have had ``settle`` seconds to go:
    a backend leaves pg_stat_activity when its process exits, a moment after the client's
    Terminate (seen at load 6: a run reported done, its backend still listed)."""
    until = time.monotonic() + settle
    while True:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity "
                           "WHERE application_name LIKE %s", [app_name + "%"]).fetchone()
        assert row is not None
        if int(row[0]) == 0 or time.monotonic() >= until:
            return int(row[0])
        time.sleep(0.05)


@pytest.fixture
def served(migrated: Settings, pg_url: str, schema: str,
           conn: psycopg.Connection[Any]) -> Iterator[tuple[DrainerProcess, int, str]]:
    _executions(conn, schema)
    app_name = f"srv_{schema}"
    proc = DrainerProcess(["serve", "--port", "0"], pg_url=pg_url, schema=schema,
                          DRAINER_APP="sample_jobs", DRAINER_TRIGGER_TOKEN=TOKEN,
                          DRAINER_APPLICATION_NAME=app_name, DRAINER_GRACE="10")
    try:
        rec = proc.wait_log("listening on")
        yield proc, int(rec["port"]), app_name
    finally:
        proc.kill()


def _wait_run(port: int, run_id: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = _request(port, "GET", f"/runs/{run_id}", AUTH)
        if status == 200:
            return body
        assert status == 202, (status, body)
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not finish")


def test_refuses_to_start_without_a_token(migrated: Settings, pg_url: str,
                                          schema: str) -> None:
    r = run_cli(["serve", "--port", "0"], pg_url=pg_url, schema=schema,
                DRAINER_APP="sample_jobs", timeout=30)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "DRAINER_TRIGGER_TOKEN" in r.stderr
    assert "Traceback" not in r.stderr


def test_auth_paths_and_body_size(served: tuple[DrainerProcess, int, str],
                                  conn: psycopg.Connection[Any], schema: str) -> None:
    proc, port, app_name = served
    assert _request(port, "POST", "/drain")[0] == 401
    assert _request(port, "POST", "/drain", {"Authorization": "Bearer wrong"})[0] == 401
    assert _request(port, "POST", "/drain", {"Authorization": TOKEN})[0] == 401
    assert _request(port, "GET", "/runs/x")[0] == 401
    assert _request(port, "GET", "/nope")[0] == 404
    assert _request(port, "POST", "/nope", AUTH)[0] == 404
    assert _request(port, "GET", "/drain", AUTH)[0] == 405
    assert _request(port, "GET", "/runs/unknown", AUTH)[0] == 404
    status, body = _request(port, "POST", "/drain", AUTH, body=b"x" * (64 * 1024))
    assert status == 413, body
    # none of that started a drain or opened a session
    assert _request(port, "GET", "/healthz")[1]["runs_started"] == 0
    assert _sessions(conn, app_name) == 0
    assert TOKEN not in proc.stderr()


def test_healthz_never_touches_the_database(served: tuple[DrainerProcess, int, str],
                                            migrated: Settings,
                                            conn: psycopg.Connection[Any]) -> None:
    _proc, port, app_name = served
    enqueue_many(conn, [JobSpec("noop", {}) for _ in range(5)], schema=migrated.schema_name)
    status, body = _request(port, "POST", "/drain", AUTH)
    assert status == 202
    report = _wait_run(port, body["run_id"])
    assert report["status"] == "done" and report["report"]["succeeded"] == 5
    # after the drain: no session left, and 50 health checks open none
    assert _sessions(conn, app_name) == 0
    for _ in range(50):
        status, health = _request(port, "GET", "/healthz")
        assert status == 200 and health["status"] == "ok"
        assert _sessions(conn, app_name, settle=0) == 0
    row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE status = 'done'")
                       .format(sql.Identifier(migrated.schema_name, "jobs"))).fetchone()
    assert row is not None and row[0] == 5


def test_twenty_concurrent_posts_coalesce(served: tuple[DrainerProcess, int, str],
                                          migrated: Settings,
                                          conn: psycopg.Connection[Any]) -> None:
    _proc, port, app_name = served
    n_jobs = 60
    enqueue_many(conn, [JobSpec("record", {"n": i}) for i in range(n_jobs)],
                 schema=migrated.schema_name)
    barrier = threading.Barrier(20)
    answers: list[tuple[int, dict[str, Any]]] = []
    lock = threading.Lock()

    def post() -> None:
        barrier.wait()
        answer = _request(port, "POST", "/drain", AUTH)
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=post) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(answers) == 20 and {s for s, _ in answers} == {202}
    run_ids = {body["run_id"] for _, body in answers}
    assert 1 <= len(run_ids) <= 2, [_wait_run(port, r) for r in run_ids]
    reports = [_wait_run(port, r) for r in run_ids]
    assert all(r["status"] == "done" for r in reports)
    assert sum(r["report"]["claimed"] for r in reports) == n_jobs
    assert _request(port, "GET", "/healthz")[1]["runs_started"] == len(run_ids) <= 2
    s = migrated.schema_name
    rows = conn.execute(sql.SQL("SELECT job_id, count(*) FROM {} GROUP BY job_id")
                        .format(sql.Identifier(s, "executions"))).fetchall()
    assert len(rows) == n_jobs and all(c == 1 for _, c in rows)  # every job ran exactly once
    row = conn.execute(sql.SQL("SELECT count(*) FILTER (WHERE status = 'done'), count(*) "
                               "FROM {}").format(sql.Identifier(s, "jobs"))).fetchone()
    assert row == (n_jobs, n_jobs)
    assert _sessions(conn, app_name) == 0


def test_wait_holds_the_request_until_the_drain_ends(served: tuple[DrainerProcess, int, str],
                                                     migrated: Settings,
                                                     conn: psycopg.Connection[Any]) -> None:
    _proc, port, _ = served
    enqueue_many(conn, [JobSpec("noop", {}) for _ in range(3)], schema=migrated.schema_name)
    status, body = _request(port, "POST", "/drain?wait=1", AUTH)
    assert status == 200 and body["status"] == "done"
    assert body["report"]["succeeded"] == 3 and body["report"]["run_id"] == body["run_id"]


def test_sigterm_finishes_or_releases_and_exits_0(served: tuple[DrainerProcess, int, str],
                                                  migrated: Settings,
                                                  conn: psycopg.Connection[Any]) -> None:
    proc, port, app_name = served
    s = migrated.schema_name
    enqueue_many(conn, [JobSpec("sleepy", {"sleep": 1}) for _ in range(3)], schema=s)
    assert _request(port, "POST", "/drain", AUTH)[0] == 202
    # a second trigger queues a drain behind the running one; SIGTERM cancels it
    assert _request(port, "POST", "/drain", AUTH)[0] == 202
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE note = 'start'")
                           .format(sql.Identifier(s, "executions"))).fetchone()
        if row and row[0]:
            break
        time.sleep(0.02)
    started = time.monotonic()
    assert proc.terminate(timeout=20) == 0, proc.stderr()
    assert time.monotonic() - started < 5  # the running job finished (1 s), then exit
    rows = conn.execute(sql.SQL("SELECT status, attempts, count(*) FROM {} GROUP BY 1, 2 "
                                "ORDER BY 1").format(sql.Identifier(s, "jobs"))).fetchall()
    assert rows == [("done", 1, 1), ("queued", 0, 2)], rows  # released: attempt not used
    notes = conn.execute(sql.SQL("SELECT note FROM {} ORDER BY at")
                         .format(sql.Identifier(s, "executions"))).fetchall()
    assert [n for (n,) in notes] == ["start", "end"]
    assert "received SIGTERM" in proc.stderr()
    assert _sessions(conn, app_name) == 0


def test_enqueue_triggers_a_drain_through_serve(served: tuple[DrainerProcess, int, str],
                                                migrated: Settings, pg_url: str,
                                                conn: psycopg.Connection[Any]) -> None:
    """The whole "jobs come from your app" path: enqueue, commit, POST, drain."""
    _proc, port, _ = served
    r = run_cli(["enqueue", "noop", '{"from": "app"}'], pg_url=pg_url,
                schema=migrated.schema_name, DRAINER_TRIGGER_URL=f"http://127.0.0.1:{port}/drain",
                DRAINER_TRIGGER_TOKEN=TOKEN, timeout=30)
    assert r.returncode == 0, r.stderr
    job_id = json.loads(r.stdout)["id"]
    deadline = time.monotonic() + 10
    status = None
    while time.monotonic() < deadline:
        row = conn.execute(sql.SQL("SELECT status FROM {} WHERE id = %s")
                           .format(sql.Identifier(migrated.schema_name, "jobs")),
                           [job_id]).fetchone()
        status = row[0] if row else None
        if status == "done":
            break
        time.sleep(0.02)
    assert status == "done"
    assert _request(port, "GET", "/healthz")[1]["runs_started"] == 1


def test_no_auth_and_a_missing_table(pg_url: str, schema: str,
                                     conn: psycopg.Connection[Any]) -> None:
    """--no-auth accepts untokened triggers; a drain on a missing table reports exit 4."""
    proc = DrainerProcess(["serve", "--port", "0", "--no-auth"], pg_url=pg_url, schema=schema,
                          DRAINER_APP="sample_jobs")
    try:
        port = int(proc.wait_log("listening on")["port"])
        assert "--no-auth" in proc.stderr()
        status, body = _request(port, "POST", "/drain?wait=1")
        assert status == 200 and body["status"] == "error" and body["exit_code"] == 4
        assert "drainer migrate" in body["error"]
        assert _request(port, "GET", f"/runs/{body['run_id']}")[1]["status"] == "error"
        assert proc.terminate() == 0
    finally:
        proc.kill()
