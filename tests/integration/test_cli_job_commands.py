"""The job commands through the real CLI: ``jobs`` (several queues, JSON when piped, the
jobs of one run), ``show`` (either form of the id), ``retry`` (the ids it logs and the
unknown ones it names), and run-once's pointer to ``drainer jobs --run``."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from drainer.settings import Settings
from tests.conftest import run_cli

Conn = psycopg.Connection[Any]


def _enqueue(pg_url: str, schema: str, queue: str, n: int = 1) -> list[int]:
    ids = []
    for i in range(n):
        p = run_cli(["enqueue", queue, json.dumps({"i": i})], pg_url=pg_url, schema=schema)
        assert p.returncode == 0, p.stderr
        ids.append(json.loads(p.stdout)["id"])
    return ids


def test_jobs_queue_takes_commas_and_repeats_like_run_once(migrated: Settings,
                                                           pg_url: str) -> None:
    schema = migrated.schema_name
    emails = _enqueue(pg_url, schema, "emails", 2)
    slow = _enqueue(pg_url, schema, "slow")
    other = _enqueue(pg_url, schema, "other")
    want = sorted(emails + slow, reverse=True)
    for args in (["--queue", "emails,slow"], ["--queue", "emails", "--queue", "slow"],
                 ["--queue", "emails, slow", "--queue", "emails"]):
        p = run_cli(["jobs", *args], pg_url=pg_url, schema=schema)
        assert p.returncode == 0, p.stderr
        rows = json.loads(p.stdout)
        assert [r["id"] for r in rows] == want, args
    p = run_cli(["jobs"], pg_url=pg_url, schema=schema)
    assert {r["id"] for r in json.loads(p.stdout)} == set(want + other)
    p = run_cli(["jobs", "--queue", " , "], pg_url=pg_url, schema=schema)
    assert p.returncode == 2 and "--queue must not be empty" in p.stderr


def test_jobs_output_matches_its_help(migrated: Settings, pg_url: str) -> None:
    _enqueue(pg_url, migrated.schema_name, "emails")
    p = run_cli(["jobs", "--help"], pg_url=pg_url, schema=migrated.schema_name)
    assert "JSON array of job objects" in " ".join(p.stdout.split())
    p = run_cli(["jobs"], pg_url=pg_url, schema=migrated.schema_name)
    rows = json.loads(p.stdout)
    assert isinstance(rows, list) and all(isinstance(r, dict) for r in rows)


def test_show_takes_the_id_positional_or_as_id(migrated: Settings, pg_url: str) -> None:
    (job,) = _enqueue(pg_url, migrated.schema_name, "emails")
    for args in ([str(job)], ["--id", str(job)]):
        p = run_cli(["show", *args], pg_url=pg_url, schema=migrated.schema_name)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["id"] == job
    for args in ([], [str(job), "--id", str(job)]):
        p = run_cli(["show", *args], pg_url=pg_url, schema=migrated.schema_name)
        assert p.returncode == 2 and "show takes one job id" in p.stderr


def test_retry_logs_the_ids_it_retried(migrated: Settings, pg_url: str, conn: Conn) -> None:
    schema = migrated.schema_name
    a, b = _enqueue(pg_url, schema, "emails", 2)
    conn.execute(f'UPDATE "{schema}".jobs SET status = \'failed\', finished_at = now() '
                 "WHERE id = %s", [b])
    p = run_cli(["retry", "--id", str(a), "--id", "999999", "--id", str(b),
                 "--log-format", "json"], pg_url=pg_url, schema=schema)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["retried_ids"] == [b]
    (line,) = [json.loads(x) for x in p.stderr.splitlines()
               if x.startswith("{") and "retry:" in x]
    assert f"ids [{b}]" in line["msg"] and "999999" not in line["msg"], line
    # the unknown id is named once, in the warning line (not a log record)
    assert [x for x in p.stderr.splitlines() if not x.startswith("{")] == [
        f"drainer retry: warning: no job 999999 in {schema}.jobs (counted as not_found; "
        "the other ids were handled)"]


def test_run_once_says_where_its_jobs_are(migrated: Settings, pg_url: str) -> None:
    schema = migrated.schema_name
    first = _enqueue(pg_url, schema, "noop", 2)
    p = run_cli(["run-once", "--log-format", "json"], pg_url=pg_url, schema=schema,
                DRAINER_APP="sample_jobs")
    assert p.returncode == 0, p.stderr
    run_id = json.loads(p.stdout)["run_id"]
    last = json.loads(p.stderr.strip().splitlines()[-1])  # the last log line
    assert last["msg"] == f"jobs of this run: drainer jobs --run {run_id}"
    assert last["run_id"] == run_id
    second = _enqueue(pg_url, schema, "noop")
    p2 = run_cli(["run-once"], pg_url=pg_url, schema=schema, DRAINER_APP="sample_jobs")
    other = json.loads(p2.stdout)["run_id"]
    for rid, ids in ((run_id, first), (other, second)):
        p = run_cli(["jobs", "--run", rid], pg_url=pg_url, schema=schema)
        assert p.returncode == 0, p.stderr
        assert sorted(r["id"] for r in json.loads(p.stdout)) == sorted(ids)
    p = run_cli(["jobs", "--run", "no-such-run"], pg_url=pg_url, schema=schema)
    assert json.loads(p.stdout) == []
