"""The jobs in the table: ``enqueue``, and the operator's ``jobs``, ``show``, ``retry``,
``cancel`` and ``purge`` (drainer/ops.py; each touches only what it names)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from drainer.cli._base import add_command
from drainer.cli._output import JSON_HELP, emit, positive_int, print_json, seconds_arg
from drainer.errors import ConfigError
from drainer.ops import DEFAULT_LIST_LIMIT, PURGEABLE, STATUSES

if TYPE_CHECKING:
    from drainer.settings import Settings


# -- enqueue --------------------------------------------------------------------------------------


def configure_enqueue(sub: Any) -> None:
    p = add_command(sub, "enqueue", "Enqueue one job (JSON argument) or many (JSON lines on "
                    "stdin).", enqueue_command)
    p.add_argument("queue", metavar="QUEUE", help="Queue name.")
    p.add_argument("payload", metavar="JSON", nargs="?",
                   help="The job's payload as JSON. Omit it to read one payload per line "
                   "from stdin (all or nothing).")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--delay", metavar="SECONDS", help="Run no sooner than this many "
                      "seconds from now (also 30s, 15m, 2h, 1d).")
    when.add_argument("--run-at", metavar="ISO", help="Run no sooner than this ISO 8601 "
                      "time (with a time zone; UTC if none).")
    p.add_argument("--priority", type=int, default=0, help="Higher runs first [default: 0].")
    p.add_argument("--dedup-key", metavar="KEY", help="Skip the job when one with this key "
                   "is already queued or running.")


def _run_at(args: argparse.Namespace) -> datetime | None:
    if args.delay is not None:
        seconds = seconds_arg("--delay", args.delay)
        if seconds < 0:
            raise ConfigError("--delay must not be negative")
        return datetime.now(timezone.utc) + timedelta(seconds=seconds)
    if args.run_at is not None:
        try:
            when = datetime.fromisoformat(args.run_at.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(f"--run-at: not an ISO 8601 time between 1970-01-01 and "
                              f"9999-01-01: {args.run_at!r}") from None
        when = when if when.tzinfo else when.replace(tzinfo=timezone.utc)
        from drainer.producer import check_run_at

        try:
            check_run_at(when)
        except ValueError as exc:
            raise ConfigError(f"--run-at: {exc}") from None
        return when
    return None


def _parse_payloads(args: argparse.Namespace) -> list[Any]:
    if args.payload is not None:
        try:
            return [json.loads(args.payload)]
        except json.JSONDecodeError as exc:
            raise ConfigError(f"invalid JSON payload: {exc}") from None
    payloads = []
    for n, line in enumerate(sys.stdin, start=1):
        if not line.strip():
            continue
        try:
            payloads.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"stdin line {n}: invalid JSON: {exc}; nothing was enqueued"
            ) from None
    return payloads


def enqueue_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.db import Queries, connect
    from drainer.migrate import check_schema
    from drainer.producer import JobSpec, enqueue, enqueue_many

    if not args.queue.strip():
        raise ConfigError("QUEUE must not be empty")
    run_at = _run_at(args)
    payloads = _parse_payloads(args)  # all parsed before anything is written
    common: dict[str, Any] = {"run_at": run_at, "priority": args.priority,
                              "max_attempts": settings.max_attempts,
                              "dedup_key": args.dedup_key}
    with connect(settings) as conn:
        check_schema(Queries(conn, settings.schema_name, settings.table))
        names: dict[str, Any] = {"schema": settings.schema_name, "table": settings.table}
        if args.payload is not None:
            with conn.transaction():
                job_id = enqueue(conn, args.queue, payloads[0], **common, **names)
            out: dict[str, Any] = {
                "enqueued": 0 if job_id is None else 1,
                "skipped_duplicates": 1 if job_id is None else 0,
                "id": job_id,
            }
        else:
            result = enqueue_many(conn, [JobSpec(args.queue, p, **common) for p in payloads],
                                  **names)
            out = {"enqueued": result.enqueued,
                   "skipped_duplicates": result.skipped_duplicates}
    if out["skipped_duplicates"]:
        sys.stderr.write(f"drainer enqueue: skipped {out['skipped_duplicates']} job(s): "
                         f"dedup key {args.dedup_key!r} is already queued or running\n")
    print_json(out)
    if out["enqueued"] and settings.trigger_url:
        # after the commit: ask for a drain (a failed trigger never loses the job)
        from drainer.trigger import fire

        fire(settings)
    return 0


# -- jobs and show --------------------------------------------------------------------------------


def configure_jobs(sub: Any) -> None:
    p = add_command(sub, "jobs", "List jobs, newest first, with the first line of their "
                    "last_error.", jobs_command)
    p.add_argument("--queue", dest="job_queue", metavar="QUEUE",
                   help="Only jobs of this queue.")
    p.add_argument("--status", choices=STATUSES, help="Only jobs with this status.")
    p.add_argument("--limit", type=positive_int, default=DEFAULT_LIST_LIMIT, metavar="N",
                   help=f"Show at most N jobs [default: {DEFAULT_LIST_LIMIT}].")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def jobs_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.ops import list_jobs, render_jobs

    rows = list_jobs(settings, queue=args.job_queue, status=args.status, limit=args.limit)
    emit(rows, render_jobs, as_json=args.json)
    return 0


def configure_show(sub: Any) -> None:
    p = add_command(sub, "show", "Show one job with its payload and full last_error.",
                    show_command, description=(
                        "Show one job: every column, its payload and its full last_error "
                        "(error and traceback tail). Exit 1 when there is no such job."))
    p.add_argument("id", metavar="ID", type=positive_int, help="The job's id.")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def show_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.ops import get_job, render_job

    emit(get_job(settings, args.id), render_job, as_json=args.json)
    return 0


# -- retry, cancel, purge -------------------------------------------------------------------------


def configure_retry(sub: Any) -> None:
    p = add_command(sub, "retry", "Put failed jobs back in the queue (by id, queue, or all).",
                    retry_command, description=(
                        "Put failed jobs back in the queue: status queued, attempts 0, due "
                        "now (last_error is kept until the job runs again). Give exactly one "
                        "of --id, --queue, --all-failed. Jobs whose dedup key is now held by "
                        "a queued or running job, and jobs cancelled while running whose "
                        "owner's lease has not run out yet, are skipped and counted; nothing "
                        "else is touched. Prints the counts."))
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", dest="ids", metavar="N", type=positive_int, nargs="+",
                       action="extend", help="These failed jobs (ids that are not failed "
                       "are counted as not_failed / not_found and left alone).")
    which.add_argument("--queue", dest="job_queue", metavar="QUEUE",
                       help="Every failed job of this queue.")
    which.add_argument("--all-failed", action="store_true",
                       help="Every failed job of every queue.")
    p.add_argument("--dry-run", action="store_true",
                   help="Report what would be retried; change nothing.")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def retry_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.ops import render_counts, retry_jobs

    report = retry_jobs(settings, ids=args.ids, queue=args.job_queue,
                        all_failed=args.all_failed, dry_run=args.dry_run)
    emit(report, render_counts, as_json=args.json)
    return 0


def configure_cancel(sub: Any) -> None:
    p = add_command(sub, "cancel", "Cancel queued or running jobs by id.", cancel_command,
                    description=(
                        "Cancel jobs: queued and running jobs become failed with last_error "
                        "'cancelled'. A running job's owner notices at its next heartbeat "
                        "(within about two thirds of the lease), sets job.cancelled so the "
                        "handler can stop, and its outcome is not written; a handler that "
                        "ignores job.cancelled runs to its end. Done and failed jobs are "
                        "left alone; jobs locked by a transaction (a transaction-mode job in "
                        "flight) are counted as busy. Prints the counts."))
    p.add_argument("--id", dest="ids", metavar="N", type=positive_int, nargs="+",
                   action="extend", required=True, help="The jobs to cancel.")
    p.add_argument("--dry-run", action="store_true",
                   help="Report what would be cancelled; change nothing.")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def cancel_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.ops import cancel_jobs, render_counts

    report = cancel_jobs(settings, args.ids, dry_run=args.dry_run)
    emit(report, render_counts, as_json=args.json)
    return 0


def configure_purge(sub: Any) -> None:
    p = add_command(sub, "purge", "Delete old done or failed jobs now (manual archival).",
                    purge_command, description=(
                        "Delete finished jobs now (manual archival), in batches of "
                        "DRAINER_ARCHIVE_BATCH_SIZE rows a statement. Queued and running "
                        "jobs are never purged. Prints the count."))
    p.add_argument("--status", required=True, choices=PURGEABLE,
                   help="Which finished jobs: done, or failed (the dead-letter queue).")
    p.add_argument("--older-than", required=True, metavar="AGE",
                   help="Only jobs finished longer ago than this: seconds or 30s, 15m, "
                   "12h, 7d (0 = all of them).")
    p.add_argument("--dry-run", action="store_true",
                   help="Count what would be purged; change nothing.")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def purge_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.ops import purge_jobs, render_counts

    older_than = seconds_arg("--older-than", args.older_than)
    report = purge_jobs(settings, status=args.status, older_than=older_than,
                        dry_run=args.dry_run)
    emit(report, render_counts, as_json=args.json)
    return 0


# -- pause, resume --------------------------------------------------------------------------------


def configure_pause(sub: Any) -> None:
    p = add_command(sub, "pause", "Pause queues: no drainer claims their jobs.",
                    pause_command, description=(
                        "Pause queues (during an incident, a deploy, an outage downstream): "
                        "no drainer claims their jobs, from each drainer's next run on (a run "
                        "reads the paused queues once, at its start; jobs already running "
                        "finish). Jobs keep arriving and wait. `drainer status` lists the "
                        "paused queues; `drainer resume` undoes it. Prints what changed."))
    p.add_argument("queues", metavar="QUEUE", nargs="+", help="The queues to pause.")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def pause_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.ops import pause, render_counts

    emit(pause(settings, args.queues), render_counts, as_json=args.json)
    return 0


def configure_resume(sub: Any) -> None:
    p = add_command(sub, "resume", "Resume paused queues.", resume_command, description=(
        "Resume paused queues: drainers claim their jobs again from their next run. "
        "Prints what changed."))
    p.add_argument("queues", metavar="QUEUE", nargs="+", help="The queues to resume.")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def resume_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.ops import render_counts, resume

    emit(resume(settings, args.queues), render_counts, as_json=args.json)
    return 0
