"""A fleet of tenant databases on the test server, for the fleet tests.

Each tenant is a database of its own, copied from a template database whose jobs table is
migrated (CREATE DATABASE ... TEMPLATE: about 70 ms a tenant here, against about 100 ms to
migrate each); the control database of each test is one more database.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from drainer.fleet.tenants import Tenant
from drainer.migrate import migrate, migrations

SCHEMA = "drainer"


def database_url(server_url: str, name: str) -> str:
    return urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))


def create_database(server_url: str, name: str, template: str | None = None) -> str:
    with psycopg.connect(server_url, autocommit=True) as admin:
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        admin.execute(statement)
    return database_url(server_url, name)


def drop_databases(server_url: str, names: Iterable[str]) -> None:
    """Drop the databases, many at once: each DROP DATABASE waits for a checkpoint, and
    drops that wait together share one (33 one after the other: about 40 s on a busy
    server, 11 s 16 at a time)."""
    from concurrent.futures import ThreadPoolExecutor

    def drop(name: str) -> None:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(drop, names))


@dataclass
class Fleet:
    server_url: str
    prefix: str
    tenants: list[Tenant]
    databases: list[str]

    def database_of(self, tenant: Tenant) -> str:
        return urlsplit(tenant.url).path.lstrip("/")

    def add(self, name: str, template: str | None = "tmpl") -> Tenant:
        """One more database, from the template (migrated) or empty (``template=None``)."""
        db = f"{self.prefix}_{name}"
        url = create_database(self.server_url, db,
                              None if template is None else f"{self.prefix}_{template}")
        self.databases.append(db)
        return Tenant(name, url)


@contextmanager
def tenant_fleet(server_url: str, count: int, prefix: str | None = None) -> Iterator[Fleet]:
    """``count`` migrated tenant databases, dropped at the end."""
    prefix = prefix or f"fl_{uuid.uuid4().hex[:8]}"
    template = f"{prefix}_tmpl"
    databases = [template]
    try:
        url = create_database(server_url, template)
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn, SCHEMA, "jobs")
        tenants = []
        for i in range(count):
            name = f"t{i:02d}"
            databases.append(f"{prefix}_{name}")
            tenants.append(Tenant(name, create_database(server_url, databases[-1], template)))
        yield Fleet(server_url, prefix, tenants, databases)
    finally:
        drop_databases(server_url, databases)


def migrate_to(url: str, version: int) -> None:
    """A jobs table at ``version`` (the shipped migrations up to it), as an older drainer
    left it."""
    from drainer.db import identifiers

    ids = identifiers(SCHEMA, "jobs")
    with psycopg.connect(url, autocommit=True) as conn:
        for step in migrations():
            if step.version > version:
                break
            conn.execute(sql.SQL(step.text).format(**ids))  # type: ignore[arg-type]
            if step.version:
                conn.execute(sql.SQL("INSERT INTO {} (table_name, version, name) VALUES "
                                     "(%s, %s, %s)").format(ids["migrations"]),
                             ["jobs", step.version, step.name])


def enqueue(url: str, queue: str, payloads: Iterable[dict[str, Any]]) -> None:
    """Jobs inserted in plain SQL, as any producer may."""
    from psycopg.types.json import Jsonb

    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO drainer.jobs (queue, payload) VALUES (%s, %s)",
                        [(queue, Jsonb(p)) for p in payloads])


def jobs(url: str) -> list[dict[str, Any]]:
    from psycopg.rows import dict_row

    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute("SELECT id, queue, status, attempts, result, run_id, finished_at "
                            "FROM drainer.jobs ORDER BY id").fetchall()


def clear(fleet: Fleet) -> None:
    """Every tenant's jobs table emptied (a few connections at a time)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(tenant: Tenant) -> None:
        with psycopg.connect(tenant.url, autocommit=True) as conn:
            conn.execute("TRUNCATE drainer.jobs")

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, fleet.tenants))


def sessions(server_url: str, databases: Iterable[str]) -> dict[str, int]:
    """pg_stat_database.sessions of each database: the sessions ever opened on it."""
    names = list(databases)
    with psycopg.connect(server_url, autocommit=True) as conn:
        rows = conn.execute("SELECT datname, sessions FROM pg_stat_database "
                            "WHERE datname = ANY(%s)", [names]).fetchall()
    return {str(name): int(n) for name, n in rows}


def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)
