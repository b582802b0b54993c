"""Looking without changing anything: ``drainer status`` (the queue and its table) and
``drainer audit`` (what keeps the compute awake), as JSON or as text on a terminal."""

from __future__ import annotations

import argparse
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from drainer.cli._base import add_command
from drainer.cli._output import JSON_HELP, emit, seconds_arg, text_table
from drainer.errors import ConfigError

if TYPE_CHECKING:
    from drainer.audit import AuditResult, SessionFilter
    from drainer.settings import Settings

logger = logging.getLogger("drainer.audit")


def configure_status(sub: Any) -> None:
    p = add_command(sub, "status", "What the queue is doing, and the jobs table's health.",
                    status_command, description=(
                        "What the queue is doing: jobs by queue and status, due jobs and the "
                        "oldest due job's age, expired leases waiting for the reaper, the "
                        "next due time, failed (dead-letter) counts with their most common "
                        "errors, table and index size, dead tuples, last (auto)vacuum, other "
                        "drainer sessions and the oldest open transaction, and the recurring "
                        "series (with --app: the app's definitions, next fire time, last "
                        "outcome, unserved queues). One connection, four statements."))
    p.add_argument("--json", action="store_true", help="Print one JSON object on stdout "
                   "(the default when stdout is not a terminal; on a terminal the output is "
                   "a readable table).")


def status_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.status import collect_status

    emit(collect_status(settings), render_status, as_json=args.json)
    return 0


def configure_audit(sub: Any) -> None:
    p = add_command(sub, "audit", "Sample pg_stat_activity and name what keeps the compute "
                    "awake. Exit 0 if the compute could suspend, 1 if something keeps it "
                    "awake.", audit_command)
    p.add_argument("--duration", metavar="DURATION", default="60",
                   help="How long to sample: seconds, or 30s, 5m [default: 60s].")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("--html", metavar="FILE", help="Also write the window's timeline as one "
                   "self-contained HTML page (inline SVG, no script): awake and asleep "
                   "bands, each session's activity, who kept the compute awake and why, "
                   "where it would have suspended.")
    p.add_argument("--only-database", metavar="NAME", action="append",
                   help="Only sessions of this database (repeatable) [default: every "
                   "database: they all run on the same compute].")
    p.add_argument("--only-user", metavar="NAME", action="append",
                   help="Only sessions of this user (repeatable).")
    p.add_argument("--only-application", metavar="PATTERN", action="append",
                   help="Only sessions whose application_name is LIKE this pattern "
                   "(repeatable; e.g. 'myapp%%'). Autovacuum workers have none.")
    p.add_argument("--only-pid", metavar="PID", action="append",
                   help="Only these backend pids (repeatable or comma-separated).")


def _filters_from_args(args: argparse.Namespace) -> SessionFilter:
    from drainer.audit import SessionFilter

    pids = None
    if args.only_pid:
        try:
            pids = [int(p) for v in args.only_pid for p in v.split(",") if p.strip()]
        except ValueError:
            raise ConfigError("--only-pid takes process ids (numbers)") from None
    return SessionFilter(databases=args.only_database or None, users=args.only_user or None,
                         application_names=args.only_application or None, pids=pids)


def audit_command(args: argparse.Namespace, settings: Settings) -> int:
    """Exit 0 if the compute could suspend, 1 if something keeps it up."""
    from drainer.audit import audit
    from drainer.waking import fmt_seconds, idle_timeout_of

    duration = seconds_arg("--duration", args.duration)
    if duration <= 0:
        raise ConfigError("--duration must be more than 0 seconds")
    idle = idle_timeout_of(settings)
    if idle.assumed:
        logger.warning("idle timeout unknown: assuming %s (%s)", fmt_seconds(idle.seconds),
                       idle.source)
    result = audit(settings, duration=duration, filters=_filters_from_args(args), idle=idle)
    if args.html:
        from drainer.audit.html import write_html

        try:
            path = write_html(args.html, [("drainer audit", result)])
        except OSError as exc:
            raise ConfigError(f"--html: cannot write {args.html}: {exc.strerror or exc}"
                              ) from None
        logger.info("timeline written to %s", path, extra={"html": str(path)})
    emit(result.as_dict(), lambda _: render_audit(result), as_json=args.json)
    return 0 if result.could_suspend else 1


# -- text on a terminal ---------------------------------------------------------------------------


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)


