"""Reading the table: ``drainer jobs`` (a list, newest first) and ``drainer show`` (one
job in full), as JSON or as text on a terminal."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from drainer.cli._base import add_command, any_case
from drainer.cli._output import JSON_HELP, emit, job_id, positive_int, queue_list, text_table
from drainer.errors import ConfigError
from drainer.ops import DEFAULT_LIST_LIMIT, STATUSES

if TYPE_CHECKING:
    from drainer.settings import Settings


def configure_jobs(sub: Any) -> None:
    p = add_command(sub, "jobs", "List jobs, newest first, with the first line of their "
                    "last_error.", jobs_command)
    p.add_argument("--queue", dest="job_queue", metavar="QUEUE", action="append",
                   help="Only jobs of these queues (repeat the flag or separate with commas, "
                   "as run-once's --queue).")
    p.add_argument("--status", choices=STATUSES, type=any_case("--status", STATUSES),
                   help="Only jobs with this status.")
    p.add_argument("--run", dest="run_id", metavar="RUN_ID",
                   help="Only jobs that this run (the run_id of its report) claimed last.")
    p.add_argument("--limit", type=positive_int, default=DEFAULT_LIST_LIMIT, metavar="N",
                   help=f"Show at most N jobs [default: {DEFAULT_LIST_LIMIT}].")
    p.add_argument("--json", action="store_true",
                   help="Print one JSON array of job objects on stdout (the default when "
                   "stdout is not a terminal; on a terminal the output is a readable table).")


def jobs_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.ops import list_jobs, task_attempts_limits, with_attempts_applied

    queues = queue_list(args.job_queue)
    if args.job_queue and not queues:
        raise ConfigError("--queue must not be empty")
    limits = task_attempts_limits(settings.app) if settings.app else None
    rows = list_jobs(settings, queues=queues, status=args.status, limit=args.limit,
                     run_id=args.run_id)
    if limits is not None:
        rows = [with_attempts_applied(r, limits) for r in rows]
    emit(rows, render_jobs, as_json=args.json)
    return 0


def configure_show(sub: Any) -> None:
    p = add_command(sub, "show", "Show one job with its payload and full last_error.",
                    show_command, description=(
                        "Show one job: every column, its payload and its full last_error "
                        "(error and traceback tail). Exit 1 when there is no such job."))
    p.add_argument("id", metavar="ID", type=job_id, nargs="?", help="The job's id.")
    p.add_argument("--id", dest="flag_id", metavar="N", type=job_id,
                   help="The job's id (as retry and cancel take it).")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def show_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.ops import get_job, task_attempts_limits, with_attempts_applied

    if (args.id is None) == (args.flag_id is None):
        raise ConfigError("show takes one job id: drainer show ID or drainer show --id ID")
    limits = task_attempts_limits(settings.app) if settings.app else None
    job = get_job(settings, args.id if args.id is not None else args.flag_id)
    if limits is not None:
        job = with_attempts_applied(job, limits)
    emit(job, render_job, as_json=args.json)
    return 0


# -- text on a terminal ---------------------------------------------------------------------------


def _attempts_ambiguous(row: dict[str, Any]) -> bool:
    """Failed below the row's max_attempts, not cancelled: the row's figure does not say
    why (a task's max_attempts, its discard_on or retry_on; ``--app`` tells)."""
    error = row.get("error", row.get("last_error")) or ""
    return (row["status"] == "failed" and row["attempts"] < row["max_attempts"]
            and "max_attempts_source" not in row and not error.startswith("cancelled"))


def _attempts(row: dict[str, Any]) -> str:
    """``2/5`` (the row's max_attempts), ``2/2 (task)`` when the app's task sets it."""
    if row.get("max_attempts_source") == "task":
        return f"{row['attempts']}/{row['max_attempts_applied']} (task)"
    return f"{row['attempts']}/{row['max_attempts']}"


#: Under `drainer jobs` and `drainer show` when a failed job's attempts are below the row's
#: max_attempts and no --app says the task's.
AMBIGUOUS_ATTEMPTS_NOTE = (
    "note: attempts/max is the row's max_attempts column; a task's @task(max_attempts=...) "
    "overrides it at run time (and discard_on fails a job at once): pass --app to show "
    "what applies")


def render_jobs(rows: list[dict[str, Any]]) -> str:
    """One table row a job, its last_error cut to its first 60 characters."""
    if not rows:
        return "(no jobs)"
    table: list[tuple[str, ...]] = [("id", "queue", "status", "attempts", "run_at",
                                     "locked_until", "finished_at", "last_error")]
    for r in rows:
        table.append((str(r["id"]), r["queue"], r["status"], _attempts(r),
                      _short_time(r["run_at"]),
                      _short_time(r["locked_until"]), _short_time(r["finished_at"]),
                      (r["error"] or "")[:60]))
    lines = text_table(table)
    if any(_attempts_ambiguous(r) for r in rows):
        lines.append(AMBIGUOUS_ATTEMPTS_NOTE)
    return "\n".join(lines)


def _short_time(value: str | None) -> str:
    return "-" if value is None else value[:19].replace("T", " ")


#: Keys of a job that `drainer show` prints in their own way, or not at all.
_SHOWN_APART = ("payload", "last_error", "result", "max_attempts_applied", "max_attempts_source")


def render_job(job: dict[str, Any]) -> str:
    """Every column as ``key: value``, the values in one column (the longest key's), then
    the payload, the result and the full last_error below their keys (``-`` when none)."""
    width = max(len(k) for k in [*job, "last_error"] if k not in _SHOWN_APART[3:]) + 2

    def field(key: str, value: Any) -> str:
        return f"{key + ':':{width}s}{'-' if value is None else value}"

    lines = []
    for key, value in job.items():
        if key in _SHOWN_APART:
            continue
        if key == "max_attempts" and job.get("max_attempts_source") == "task":
            value = f"{job['max_attempts_applied']} (task; the row's column: {value})"
        lines.append(field(key, value))
    lines.append("payload:")
    lines.append(json.dumps(job["payload"], indent=2, ensure_ascii=False))
    if job.get("result") is not None:
        lines.append("result:")
        lines.append(json.dumps(job["result"], indent=2, ensure_ascii=False))
    else:
        lines.append(field("result", None))
    if job["last_error"] is not None:
        lines.append("last_error:")
        lines.append(job["last_error"].rstrip())
    else:
        lines.append(field("last_error", None))
    if _attempts_ambiguous(job):
        lines.append(AMBIGUOUS_ATTEMPTS_NOTE)
    return "\n".join(lines)
