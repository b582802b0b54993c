"""deploy/sql/roles.sql: drainer's whole cycle runs as the least-privilege role, producers
can enqueue but not claim, and the roles hold nothing else.

Roles are cluster-wide and other developers share the server: every test creates its
roles with a unique suffix (psql -v drainer_role=... -v producer_role=...) on its own
schema, and drops them (DROP OWNED BY, DROP ROLE) whatever happens.
"""

from __future__ import annotations

import json
import logging
import secrets
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from drainer import Job, run_once
from drainer.db import Queries, regclass_literal
from drainer.migrate import migrate
from drainer.producer import JobSpec, enqueue, enqueue_many
from drainer.registry import Registry
from drainer.settings import Settings
from tests.conftest import make_settings, run_cli
from tests.deploy._paths import DEPLOY, psql_binary

ROLES_SQL = DEPLOY / "sql" / "roles.sql"


@dataclass(frozen=True)
class Roles:
    drainer: str
    producer: str
    drainer_dsn: str
    producer_dsn: str


def apply_roles_sql(url: str, schema: str, drainer: str, producer: str,
                    **variables: str) -> subprocess.CompletedProcess[str]:
    """Run deploy/sql/roles.sql with psql, as its header says to."""
    args = [psql_binary(), url, "-X", "-q", "-v", f"schema={schema}",
            "-v", f"drainer_role={drainer}", "-v", f"producer_role={producer}"]
    for name, value in variables.items():
        args += ["-v", f"{name}={value}"]
    args += ["-f", str(ROLES_SQL)]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def drop_roles(url: str, *roles: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for role in roles:
            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone():
                continue
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE usename = %s", [role])
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@contextmanager
def least_privilege_roles(url: str, schema: str, **variables: str) -> Iterator[Roles]:
    """The two roles of roles.sql, uniquely named, with a password, dropped afterwards."""
    suffix = uuid.uuid4().hex[:10]
    drainer, producer = f"t_drainer_{suffix}", f"t_producer_{suffix}"
    try:
        result = apply_roles_sql(url, schema, drainer, producer, **variables)
        assert result.returncode == 0, result.stderr
        # a password, so that the test also works on a server with password auth
        password = secrets.token_hex(16)
        with psycopg.connect(url, autocommit=True) as conn:
            for role in (drainer, producer):
                conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(role), sql.Literal(password)))
        yield Roles(drainer, producer,
                    make_conninfo(url, user=drainer, password=password),
                    make_conninfo(url, user=producer, password=password))
    finally:
        drop_roles(url, drainer, producer)


def wait_for_dead_tuples(conn: psycopg.Connection[Any], schema: str, at_least: int) -> int:
    """Statistics reach pg_stat_user_tables up to a second after the statements."""
    deadline = time.monotonic() + 15
    while True:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = "
                           "%s::regclass", [regclass_literal(schema, "jobs")]).fetchone()
        dead = int(row[0]) if row and row[0] is not None else 0
        if dead >= at_least or time.monotonic() > deadline:
            return dead
        time.sleep(0.1)


def sessions_of(conn: psycopg.Connection[Any], role: str, wait: float = 3.0) -> int:
    """Sessions of ``role`` still open, once closed ones had ``wait`` seconds to go away
    (a backend leaves pg_stat_activity just after its client hangs up)."""
    deadline = time.monotonic() + wait
    while True:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s",
                           [role]).fetchone()
        n = int(row[0]) if row else 0
        if n == 0 or time.monotonic() > deadline:
            return n
        time.sleep(0.05)


def make_dead_tuples(conn: psycopg.Connection[Any], schema: str, n: int) -> None:
    jobs = sql.Identifier(schema, "jobs")
    conn.execute(sql.SQL("INSERT INTO {} (queue, status, finished_at) SELECT 'scratch', "
                         "'done', now() FROM generate_series(1, %s)").format(jobs), [n])
    conn.execute(sql.SQL("DELETE FROM {} WHERE queue = 'scratch'").format(jobs))
    assert wait_for_dead_tuples(conn, schema, n) >= n


