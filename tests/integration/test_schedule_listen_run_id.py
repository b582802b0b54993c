"""``drainer schedule --listen``: POST /drain answers the run_id of the drain it runs, and
the printed report and the log's pointer to its jobs carry the same id."""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg

from drainer.settings import Settings

Conn = psycopg.Connection[Any]


def test_post_drain_on_schedule_listen_answers_the_drains_run_id(
        migrated: Settings, conn: Conn, pg_url: str) -> None:
    import urllib.request

    from tests.acceptance._proc import DrainerProcess
    from tests.integration.test_wake_policy import insert_plain, status

    schema = migrated.schema_name
    token = "schedule-listen-token-0123"
    proc = DrainerProcess(["schedule", "--interval", "0.3", "--wake-policy", "known-work",
                           "--max-sleep", "1h", "--idle-timeout", "1", "--port", "0"],
                          pg_url=pg_url, schema=schema, DRAINER_APP="sample_jobs",
                          DRAINER_LOG_LEVEL="DEBUG", DRAINER_TRIGGER_TOKEN=token)
    try:
        port = proc.wait_log("listening on http://127.0.0.1:", timeout=20)["port"]
        proc.wait_log("tick skipped", timeout=20)
        job = insert_plain(conn, schema, "noop")
        req = urllib.request.Request(f"http://127.0.0.1:{port}/drain?wait=1", data=b"",
                                     method="POST",
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            answer = json.loads(r.read())
        assert status(conn, schema, job) == "done"
        run_id = answer["run_id"]
        assert answer["report"]["run_id"] == run_id
        # the report is printed by the drain's thread, which may still be writing it when
        # the HTTP answer arrives: wait for it (a wrong run_id never shows up)
        deadline = time.monotonic() + 10
        while True:
            printed = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
            if run_id in [r["run_id"] for r in printed] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert run_id in [r["run_id"] for r in printed], (run_id, printed)
        proc.wait_log(f"jobs of this run: drainer jobs --run {run_id}")
        assert proc.terminate() == 0
    finally:
        proc.kill()
