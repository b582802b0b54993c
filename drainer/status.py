"""What the queue is doing (``drainer status``) and when the next drain is needed
(``drainer next-wake``), as data, from one connection and a few statements."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from drainer._text import iso
from drainer.recurring import iso_utc

if TYPE_CHECKING:
    from drainer.registry import Registry
    from drainer.settings import Settings


@dataclass(frozen=True)
class NextWake:
    """When the next drain is needed (``drainer next-wake``), and why."""

    at: datetime | None
    reason: str
    remaining_due: int | None = None
    next_due_at: datetime | None = None
    next_recurring_at: datetime | None = None
    recurring_key: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"next_wake_at": iso_utc(self.at), "reason": self.reason,
                "remaining_due": self.remaining_due, "next_due_at": iso_utc(self.next_due_at),
                "next_recurring_at": iso_utc(self.next_recurring_at),
                "recurring_key": self.recurring_key}


def next_wake(settings: Settings, registry: Registry | None = None, *,
              offline: bool = False, now: datetime | None = None) -> NextWake:
    """When the next drain is needed, for platforms that take a one-shot schedule.

    Online (the default): one connection that syncs the definitions of the served queues
    (as the start of a drain does, so their next occurrences exist as rows) and reads when
    the next job is due, retries and enqueued jobs included. ``offline``: no connection,
    the definitions' next fire times only (a definition's first occurrence runs only if
    some drain ran before its fire time and created it).
    """
    from drainer.drain import resolve_queues
    from drainer.recurring import served, sync
    from drainer.registry import default_registry

    registry = registry or default_registry
    queues = resolve_queues(settings, registry)
    now = now or datetime.now(timezone.utc)
    definitions = served(registry.schedules.values(), queues)
    nexts = [(t, d.key) for d in definitions if (t := d.next_after(now)) is not None]
    rec_at, rec_key = min(nexts, default=(None, None))
    if offline:
        if rec_at is None:
            return NextWake(None, "no recurring definitions on the served queues")
        return NextWake(rec_at, f"recurring {rec_key!r}", None, None, rec_at, rec_key)
    from drainer.db import Queries, connect
    from drainer.migrate import check_schema

    with connect(settings) as conn:
        q = Queries(conn, settings.schema_name, settings.table)
        check_schema(q)
        sync(q, definitions, queues, now)
        remaining, next_due = q.queue_summary(queues)
    if remaining:
        return NextWake(now, f"{remaining} job{'' if remaining == 1 else 's'} due now",
                        remaining, next_due, rec_at, rec_key)
    candidates = [t for t in (next_due, rec_at) if t is not None]
    if not candidates:
        return NextWake(None, "nothing queued and no recurring definitions", 0, None)
    at = min(candidates)
    reason = (f"recurring {rec_key!r}" if rec_at is not None and at == rec_at
              else "the next queued job is due")
    return NextWake(at, reason, 0, next_due, rec_at, rec_key)


def collect_status(settings: Settings, registry: Registry | None = None) -> dict[str, Any]:
    """Counts by queue and status, due work, expired leases, dead letters, table health,
    and the recurring series (with the app's definitions when ``settings.app`` names it)."""
    from drainer.app import load_app
    from drainer.db import Queries, connect
    from drainer.migrate import check_schema
    from drainer.recurring import series_status
    from drainer.registry import default_registry

    registry = registry or default_registry
    if settings.app:
        load_app(settings.app)
    with connect(settings) as conn:
        q = Queries(conn, settings.schema_name, settings.table)
        version = check_schema(q)
        rows = q.fetch_dicts("status_counts")
        table = q.fetch_dicts("status_table", {"regclass": q.regclass})
        errors = q.fetch_dicts("status_failed_errors")
    queues: dict[str, dict[str, Any]] = defaultdict(lambda: {
        "queued": 0, "running": 0, "done": 0, "failed": 0, "cancelled": 0, "due": 0,
        "oldest_due_age_s": None, "next_due_at": None, "expired_leases": 0,
        "top_failed_error": None, "failed_errors": [], "paused": False,
    })
    for r in rows:
        qd = queues[r["queue"]]
        qd[r["status"]] = r["jobs"]
        qd["due"] += r["due"]
        qd["expired_leases"] += r["expired_leases"]
        if r["oldest_due_age_s"] is not None:
            qd["oldest_due_age_s"] = round(float(r["oldest_due_age_s"]), 3)
        if r["next_due_at"] is not None:
            qd["next_due_at"] = r["next_due_at"].isoformat()
    for e in errors:  # ranked: most common first, at most three per queue
        qd = queues[e["queue"]]
        entry = {"error": e["error"], "jobs": e["jobs"]}
        qd["failed_errors"].append(entry)
        if qd["top_failed_error"] is None:
            qd["top_failed_error"] = entry
    t = table[0] if table else {}
    paused = t.get("paused_queues") or []
    for p in paused:  # a paused queue is listed even with no jobs
        queues[p["queue"]]["paused"] = True
    totals = {s: sum(q[s] for q in queues.values())
              for s in ("queued", "running", "done", "failed", "cancelled", "due",
                        "expired_leases")}
    ages = [q["oldest_due_age_s"] for q in queues.values() if q["oldest_due_age_s"] is not None]
    nexts = [q["next_due_at"] for q in queues.values() if q["next_due_at"] is not None]
    return {
        "schema": settings.schema_name,
        "table": settings.table,
        "schema_version": version,
        "queues": dict(sorted(queues.items())),
        "totals": totals,
        "oldest_due_age_s": max(ages) if ages else None,
        "expired_leases": totals["expired_leases"],
        "next_due_at": min(nexts) if nexts else None,
        "paused_queues": {p["queue"]: p["paused_at"] for p in paused},
        "queue_limits": _queue_limits(settings, registry, t.get("queue_limits") or []),
        "table_bytes": t.get("table_bytes"),
        "index_bytes": t.get("index_bytes"),
        "total_bytes": t.get("total_bytes"),
        "n_live_tup": t.get("n_live_tup"),
        "n_dead_tup": t.get("n_dead_tup"),
        "last_autovacuum": iso(t.get("last_autovacuum")),
        "last_vacuum": iso(t.get("last_vacuum")),
        "last_autoanalyze": iso(t.get("last_autoanalyze")),
        "drainer_sessions": t.get("drainer_sessions"),
        "oldest_xact_age_s": _round(t.get("oldest_xact_age_s")),
        "recurring": series_status(t.get("recurring") or [], registry.schedules.values(),
                                   registry.tasks, datetime.now(timezone.utc)),
    }


def _queue_limits(settings: Settings, registry: Registry,
                  rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-queue limits in force, resolved as a drain resolves them (the operator's
    rows, then the settings, then the tasks of --app when given), with the next slot of
    a full rate window."""
    from drainer import queue_limits as ql

    controls = {r["queue"]: r for r in rows}
    set_mr, set_rates = ql.setting_limits(settings.max_running, settings.rate_limit)
    names = set(controls) | set(set_mr) | set(set_rates) | {
        n for n, t in registry.tasks.items()
        if t.max_running is not None or t.rate_limit is not None}
    out = []
    for name in sorted(names):
        r = controls.get(name, {})
        rate = None if r.get("rate_count") is None else ql.Rate(int(r["rate_count"]),
                                                               float(r["rate_period_s"]))
        task = registry.tasks.get(name)
        resolved = ql.resolve(None if task is None else task.max_running,
                              None if task is None else task.rate_limit,
                              set_mr.get(name), set_rates.get(name),
                              ql.Control(r.get("max_running"), rate))
        out.append({"queue": name, **resolved.as_dict(),
                    "rate_next_at": r.get("rate_next_at")})
    return out


def _round(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)