def privileges(conn: psycopg.Connection[Any], role: str, schema: str) -> set[tuple[str, ...]]:
    """Every privilege ``role`` holds on the schema, its tables and their columns."""
    rows = conn.execute("""
        SELECT 'schema', n.nspname, '', a.privilege_type
        FROM pg_namespace n, aclexplode(n.nspacl) a
        WHERE n.nspname = %(schema)s AND a.grantee = %(role)s::regrole
        UNION ALL
        SELECT 'table', c.relname, '', a.privilege_type
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, aclexplode(c.relacl) a
        WHERE n.nspname = %(schema)s AND a.grantee = %(role)s::regrole
        UNION ALL
        SELECT 'column', c.relname, att.attname, a.privilege_type
        FROM pg_attribute att JOIN pg_class c ON c.oid = att.attrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace, aclexplode(att.attacl) a
        WHERE n.nspname = %(schema)s AND a.grantee = %(role)s::regrole
        """, {"schema": schema, "role": role}).fetchall()
    return {tuple(r) for r in rows}


def test_roles_hold_exactly_the_documented_privileges(migrated: Settings, pg_url: str,
                                                      conn: psycopg.Connection[Any]) -> None:
    schema = migrated.schema_name
    with least_privilege_roles(pg_url, schema) as roles:
        # running the script again changes nothing (it revokes, then grants the same)
        again = apply_roles_sql(pg_url, schema, roles.drainer, roles.producer)
        assert again.returncode == 0, again.stderr
        assert privileges(conn, roles.drainer, schema) == {
            ("schema", schema, "", "USAGE"),
            ("table", "jobs", "", "SELECT"), ("table", "jobs", "", "INSERT"),
            ("table", "jobs", "", "UPDATE"), ("table", "jobs", "", "DELETE"),
            ("table", "jobs_archive", "", "SELECT"), ("table", "jobs_archive", "", "INSERT"),
            ("table", "drainer_migrations", "", "SELECT"),
            # the paused queues: read by every run, written by drainer pause / resume
            ("table", "jobs_queues", "", "SELECT"), ("table", "jobs_queues", "", "INSERT"),
            ("table", "jobs_queues", "", "UPDATE"),
        }
        producer_columns = {("column", "jobs", c, "INSERT") for c in (
            "queue", "payload", "run_at", "priority", "max_attempts", "dedup_key",
            "trace_context")}
        producer_columns |= {("column", "jobs", c, "SELECT") for c in (
            "id", "dedup_key", "status", "queue")}
        assert privileges(conn, roles.producer, schema) == {
            ("schema", schema, "", "USAGE"),
            ("table", "drainer_migrations", "", "SELECT"),
        } | producer_columns
        attrs = conn.execute(
            "SELECT rolname, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls, rolcanlogin "
            "FROM pg_roles WHERE rolname IN (%s, %s)", [roles.drainer, roles.producer]
        ).fetchall()
        assert sorted(a[1:] for a in attrs) == [(False, False, False, False, True)] * 2
        members = conn.execute(
            "SELECT count(*) FROM pg_auth_members WHERE member IN (%s::regrole, %s::regrole)",
            [roles.drainer, roles.producer]).fetchone()
        assert members == (0,)

        with psycopg.connect(roles.drainer_dsn, autocommit=True) as dc:
            jobs = sql.Identifier(schema, "jobs")
            for stmt in (sql.SQL("TRUNCATE {}").format(jobs),
                         sql.SQL("CREATE TABLE {} (x int)").format(
                             sql.Identifier(schema, "intruder")),
                         sql.SQL("ALTER TABLE {} ADD COLUMN x int").format(jobs),
                         sql.SQL("DELETE FROM {}").format(
                             sql.Identifier(schema, "drainer_migrations"))):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    dc.execute(stmt)


