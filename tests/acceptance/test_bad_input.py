"""Bad input through the real CLI: settings, DSNs, app modules, payloads and values out of
range.

Each case: its documented exit code, ONE line on stderr saying what is wrong (plus, for
an unreachable server, the JSON log lines of the connect retries), no traceback, nothing
on stdout, the database unchanged, and the DSN password nowhere in the output.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.producer import JobSpec, enqueue_many
from drainer.settings import Settings
from tests.conftest import ROOT, cli_env, run_cli
from tests.reliability._helpers import secret_dsn


@pytest.fixture(scope="module")
def secret_url(pg_url: str) -> tuple[str, str]:
    """A working DSN holding a recognisable password, and that password."""
    found = secret_dsn(pg_url)
    if found is None:
        pytest.skip("the test server checks passwords and the test URL has none")
    return found


def _base(url: str) -> str:
    """``url`` with its database path cut off (to name another database)."""
    return url.rsplit("/", 1)[0]


@dataclass
class Case:
    args: list[str]
    code: int
    says: str
    dsn: str | None = "ok"  # "ok": the working DSN; None: none; else a template
    stdin: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    log_lines: bool = False  # JSON log lines (connect retries) may precede the error


RUN = ["run-once", "--app", "rel_jobs"]
CASES: dict[str, Case] = {
    "no DSN (run-once)": Case(RUN, 2, "no database URL", dsn=None),
    "no DSN (enqueue)": Case(["enqueue", "rec", "{{}}"], 2, "no database URL", dsn=None),
    "no DSN (migrate)": Case(["migrate"], 2, "no database URL", dsn=None),
    "malformed DSN: bad port": Case(RUN, 2, "invalid database URL",
                                    dsn="{base_host}:notaport/postgres"),
    "malformed DSN: key=value syntax": Case(RUN, 2, "invalid database URL",
                                            dsn="host='127.0.0.1 password={pw}"),
    "malformed DSN: not a DSN": Case(RUN, 2, "invalid database URL", dsn="{pw}"),
    "unreachable host, bounded retries": Case(
        [*RUN, "--connect-retries", "1"], 3, "database unreachable after 2 attempts",
        dsn="postgresql://postgres:{pw}@127.0.0.1:1/postgres", log_lines=True),
    "nonexistent database": Case(RUN, 3, "does not exist",
                                 dsn="{base}/no_such_db_{hex}"),
    "schema not migrated (run-once)": Case([*RUN, "--schema", "{fresh}"], 4, "drainer migrate"),
    "schema not migrated (enqueue)": Case(["enqueue", "rec", "{{}}", "--schema", "{fresh}"],
                                          4, "drainer migrate"),
    "schema not migrated (status)": Case(["status", "--schema", "{fresh}"], 4,
                                         "drainer migrate"),
    "app module missing": Case(["run-once", "--app", "no_such_module_xyz"], 2,
                               "cannot import app module"),
    "app module fails on import": Case(["run-once", "--app", "rel_broken_app"], 2,
                                       "rel_broken_app refuses to load"),
    "queue without handler": Case([*RUN, "--queue", "nohandler"], 2,
                                  "no handler for queue 'nohandler'"),
    "invalid JSON (single)": Case(["enqueue", "rec", "{{bad"], 2, "invalid JSON"),
    "invalid JSON (bulk stdin)": Case(["enqueue", "rec"], 2, "nothing was enqueued",
                                      stdin='{"ok": 1}\n{"ok": 2}\n{bad\n{"ok": 3}\n'),
    "NaN payload": Case(["enqueue", "q", "NaN"], 2, "NaN is not JSON"),
    "Infinity in a payload": Case(["enqueue", "q", '{{"x": Infinity}}'], 2,
                                  "Infinity is not JSON"),
    "NUL in a payload string": Case(["enqueue", "q", '"\\u0000"'], 2, "\\u0000 in a string"),
    "lone surrogate in a payload string": Case(["enqueue", "q", '"\\ud800"'], 2,
                                               "lone surrogate"),
    "priority beyond int4": Case(["enqueue", "--priority", "2147483648", "q", "{{}}"], 2,
                                 "--priority: out of range"),
    "job id beyond bigint": Case(["retry", "--id", str(2**63)], 2,
                                 "--id: out of range for a job id"),
    "purge age beyond any date": Case(["purge", "--status", "done", "--older-than",
                                       "1000000000d"], 2, "--older-than: at most"),
    "zero batch size": Case([*RUN, "--batch-size", "0"], 2, "--batch-size"),
    "negative batch size": Case([*RUN, "--batch-size=-5"], 2, "--batch-size"),
    "zero lease": Case([*RUN, "--lease", "0"], 2, "--lease"),
    "negative lease": Case([*RUN, "--lease=-1"], 2, "--lease"),
    "zero concurrency": Case([*RUN, "--concurrency", "0"], 2, "--concurrency"),
    "negative concurrency": Case([*RUN, "--concurrency=-2"], 2, "--concurrency"),
    "negative batch size (env)": Case(RUN, 2, "DRAINER_BATCH_SIZE",
                                      env={"DRAINER_BATCH_SIZE": "-1"}),
    "zero lease (env)": Case(RUN, 2, "DRAINER_LEASE", env={"DRAINER_LEASE": "0"}),
    "zero concurrency (env)": Case(RUN, 2, "DRAINER_CONCURRENCY",
                                   env={"DRAINER_CONCURRENCY": "0"}),
    "unknown flag": Case([*RUN, "--no-such-flag"], 2,
                         "drainer run-once: error: unrecognized arguments: --no-such-flag"),
    "unknown command": Case(["frobnicate"], 2, "invalid choice"),
}


def _snapshot(conn: psycopg.Connection[Any], schema: str) -> tuple[Any, ...]:
    """Every row and every relation of our schema (other developers' schemas come and go
    on the same server, so the check stays inside ours)."""
    rows = conn.execute(sql.SQL("SELECT * FROM {} ORDER BY id").format(
        sql.Identifier(schema, "jobs"))).fetchall()
    relations = conn.execute(
        "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = %s ORDER BY 1", [schema]).fetchall()
    return tuple(rows), tuple(relations)


def _error_lines(stderr: str) -> tuple[list[str], list[str]]:
    """(lines that are not JSON log records, JSON log records)."""
    plain, logs = [], []
    for line in stderr.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            plain.append(line)
            continue
        (logs if isinstance(record, dict) and "level" in record else plain).append(line)
    return plain, logs


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name: str, migrated: Settings, conn: psycopg.Connection[Any],
                   secret_url: tuple[str, str]) -> None:
    case = CASES[name]
    url, pw = secret_url
    schema = migrated.schema_name
    enqueue_many(conn, [JobSpec("rec", {"n": i}) for i in range(3)], schema=schema)
    before = _snapshot(conn, schema)
    fresh = f"t_fresh_{uuid.uuid4().hex[:8]}"
    fill = {"pw": pw, "base": _base(url), "hex": uuid.uuid4().hex[:8], "fresh": fresh,
            "base_host": _base(url).rsplit(":", 1)[0] if url.count(":") > 2 else _base(url)}
    dsn = None if case.dsn is None else url if case.dsn == "ok" else case.dsn.format(**fill)
    args = [a.format(**fill) for a in case.args]
    env = {"DRAINER_LOG_FORMAT": "json", **case.env}
    if dsn is not None:
        env["DRAINER_DATABASE_URL"] = dsn

    started = time.monotonic()
    result = run_cli(args, pg_url=None, schema=schema, input=case.stdin, timeout=60, **env)
    elapsed = time.monotonic() - started

    out = result.stdout + result.stderr
    assert result.returncode == case.code, out
    plain, logs = _error_lines(result.stderr)
    assert len(plain) == 1, result.stderr
    assert case.says in plain[0], plain[0]
    assert plain[0].startswith("drainer"), plain[0]
    assert case.log_lines or not logs, result.stderr
    assert "Traceback" not in out
    assert result.stdout == ""
    assert pw not in out, "the DSN password was printed"
    assert elapsed < 20
    assert _snapshot(conn, schema) == before, "the database changed"
    assert conn.execute("SELECT to_regnamespace(%s)", [fresh]).fetchone() == (None,)


def test_interval_below_idle_timeout_is_refused(secret_url: tuple[str, str],
                                                schema: str) -> None:
    url, pw = secret_url
    result = run_cli(["schedule", "--app", "rel_jobs", "--interval", "60", "--platform",
                      "neon", "--dry-run"], pg_url=url, schema=schema, timeout=30)
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in out and pw not in out


def test_schema_and_table_names_with_quotes_and_semicolons_are_names(
    conn: psycopg.Connection[Any], secret_url: tuple[str, str]
) -> None:
    """migrate creates exactly the weird names; every command works on them; the SQL
    inside them never runs."""
    url, pw = secret_url
    tag = uuid.uuid4().hex[:8]
    injected = f"injected_{tag}"
    schema = f't_{tag}"; CREATE TABLE public.{injected} (i int); --'
    table = f"jo'bs\"; DROP TABLE public.{injected};--"
    env = {"DRAINER_SCHEMA": schema, "DRAINER_TABLE": table, "DRAINER_APP": "rel_jobs"}
    try:
        for args in (["migrate"], ["enqueue", "rec", '{"n": 1}'], ["run-once"],
                     ["status", "--json"]):
            result = run_cli(args, pg_url=url, schema=None, timeout=60, **env)
            assert result.returncode == 0, result.stderr
            assert pw not in result.stdout + result.stderr
        report = json.loads(run_cli(["status", "--json"], pg_url=url, schema=None,
                                    **env).stdout)
        assert report, report
        assert conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s", [schema, table]).fetchone() == (1,)
        done = conn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY 1").format(
            sql.Identifier(schema, table))).fetchall()
        assert done == [("done", 1)]
        assert conn.execute("SELECT to_regclass(%s)", [f"public.{injected}"]
                            ).fetchone() == (None,)
    finally:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
            sql.Identifier(schema)))
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(
            sql.Identifier("public", injected)))


COMMANDS = ["migrate", "enqueue", "status", "run-once", "demo", "schedule", "serve",
            "worker", "audit"]


def test_help_never_shows_the_password(secret_url: tuple[str, str], schema: str) -> None:
    url, pw = secret_url
    for args in (["--help"], *([c, "--help"] for c in COMMANDS)):
        result = run_cli(args, pg_url=url, schema=schema, timeout=30,
                         DRAINER_TRIGGER_TOKEN=pw + "tok")
        assert result.returncode == 0, (args, result.stderr)
        assert pw not in result.stdout + result.stderr, args


def test_successful_commands_never_print_the_password(
    secret_url: tuple[str, str], schema: str
) -> None:
    """Logs at DEBUG, reports, status: the password appears nowhere."""
    url, pw = secret_url
    env = {"DRAINER_APP": "rel_jobs", "DRAINER_LOG_LEVEL": "DEBUG"}
    for args in (["migrate"], ["enqueue", "rec", "{}"], ["run-once"], ["status"],
                 ["status", "--json"]):
        result = run_cli(args, pg_url=url, schema=schema, timeout=60, **env)
        assert result.returncode == 0, (args, result.stderr)
        assert pw not in result.stdout + result.stderr, args


def test_status_on_a_database_that_is_down_says_so_in_about_a_second() -> None:
    """One retry, one warning, then exit 3 (a drain keeps its backoff for a compute that
    resumes: 0.5 s + 1 s + 2 s + 4 s + 8 s)."""
    env = {k: v for k, v in cli_env("postgresql://u:Pw_7q@127.0.0.1:1/db", None).items()
           if k != "DRAINER_CONNECT_RETRIES"}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "drainer", "status"], capture_output=True,
                          text=True, timeout=60, env=env, cwd=ROOT)
    took = time.monotonic() - started
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.count("connect attempt") == 1, proc.stderr
    assert "unreachable after 2 attempts" in proc.stderr and "Pw_7q" not in proc.stderr
    assert took < 5, took
