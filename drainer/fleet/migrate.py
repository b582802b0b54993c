"""``drainer fleet migrate``: the control table, then every tenant's jobs table.

Tenants are migrated ``--fleet-concurrency`` at a time, each on one short connection of its
own with :func:`drainer.migrate.migrate` (idempotent, under its advisory lock), and the
version each reached is recorded in its control row. Resumable: a tenant recorded at the
latest version is skipped without connecting (``recheck`` connects to every one), so a run
stopped half way picks up where it stopped, and a fleet at the latest version costs no
tenant a wake.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from drainer.fleet.run import classify, current_tenant, one_line

if TYPE_CHECKING:
    from drainer.fleet.control import Control
    from drainer.fleet.tenants import Tenant
    from drainer.settings import Settings

logger = logging.getLogger("drainer.fleet")

MIGRATED, CURRENT, SKIPPED = "migrated", "current", "skipped"


@dataclass
class TenantMigration:
    """One tenant's line: what its migration did (or why it failed)."""

    tenant: str
    outcome: str
    from_version: int | None = None
    to_version: int | None = None
    applied: list[str] = field(default_factory=list)
    adopted: bool = False
    error: str | None = None
    exit_code: int = 0
    duration_s: float = 0.0

    @property
    def failed(self) -> bool:
        return self.outcome not in (MIGRATED, CURRENT, SKIPPED)

    def as_dict(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "outcome": self.outcome,
                "from_version": self.from_version, "to_version": self.to_version,
                "applied": self.applied, "adopted": self.adopted, "error": self.error,
                "exit_code": self.exit_code, "duration_s": self.duration_s}


@dataclass
class FleetMigration:
    """The summary of a fleet migrate."""

    latest: int
    lines: list[TenantMigration] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def failed(self) -> list[TenantMigration]:
        return [m for m in self.lines if m.failed]

    def as_dict(self) -> dict[str, Any]:
        count = {k: sum(m.outcome == k for m in self.lines)
                 for k in (MIGRATED, CURRENT, SKIPPED)}
        return {"summary": True, "tenants": len(self.lines), **count,
                "failed": len(self.failed), "latest_version": self.latest,
                "failed_tenants": [m.tenant for m in self.failed],
                "duration_s": self.duration_s}


def migrate_fleet(settings: Settings, tenants: Sequence[Tenant], control: Control, *,
                  recheck: bool = False, stop: threading.Event | None = None,
                  on_line: Callable[[TenantMigration], None] | None = None
                  ) -> FleetMigration:
    """Create the control table, then migrate the tenants (see the module's docstring).
    ``on_line`` is called with each tenant's line as it finishes (from worker threads, one
    at a time)."""
    from drainer.migrate import latest_version

    started = time.monotonic()
    control.create()
    latest = latest_version()
    result = FleetMigration(latest)
    recorded = {} if recheck else control.versions([t.name for t in tenants])
    stop = stop or threading.Event()
    report_lock = threading.Lock()

    def done(line: TenantMigration) -> None:
        with report_lock:
            result.lines.append(line)
            if on_line is not None:
                on_line(line)

    todo = []
    for t in tenants:
        if recorded.get(t.name) == latest:
            done(TenantMigration(t.name, SKIPPED, latest, latest))
        else:
            todo.append(t)

    def one(tenant: Tenant) -> None:
        if stop.is_set():
            return
        done(_migrate_one(settings, tenant, control))

    with ThreadPoolExecutor(max_workers=max(1, min(settings.fleet_concurrency, len(todo))),
                            thread_name_prefix="drainer-fleet-migrate") as pool:
        list(pool.map(one, todo))
    result.duration_s = round(time.monotonic() - started, 6)
    return result


def _migrate_one(settings: Settings, tenant: Tenant, control: Control) -> TenantMigration:
    from pydantic import SecretStr

    from drainer.db import connect
    from drainer.migrate import migrate

    started = time.monotonic()
    own = settings.model_copy(update={"database_url": SecretStr(tenant.url)})
    token = current_tenant.set(tenant.name)
    try:
        with connect(own) as conn:
            done = migrate(conn, settings.schema_name, settings.table)
    except Exception as exc:
        outcome, code = classify(exc)
        line = TenantMigration(tenant.name, outcome, error=one_line(exc), exit_code=code,
                               duration_s=round(time.monotonic() - started, 6))
        logger.warning("tenant %s: migrate failed: %s", tenant.name, line.error,
                       extra={"tenant": tenant.name})
        control.record_version(tenant.name, None, line.error)
        return line
    finally:
        current_tenant.reset(token)
    control.record_version(tenant.name, done.to_version, None)
    return TenantMigration(tenant.name, MIGRATED if done.applied else CURRENT,
                           done.from_version, done.to_version, done.applied, done.adopted,
                           duration_s=round(time.monotonic() - started, 6))
