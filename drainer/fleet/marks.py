"""Saying a tenant has work, on the control database, without touching the tenant.

A producer that enqueued a job in tenant X's database calls :func:`due` (or
:func:`due_async`) on its control connection after that transaction committed: one
statement, which brings X's ``next_due_at`` forward; the next ``drainer fleet run-once``
drains X, and no fleet wake before it connects to X for nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from drainer.fleet._sql import statement
from drainer.fleet.tenants import NAME, NAME_RULE
from drainer.settings import DEFAULT_SCHEMA

if TYPE_CHECKING:
    import psycopg


def due_params(name: str | Sequence[str], at: datetime | None) -> dict[str, Any]:
    """fleet_due's parameters; ValueError for a bad name or a naive ``at``."""
    names = [name] if isinstance(name, str) else list(name)
    for n in names:
        if not isinstance(n, str) or not NAME.fullmatch(n):
            raise ValueError(f"invalid tenant name {n!r}: use {NAME_RULE}")
    if at is not None and (at.tzinfo is None or at.utcoffset() is None):
        raise ValueError("at must be a timezone-aware datetime (e.g. datetime.now(timezone.utc))")
    return {"names": list(dict.fromkeys(names)), "at": at}


def due(conn: psycopg.Connection[Any], name: str | Sequence[str], at: datetime | None = None,
        *, schema: str = DEFAULT_SCHEMA) -> None:
    """Say tenant ``name`` (or each of several names) has work from ``at`` on (now by
    default): one statement on the control connection ``conn``. It runs in ``conn``'s
    transaction (commit it when the connection is not in autocommit). Call it after the
    tenant's own transaction committed, so a fleet run that sees the mark sees the job."""
    conn.execute(statement("fleet_due", schema), due_params(name, at))


async def due_async(conn: psycopg.AsyncConnection[Any], name: str | Sequence[str],
                    at: datetime | None = None, *, schema: str = DEFAULT_SCHEMA) -> None:
    """:func:`due` on an async connection."""
    await conn.execute(statement("fleet_due", schema), due_params(name, at))
