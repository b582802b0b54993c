"""Fixtures of the producer integrations: a counting trigger server, a migrated schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer.settings import Settings
from tests.conftest import make_settings
from tests.contrib._server import Counter, counting_server


@pytest.fixture
def counter() -> Iterator[Counter]:
    with counting_server() as state:
        yield state


@pytest.fixture
def trig(migrated: Settings, counter: Counter) -> Settings:
    """The test's settings with the trigger pointed at the counting server."""
    return make_settings(migrated.database_url.get_secret_value(),  # type: ignore[union-attr]
                         migrated.schema_name, trigger_url=counter.url)


def count_jobs(pg_url: str, schema: str, queue: str | None = None) -> int:
    with psycopg.connect(pg_url) as c:
        q = sql.SQL("SELECT count(*), count(DISTINCT payload) FROM {}").format(
            sql.Identifier(schema, "jobs"))
        if queue is not None:
            q = q + sql.SQL(" WHERE queue = {}").format(sql.Literal(queue))
        row = c.execute(q).fetchone()
        assert row is not None
        assert row[0] == row[1], "a payload was written twice"
        return int(row[0])


def payloads(pg_url: str, schema: str) -> list[Any]:
    with psycopg.connect(pg_url) as c:
        return [r[0] for r in c.execute(sql.SQL("SELECT payload FROM {} ORDER BY id").format(
            sql.Identifier(schema, "jobs")))]