def test_drainer_role_runs_the_whole_cycle(migrated: Settings, pg_url: str,
                                           conn: psycopg.Connection[Any], registry: Registry,
                                           caplog: pytest.LogCaptureFixture) -> None:
    schema = migrated.schema_name
    jobs = sql.Identifier(schema, "jobs")
    # as the owner: an expired lease for the reaper, old done jobs for the archiver, dead
    # tuples for the vacuum check, and due jobs (one of which fails) for the drain
    conn.execute(sql.SQL("INSERT INTO {} (queue, payload, status, attempts, locked_until) "
                         "VALUES ('deploy', '{{\"lost\": true}}', 'running', 1, "
                         "now() - interval '1 minute')").format(jobs))
    conn.execute(sql.SQL("INSERT INTO {} (queue, status, attempts, finished_at) SELECT "
                         "'deploy', 'done', 1, now() - interval '8 days' "
                         "FROM generate_series(1, 3)").format(jobs))
    make_dead_tuples(conn, schema, 20)
    enqueue_many(conn, [JobSpec("deploy", {"n": i}) for i in range(20)]
                 + [JobSpec("deploy", {"fail": True})], schema=schema)

    ran: list[int] = []

    @registry.task("deploy")
    def handler(job: Job) -> None:
        if job.payload.get("fail"):
            raise RuntimeError("this job fails on purpose")
        ran.append(job.id)

    with least_privilege_roles(pg_url, schema) as roles:
        settings = make_settings(roles.drainer_dsn, schema, archive_mode="move",
                                 vacuum_threshold=1)
        with caplog.at_level(logging.INFO, logger="drainer"):
            report = run_once(settings, registry=registry)
        sessions = sessions_of(conn, roles.drainer)

    assert report.reaped == 1
    assert report.claimed == 22  # 20 + the failing one + the reaped one, claimed again
    assert report.succeeded == 21 and len(ran) == 21
    assert report.retried == 1 and report.failed == 0
    assert report.archived == 3
    assert report.vacuumed is False
    assert report.n_dead_tup is not None and report.n_dead_tup >= 1
    skipped = [r.getMessage() for r in caplog.records
               if r.name == "drainer.maintenance.vacuum" and r.levelno == logging.WARNING]
    assert len(skipped) == 1 and "skipping VACUUM" in skipped[0]
    assert "does not own the jobs table" in skipped[0]
    assert sessions == 0  # the run closed its connections
    archived = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
        sql.Identifier(schema, "jobs_archive"))).fetchone()
    assert archived == (3,)
    states = dict(conn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY 1").format(
        jobs)).fetchall())
    assert states == {"done": 21, "queued": 1}


def test_drainer_cli_runs_as_the_drainer_role(migrated: Settings, pg_url: str,
                                              conn: psycopg.Connection[Any]) -> None:
    schema = migrated.schema_name
    make_dead_tuples(conn, schema, 5)
    enqueue_many(conn, [JobSpec("noop", {}) for _ in range(3)], schema=schema)
    with least_privilege_roles(pg_url, schema) as roles:
        result = run_cli(["run-once", "--app", "sample_jobs", "--queue", "noop",
                          "--vacuum-threshold", "1", "--log-format", "json"],
                         pg_url=roles.drainer_dsn, schema=schema)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["succeeded"] == 3 and report["vacuumed"] is False
    assert "skipping VACUUM" in result.stderr
    assert "Traceback" not in result.stderr


