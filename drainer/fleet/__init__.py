"""Fleets of tenant databases: one drainer for many databases, waking only those with work.

The parts: :mod:`.tenants` (the tenants file, --tenants-query, shards), :mod:`.control`
(the control database and its table, ``sql/fleet.sql``), :mod:`.marks` (:func:`due`, what
producers call), :mod:`.run` (``drainer fleet run-once``), :mod:`.migrate` (``drainer fleet
migrate``), :mod:`.status` (``drainer fleet status`` and ``next-wake``). Producers import
only :func:`due` and :func:`due_async`: the drain is loaded by the names that need it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from drainer.fleet.marks import due, due_async

if TYPE_CHECKING:
    from drainer.fleet.control import Control, connect_control
    from drainer.fleet.migrate import FleetMigration, migrate_fleet
    from drainer.fleet.run import FleetReport, TenantLine, run_fleet
    from drainer.fleet.status import FleetWake, fleet_next_wake, fleet_status
    from drainer.fleet.tenants import Shard, Tenant, load_tenants, shard_of

__all__ = ["Control", "FleetMigration", "FleetReport", "FleetWake", "Shard", "Tenant",
           "TenantLine", "connect_control", "due", "due_async", "fleet_next_wake",
           "fleet_status", "load_tenants", "migrate_fleet", "run_fleet", "shard_of"]

_LAZY = {
    "Control": "control", "connect_control": "control",
    "FleetMigration": "migrate", "migrate_fleet": "migrate",
    "FleetReport": "run", "TenantLine": "run", "run_fleet": "run",
    "FleetWake": "status", "fleet_next_wake": "status", "fleet_status": "status",
    "Shard": "tenants", "Tenant": "tenants", "load_tenants": "tenants", "shard_of": "tenants",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'drainer.fleet' has no attribute {name!r}")
    return getattr(importlib.import_module(f"drainer.fleet.{module}"), name)
