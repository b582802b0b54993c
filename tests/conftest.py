"""Shared fixtures: a real PostgreSQL, and a schema of its own for every test.

The server: $DRAINER_TEST_DATABASE_URL if set; else the one on 127.0.0.1:5432 if it
answers; else (or with DRAINER_TEST_EMBEDDED=1) a throwaway embedded PostgreSQL started
for the session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import psycopg
import pytest
from psycopg import sql

from drainer.migrate import migrate
from drainer.registry import Registry
from drainer.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def _reachable(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.Error:
        return False
    return True


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    url = os.environ.get("DRAINER_TEST_DATABASE_URL")
    if url:
        yield url
        return
    if not os.environ.get("DRAINER_TEST_EMBEDDED") and _reachable(LOCAL_URL):
        yield LOCAL_URL
        return
    from drainer._embedded import embedded_postgres

    with embedded_postgres() as embedded_url:
        yield embedded_url


@pytest.fixture
def schema(pg_url: str) -> Iterator[str]:
    """A fresh schema name, dropped (with everything in it) after the test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '5s'")
        try:
            conn.execute(drop)
        except psycopg.errors.LockNotAvailable:
            # a session the test left open holds a lock in this schema: end only those
            conn.execute(
                "SELECT pg_terminate_backend(l.pid) FROM pg_locks l "
                "JOIN pg_class c ON c.oid = l.relation "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND l.pid <> pg_backend_pid()", [name])
            conn.execute(drop)


def make_settings(pg_url: str, schema: str, **kw: Any) -> Settings:
    base: dict[str, Any] = {"database_url": pg_url, "schema_name": schema,
                            "connect_retries": 0, "connect_timeout": 3}
    base.update(kw)
    return load_settings(**base)


@pytest.fixture
def settings(pg_url: str, schema: str) -> Settings:
    return make_settings(pg_url, schema)


@pytest.fixture
def conn(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, autocommit=True) as c:
        yield c


@pytest.fixture
def migrated(settings: Settings, conn: psycopg.Connection[Any]) -> Settings:
    migrate(conn, settings.schema_name, settings.table)
    return settings


@pytest.fixture
def own_database_url(pg_url: str, schema: str) -> Iterator[str]:
    """The URL of a database of the test's own, created empty and dropped after the test.

    For what a schema does not isolate: LISTEN/NOTIFY channels (the product's channel is
    one name per database, so another test's insert would wake this test's worker) and
    whole-database views. Tests run in parallel (pytest-xdist), so they may overlap."""
    from urllib.parse import urlsplit, urlunsplit

    from psycopg.conninfo import make_conninfo

    name = f"{schema}_db"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    if "://" in pg_url:  # a URL stays a URL (what DRAINER_DATABASE_URL users write)
        yield urlunsplit(urlsplit(pg_url)._replace(path=f"/{name}"))
    else:
        yield make_conninfo(pg_url, dbname=name)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))


@pytest.fixture
def registry() -> Registry:
    return Registry()


def cli_env(pg_url: str | None, schema: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DRAINER_") and k != "DATABASE_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "apps"), str(ROOT)])
    env["DRAINER_CONNECT_RETRIES"] = "0"
    if pg_url is not None:
        env["DRAINER_DATABASE_URL"] = pg_url
    if schema is not None:
        env["DRAINER_SCHEMA"] = schema
    env.update(extra)
    return env


def run_cli(args: list[str], *, pg_url: str | None, schema: str | None, input: str | None = None,
            timeout: float = 120, cwd: Path | None = None, **env: str
            ) -> subprocess.CompletedProcess[str]:
    """Run the real ``drainer`` command as a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "drainer", *args], input=input, capture_output=True,
        text=True, timeout=timeout, env=cli_env(pg_url, schema, **env), cwd=cwd or ROOT,
    )


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
    """Wait for a drainer subprocess; kill it and fail if it hangs (a process left running
    would fail whichever test comes next, with its unclosed pipes)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"drainer hung for {timeout}s; stderr tail: {err[-2000:]}"
                             ) from None
    return proc.returncode, out, err


@pytest.fixture
def drains(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The drain loops (:class:`drainer.drain.loop.Drain`) run_once builds, in order: none
    when nothing was due; their clocks say what was measured."""
    import drainer.drain as drain_module

    built: list[Any] = []
    real = drain_module.build

    def build(*args: Any, **kw: Any) -> Any:
        built.append(real(*args, **kw))
        return built[-1]

    monkeypatch.setattr(drain_module, "build", build)
    return built


def in_ci() -> bool:
    """CI=true (as CI services set it): the suite must not skip what CI installs."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def missing_component(what: str, install: str) -> NoReturn:
    """Skip a test whose real component is absent; fail instead under CI=true, where
    ``.ci/run`` installs it, so that CI never passes by silently skipping."""
    message = f"{what} is not installed ({install})"
    if in_ci():
        pytest.fail(f"{message}; under CI=true this is a failure: .ci/run installs it",
                    pytrace=False)
    pytest.skip(message)