def test_producer_role_enqueues_but_cannot_claim(migrated: Settings, pg_url: str,
                                                 conn: psycopg.Connection[Any]) -> None:
    schema = migrated.schema_name
    jobs = sql.Identifier(schema, "jobs")
    with least_privilege_roles(pg_url, schema) as roles, \
            psycopg.connect(roles.producer_dsn, autocommit=True) as pc:
        # enqueue(): INSERT ... ON CONFLICT DO NOTHING RETURNING id
        assert isinstance(enqueue(pc, "deploy", {"n": 1}, schema=schema), int)
        assert isinstance(enqueue(pc, "deploy", {"n": 2}, dedup_key="k", schema=schema), int)
        assert enqueue(pc, "deploy", {"n": 3}, dedup_key="k", schema=schema) is None
        # enqueue_many(): COPY, and COPY through a temporary table with dedup keys
        assert enqueue_many(pc, [JobSpec("deploy", {"n": i}) for i in range(5)],
                            schema=schema).enqueued == 5
        bulk = enqueue_many(pc, [JobSpec("deploy", {}, dedup_key="k"),
                                 JobSpec("deploy", {}, dedup_key="k2")], schema=schema)
        assert (bulk.enqueued, bulk.skipped_duplicates) == (1, 1)
        # plain SQL from any language
        pc.execute(sql.SQL("INSERT INTO {} (queue, payload) VALUES ('deploy', '{{}}')")
                   .format(jobs))
        # the CLI (it checks the schema version first)
        cli = run_cli(["enqueue", "deploy", '{"from": "cli"}'], pg_url=roles.producer_dsn,
                      schema=schema)
        assert cli.returncode == 0, cli.stderr

        # but not claim, read payloads, change or delete jobs, or forge a running job
        denied = [
            lambda: Queries(pc, schema, "jobs").claim_batch("deploy", 10, 30.0),
            lambda: pc.execute(sql.SQL("UPDATE {} SET status = 'running'").format(jobs)),
            lambda: pc.execute(sql.SQL("SELECT payload FROM {}").format(jobs)),
            lambda: pc.execute(sql.SQL("DELETE FROM {}").format(jobs)),
            lambda: pc.execute(sql.SQL("INSERT INTO {} (queue, status) VALUES "
                                       "('deploy', 'running')").format(jobs)),
            lambda: pc.execute(sql.SQL("SELECT * FROM {}").format(
                sql.Identifier(schema, "jobs_archive"))),
        ]
        for attempt in denied:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                attempt()

    states = conn.execute(sql.SQL("SELECT status, attempts, count(*) FROM {} GROUP BY 1, 2")
                          .format(jobs)).fetchall()
    assert states == [("queued", 0, 10)]


def test_producer_role_can_neither_forge_nor_suppress_an_occurrence(
        migrated: Settings, pg_url: str, conn: psycopg.Connection[Any]) -> None:
    schema = migrated.schema_name
    jobs = sql.Identifier(schema, "jobs")
    registry = Registry()
    seen: list[Job] = []
    registry.task("tick", cron="* * * * *")(seen.append)
    with least_privilege_roles(pg_url, schema) as roles, \
            psycopg.connect(roles.producer_dsn, autocommit=True) as pc:
        # any dedup key is the producer's own: it stands for no occurrence
        minute = time.strftime("%Y-%m-%dT%H:%M:00Z", time.gmtime(time.time() + 60))
        assert enqueue(pc, "tick", {}, dedup_key=f"recurring:tick:{minute}",
                       schema=schema) is not None
        for forged in ("INSERT INTO {} (queue, recurring_key, scheduled_for) "
                       "VALUES ('tick', 'tick', now() + interval '1 minute')",
                       "INSERT INTO {} (queue, max_attempts) VALUES ('tick', -5)"):
            with pytest.raises((psycopg.errors.InsufficientPrivilege,
                                psycopg.errors.CheckViolation)):
                pc.execute(sql.SQL(forged).format(jobs))
    run_once(migrated, registry=registry, handle_signals=False)
    occurrences = conn.execute(sql.SQL(
        "SELECT count(*) FROM {} WHERE recurring_key = 'tick' AND status = 'queued' "
        "AND scheduled_for > now()").format(jobs)).fetchone()
    assert occurrences == (1,)


def test_maintain_on_needs_postgres_17(migrated: Settings, pg_url: str,
                                       conn: psycopg.Connection[Any]) -> None:
    version = conn.execute("SHOW server_version_num").fetchone()
    assert version is not None
    if int(version[0]) >= 170000:
        pytest.skip("this server has MAINTAIN; the PostgreSQL 17 test covers it")
    suffix = uuid.uuid4().hex[:10]
    drainer, producer = f"t_drainer_{suffix}", f"t_producer_{suffix}"
    try:
        result = apply_roles_sql(pg_url, migrated.schema_name, drainer, producer,
                                 maintain="on")
        assert result.returncode != 0
        assert "maintain=on needs PostgreSQL 17 or later" in result.stderr
        # it stopped before creating or granting anything
        exists = conn.execute("SELECT count(*) FROM pg_roles WHERE rolname IN (%s, %s)",
                              [drainer, producer]).fetchone()
        assert exists == (0,)
    finally:
        drop_roles(pg_url, drainer, producer)


