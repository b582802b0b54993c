"""``drainer fleet status`` and ``drainer fleet next-wake``: read from the control database
only, never from a tenant."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from drainer.recurring import iso_utc

if TYPE_CHECKING:
    from collections.abc import Sequence

    from drainer.fleet.control import Control


def fleet_status(control: Control, names: Sequence[str] | None = None) -> dict[str, Any]:
    """Every tenant's row (of ``names``, when given: a listed name with no row is
    ``never_seen``), and counts: due now, never drained, failing, leased."""
    rows = control.status(names)
    now: datetime | None = rows[0]["now"] if rows else None
    tenants = []
    for r in rows:
        tenants.append({
            "tenant": r["name"], "next_due_at": iso_utc(r["next_due_at"]),
            "due_now": r["next_due_at"] is not None and now is not None
            and r["next_due_at"] <= now,
            "never_drained": r["finished_at"] is None,
            "last_started_at": iso_utc(r["started_at"]),
            "last_finished_at": iso_utc(r["finished_at"]), "outcome": r["outcome"],
            "error": r["error"], "failures": r["failures"],
            "schema_version": r["schema_version"], "migrated_at": iso_utc(r["migrated_at"]),
            "last_fleet_run": r["run_id"], "last_report": r["report"],
            "leased_by": r["leased_by"] if r["leased"] else None,
            "leased_until": iso_utc(r["leased_until"]) if r["leased"] else None})
    seen = {t["tenant"] for t in tenants}
    missing = [] if names is None else [n for n in names if n not in seen]
    return {
        "tenants": tenants, "never_seen": missing,
        "counts": {"tenants": len(tenants) + len(missing),
                   "due_now": sum(bool(t["due_now"]) for t in tenants),
                   "never_drained": sum(bool(t["never_drained"]) for t in tenants)
                   + len(missing),
                   "failing": sum(t["failures"] > 0 for t in tenants),
                   "leased": sum(t["leased_by"] is not None for t in tenants)}}


@dataclass
class FleetWake:
    """When the next fleet wake has known work (``drainer fleet next-wake``), and why."""

    at: datetime | None
    reason: str
    tenant: str | None = None
    due_now: int = 0
    never_drained: int = 0
    leased: int = 0
    tenants: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"next_wake_at": iso_utc(self.at), "reason": self.reason,
                "tenant": self.tenant, "due_now": self.due_now,
                "never_drained": self.never_drained, "leased": self.leased,
                "tenants": self.tenants}


def fleet_next_wake(control: Control, names: Sequence[str] | None,
                    max_sleep: float | None) -> FleetWake:
    """The known-work policy across the fleet: now when a tenant is due or was never
    drained; else the earliest known due time, or the safety net (``max_sleep`` after the
    oldest last run) when it comes first; nothing when no work is known (an idle fleet
    needs no wake)."""
    r = control.next_wake(names, max_sleep)
    now: datetime = r["now"]
    never = int(r["never_drained"]) + int(r["unknown"])
    common: dict[str, Any] = {"due_now": int(r["due_now"]), "never_drained": never,
                              "leased": int(r["leased"]),
                              "tenants": int(r["tenants"]) + int(r["unknown"])}
    if r["due_now"]:
        return FleetWake(now, f"{r['due_now']} tenant(s) due now", **common)
    if never:
        return FleetWake(now, f"{never} tenant(s) never drained", **common)
    next_due: datetime | None = r["next_due_at"]
    net: datetime | None = r["safety_net_at"]
    if next_due is not None and (net is None or next_due <= net):
        return FleetWake(next_due, f"tenant {r['next_tenant']} is due then",
                         tenant=r["next_tenant"], **common)
    if net is not None:
        return FleetWake(max(net, now), "the safety net (--fleet-max-sleep after the oldest "
                         "last run)", **common)
    return FleetWake(None, "no known work on any tenant", **common)