def render_status(st: dict[str, Any]) -> str:
    """The queues' table, then the table's health and the recurring series, a line each."""
    lines = [f"jobs table {st['schema']}.{st['table']} (schema version {st['schema_version']})",
             ""]
    header = ("queue", "queued", "due", "running", "done", "failed", "cancelled",
              "oldest due", "expired")
    table = [header]
    for name, q in st["queues"].items():
        age = q["oldest_due_age_s"]
        table.append((name, str(q["queued"]), str(q["due"]), str(q["running"]), str(q["done"]),
                      str(q["failed"]), str(q.get("cancelled", 0)),
                      "-" if age is None else f"{age:.0f}s", str(q["expired_leases"])))
    if len(table) == 1:
        lines.append("(no jobs)")
    else:
        lines.extend(text_table(table, right=range(1, len(header))))
    lines.append("")
    lines.append(f"next due:        {st['next_due_at'] or '-'}")
    if st.get("paused_queues"):
        lines.append("paused queues:   " + ", ".join(
            f"{name} (since {since})" for name, since in st["paused_queues"].items())
            + " (not claimed; jobs keep arriving: `drainer resume QUEUE`)")
    for lim in st.get("queue_limits") or []:
        parts = []
        if lim["max_running"] is not None:
            parts.append(f"max_running {lim['max_running']} ({lim['max_running_from']})")
        if lim["rate_limit"] is not None:
            parts.append(f"rate {lim['rate_limit']} ({lim['rate_limit_from']})")
        if lim["rate_next_at"]:
            parts.append(f"window full, next slot {lim['rate_next_at']}")
        if parts:
            lines.append(f"limits {lim['queue']}: " + "; ".join(parts))
    lines.append(f"expired leases:  {st['expired_leases']} (the next run's reaper returns them)")
    for name, q in st["queues"].items():
        if q["failed_errors"]:
            lines.append(f"dead letters {name}: {q['failed']} failed; most common errors:")
            for e in q["failed_errors"]:
                lines.append(f"  {e['jobs']:>8}  {e['error'] or '(no last_error)'}")
    lines.append(f"table size:      {_size(st['table_bytes'])} + indexes "
                 f"{_size(st['index_bytes'])}")
    lines.append(f"dead tuples:     {st['n_dead_tup']} (live {st['n_live_tup']})")
    lines.append(f"last autovacuum: {st['last_autovacuum'] or 'never'}; last vacuum: "
                 f"{st['last_vacuum'] or 'never'}")
    xact = st.get("oldest_xact_age_s")
    lines.append(f"other drainer sessions: {st.get('drainer_sessions')}; oldest open "
                 f"transaction: {'none' if xact is None else f'{xact:.0f}s'}"
                 + (" (holds back VACUUM)" if xact is not None and xact > 60 else ""))
    lines.extend(_render_recurring(st.get("recurring") or []))
    return "\n".join(lines)


def _render_recurring(series: list[dict[str, Any]]) -> list[str]:
    if not series:
        return []
    header = ("recurring", "queue", "schedule", "next", "last")
    table = [header]
    for s in series:
        sched = "-" if s["cron"] is None else f"{s['cron']} ({s['timezone']})"
        if s["defined"] is False:
            sched = "(not in the app: its future occurrences go at the next drain)"
        elif s["served"] is False:
            sched += " (unserved: no handler)"
        nxt = s["next_at"] or "-"
        if s["next_at"] and not s["next_in_table"]:
            nxt += " (after the next drain)"
        last = "-" if s["last_status"] is None else (
            f"{s['last_status']} {s['last_scheduled_for']}"
            + (f": {s['last_error']}" if s["last_status"] == "failed" and s["last_error"]
               else ""))
        table.append((s["key"], s["queue"] or "-", sched, nxt, last))
    return ["", *text_table(table)]


def render_audit(result: AuditResult) -> str:
    """One row per session (reconnecting clients folded into one row), then the window,
    the longest quiet gap and the verdict."""
    from drainer.waking import fmt_seconds

    folded = {pid for c in result.reconnecting_clients for pid in c.pids}
    rows: list[list[str]] = []
    for c in sorted(result.reconnecting_clients, key=lambda c: not c.keeps_awake):
        rows.append([f"{len(c.pids)} pids", c.application_name or "", c.user or "",
                     c.database or "", c.client_addr or "local", "(reconnecting)",
                     "client backend", "YES" if c.keeps_awake else "no", c.reason, ""])
    for u in sorted(result.unseen_connections, key=lambda u: not u.keeps_awake):
        rows.append(["-", "(unseen)", "", u.database, "", "(short connections)", "",
                     "YES" if u.keeps_awake else "no", u.reason, ""])
    for s in sorted(result.sessions, key=lambda s: (not s.keeps_awake, s.pid)):
        if s.pid in folded and s.backend_type == "client backend":
            continue
        rows.append([str(s.pid), s.application_name or "", s.user or "", s.database or "",
                     s.client_addr or ("local" if s.backend_type == "client backend" else ""),
                     s.state or "", s.backend_type, "YES" if s.keeps_awake else "no",
                     s.reason, s.query or ""])
    head = ["PID", "APPLICATION", "USER", "DATABASE", "CLIENT", "STATE", "TYPE", "AWAKE",
            "WHY", "QUERY"]
    lines = text_table([head, *rows], caps=[10, 32, 16, 16, 15, 20, 18, 5, 84, 48])
    out = [f"sampled pg_stat_activity {result.samples} times over "
           f"{fmt_seconds(result.duration_s)} ({result.started_at} .. {result.ended_at})"]
    if rows:
        out.extend(lines)
    else:
        out.append("no sessions seen (other than the audit's own)")
    if result.counters != "on":
        out.append(f"connections shorter than a sample: not counted ({result.counters})")
    before = (result.longest_quiet_gap_from is not None
              and datetime.fromisoformat(result.longest_quiet_gap_from)
              < datetime.fromisoformat(result.started_at))
    out.append(f"longest quiet gap: {fmt_seconds(result.longest_quiet_gap_s)}"
               + (f" (from {result.longest_quiet_gap_from}"
                  f"{', before the window' if before else ''})"
                  if result.longest_quiet_gap_from else ""))
    out.append(result.verdict)
    return "\n".join(out)