@pytest.mark.filterwarnings("ignore:XDG_RUNTIME_DIR")
def test_maintain_lets_the_drainer_role_vacuum_on_postgres_17(
        registry: Registry, caplog: pytest.LogCaptureFixture) -> None:
    from drainer._embedded import embedded_postgres

    with embedded_postgres() as url:
        with psycopg.connect(url, autocommit=True) as owner:
            version = owner.execute("SHOW server_version_num").fetchone()
            assert version is not None
            if int(version[0]) < 170000:
                pytest.skip(f"the embedded PostgreSQL is {version[0]}, MAINTAIN needs 17")
            schema = f"t_{uuid.uuid4().hex[:12]}"
            migrate(owner, schema, "jobs")
            make_dead_tuples(owner, schema, 20)
            enqueue_many(owner, [JobSpec("deploy", {})], schema=schema)

        @registry.task("deploy")
        def handler(job: Job) -> None:
            pass

        with least_privilege_roles(url, schema, maintain="on") as roles:
            settings = make_settings(roles.drainer_dsn, schema, vacuum_threshold=1)
            with caplog.at_level(logging.INFO, logger="drainer"):
                report = run_once(settings, registry=registry)
        assert report.succeeded == 1
        assert report.vacuumed is True
        assert not [r for r in caplog.records if "skipping VACUUM" in r.getMessage()]


# -- drainer migrate --print-grants ---------------------------------------------------------------


def test_print_grants_gives_the_same_privileges_as_roles_sql(
        migrated: Settings, pg_url: str, conn: psycopg.Connection[Any]) -> None:
    schema = migrated.schema_name
    suffix = uuid.uuid4().hex[:10]
    drainer, producer = f"t_pgdrainer_{suffix}", f"t_pgproducer_{suffix}"
    try:
        printed = run_cli(["migrate", "--print-grants", "--drainer-role", drainer,
                           "--producer-role", producer], pg_url=None, schema=schema)
        assert printed.returncode == 0, printed.stderr
        # plain SQL: any client runs it (psql here, reading stdin, no variables)
        applied = subprocess.run([psql_binary(), pg_url, "-X", "-q", "-v", "ON_ERROR_STOP=1",
                                  "-f", "-"], input=printed.stdout, capture_output=True,
                                 text=True, timeout=60)
        assert applied.returncode == 0, applied.stderr
        with least_privilege_roles(pg_url, schema) as roles:
            assert privileges(conn, drainer, schema) == privileges(conn, roles.drainer, schema)
            assert privileges(conn, producer, schema) == privileges(conn, roles.producer,
                                                                    schema)
        # and applying it twice changes nothing
        again = subprocess.run([psql_binary(), pg_url, "-X", "-q", "-v", "ON_ERROR_STOP=1",
                                "-f", "-"], input=printed.stdout, capture_output=True,
                               text=True, timeout=60)
        assert again.returncode == 0, again.stderr
    finally:
        drop_roles(pg_url, drainer, producer)


def test_print_grants_needs_no_database_and_quotes_names() -> None:
    out = run_cli(["migrate", "--print-grants", "--schema", 'odd "schema"', "--table", "q",
                   "--drainer-role", "d'x", "--maintain"], pg_url=None, schema=None)
    assert out.returncode == 0, out.stderr
    assert 'GRANT SELECT, INSERT, UPDATE, DELETE ON "odd ""schema"""."q" TO "d\'x";' in \
        out.stdout
    assert "WHERE rolname = 'd''x'" in out.stdout
    assert 'GRANT MAINTAIN ON "odd ""schema"""."q" TO "d\'x";' in out.stdout
    bad = run_cli(["migrate", "--print-grants", "--drainer-role", "x$drainer$y"],
                  pg_url=None, schema=None)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
