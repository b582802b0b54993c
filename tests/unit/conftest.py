"""The unit tier is pure: a test here that opens a socket, starts a process or connects to
PostgreSQL fails at once and names the tier it belongs in (CONTRIBUTING.md, "Test tiers")."""

from __future__ import annotations

import socket
import subprocess
from typing import Any, NoReturn

import psycopg
import pytest

#: The fixtures of tests/conftest.py that reach the database.
_DATABASE_FIXTURES = frozenset({"pg_url", "schema", "settings", "conn", "migrated",
                                "own_database_url"})


def _refuse(what: str) -> Any:
    def refused(*args: Any, **kwargs: Any) -> NoReturn:
        pytest.fail(f"tests/unit is pure: {what} belongs in another tier (see "
                    "CONTRIBUTING.md, 'Test tiers')", pytrace=False)
    return refused


@pytest.fixture(autouse=True)
def _pure(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    used = sorted(_DATABASE_FIXTURES.intersection(request.fixturenames))
    if used:
        _refuse(f"a test using the database fixtures {used}")()
    for name in ("connect", "connect_ex", "bind"):
        monkeypatch.setattr(socket.socket, name, _refuse(f"a socket ({name})"))
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("a subprocess"))
    # psycopg.connect is bound at import, apart from Connection.connect; libpq's own
    # socket is not Python's, so the socket guard alone would not see it
    refused = _refuse("a PostgreSQL connection")
    monkeypatch.setattr(psycopg, "connect", refused)
    monkeypatch.setattr(psycopg.Connection, "connect", refused)
    monkeypatch.setattr(psycopg.AsyncConnection, "connect", refused)
