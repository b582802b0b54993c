"""The control database: its connection and the statements of ``sql/fleet.sql``."""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from drainer._redact import password_of, remember_secret
from drainer.errors import ConfigError, SchemaError
from drainer.fleet import _sql

if TYPE_CHECKING:
    from collections.abc import Sequence

    from drainer.settings import Settings

logger = logging.getLogger("drainer.fleet")

#: A failed tenant is tried again after base * 2^(failures - 1) seconds, at most cap: a
#: tenant that is down does not cost every fleet wake its connect timeouts.
FAILURE_BACKOFF_BASE_S = 60.0
FAILURE_BACKOFF_CAP_S = 3600.0


def control_settings(settings: Settings) -> Settings:
    """The settings of the control connection: the fleet's, with --fleet-url as the URL."""
    url = settings.fleet_url
    if url is None or not url.get_secret_value().strip():
        raise ConfigError("no control database: set DRAINER_FLEET_URL or pass --fleet-url")
    remember_secret(password_of(url.get_secret_value()))
    return settings.model_copy(update={"database_url": url})


def connect_control(settings: Settings) -> psycopg.Connection[Any]:
    """One autocommit connection to the control database (drainer's timeouts, retries)."""
    from drainer.db import connect

    return connect(control_settings(settings), purpose="fleet")


@dataclass
class Claim:
    """What a fleet run's claim leased, in the order to serve it, and what it left."""

    claimed: list[tuple[str, bool]]
    """(name, never_seen) of the leased tenants: never seen first, then longest overdue."""
    busy: list[str]
    """Due tenants another run is draining now."""


class Control:
    """The control table's statements on one connection. The fleet's threads share it: one
    statement at a time (each a short autocommit statement)."""

    def __init__(self, conn: psycopg.Connection[Any], schema: str) -> None:
        self.conn = conn
        self.schema = schema
        self.lock = threading.Lock()

    def _rows(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with self.lock, self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(_sql.statement(name, self.schema), params or {})
            return cur.fetchall() if cur.description is not None else []

    def create(self) -> None:
        """The control table, idempotent; one transaction under an advisory lock, so that
        two ``drainer fleet migrate`` at once do not race on CREATE ... IF NOT EXISTS."""
        with self.lock, self.conn.transaction():
            self.conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                              [f"drainer.fleet:{self.schema}"])
            self.conn.execute(_sql.statement("fleet_create", self.schema))

    def check(self) -> None:
        """SchemaError (exit 4) when the control table is missing."""
        rows = self._rows("fleet_exists", {"regclass": _sql.regclass(self.schema)})
        if not rows or not rows[0]["present"]:
            raise SchemaError(f"the fleet's control table {self.schema}.{_sql.TABLE} is not "
                              "set up: run `drainer fleet migrate` first")

    def claim(self, names: Sequence[str], run_id: str, lease: float,
              max_sleep: float | None) -> Claim:
        row = self._rows("fleet_claim", {"names": list(names), "run_id": run_id,
                                         "lease": lease, "max_sleep": max_sleep})[0]
        claimed = [(str(n), bool(never)) for n, never, _ in _json(row["claimed"])]
        return Claim(claimed, [str(n) for n in _json(row["busy"])])

    def renew(self, name: str, run_id: str, lease: float) -> bool:
        return bool(self._rows("fleet_renew", {"name": name, "run_id": run_id,
                                               "lease": lease}))

    def record(self, name: str, run_id: str, *, outcome: str, error: str | None,
               failed: bool, work_left: bool, next_due_at: str | None,
               schema_version: int | None, report: dict[str, Any]
               ) -> tuple[bool, datetime | None]:
        """Write a tenant's outcome back: (written, next_due_at as written); not written
        when the row was no longer this run's (its lease passed, another run took it)."""
        rows = self._rows("fleet_record", {
            "name": name, "run_id": run_id, "outcome": outcome, "error": error,
            "failed": failed, "work_left": work_left, "next_due_at": next_due_at,
            "schema_version": schema_version, "report": Jsonb(report),
            "backoff_base": FAILURE_BACKOFF_BASE_S, "backoff_cap": FAILURE_BACKOFF_CAP_S})
        if not rows:
            return False, None
        return True, rows[0]["next_due_at"]

    def release(self, names: Sequence[str], run_id: str) -> None:
        if names:
            self._rows("fleet_release", {"names": list(names), "run_id": run_id})

    def versions(self, names: Sequence[str]) -> dict[str, int | None]:
        return {r["name"]: r["schema_version"]
                for r in self._rows("fleet_versions", {"names": list(names)})}

    def record_version(self, name: str, version: int | None, error: str | None) -> None:
        self._rows("fleet_record_version", {"name": name, "schema_version": version,
                                            "error": error})

    def status(self, names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        return self._rows("fleet_status", {"names": None if names is None else list(names)})

    def next_wake(self, names: Sequence[str] | None, max_sleep: float | None
                  ) -> dict[str, Any]:
        return self._rows("fleet_next_wake", {
            "names": None if names is None else list(names), "max_sleep": max_sleep})[0]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value
