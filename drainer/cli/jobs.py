"""The jobs in the table: ``enqueue``, and the operator's ``jobs``, ``show``, ``retry``,
``cancel`` and ``purge`` (drainer/ops.py; each touches only what it names)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from drainer.cli._base import add_command, any_case
from drainer.cli._output import (
    JSON_HELP,
    emit,
    job_id,
    positive_int,
    print_json,
    queue_list,
    seconds_arg,
)
from drainer.errors import EXIT_ERROR, ConfigError
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
    p.add_argument("--priority", type=priority_arg, default=0,
                   help="Higher runs first (a 32-bit integer) [default: 0].")
    p.add_argument("--dedup-key", metavar="KEY", help="Skip the job when one with this key "
                   "is already queued or running.")


#: The range of the priority column (integer).
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1
#: The longest --older-than of purge (now() minus more is out of PostgreSQL's range).
MAX_PURGE_AGE_S = 36500 * 86400.0


def priority_arg(text: str) -> int:
    """argparse ``type=`` of --priority: an integer that fits the column."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise argparse.ArgumentTypeError(
            f"out of range: {text} (from {PRIORITY_MIN} to {PRIORITY_MAX})")
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (PostgreSQL's jsonb has no NaN or Infinity)")


def _check_storable(value: Any) -> None:
    """ValueError for what jsonb cannot store: NUL (\\u0000) and lone surrogates in strings."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str):
            if "\x00" in v:
                raise ValueError("\\u0000 in a string (PostgreSQL's jsonb cannot store it)")
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("a lone surrogate (\\ud800-\\udfff) in a string is not "
                                 "Unicode text") from None


def parse_json(text: str) -> Any:
    """A payload: strict JSON that jsonb can store, else ValueError (one line)."""
    value = json.loads(text, parse_constant=_refuse_constant)
    _check_storable(value)
    return value


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
            return [parse_json(args.payload)]
        except ValueError as exc:  # json.JSONDecodeError is one
            raise ConfigError(f"invalid JSON payload: {exc}") from None
    if _is_terminal(sys.stdin):
        sys.stderr.write("drainer enqueue: no JSON argument: reading one JSON payload a line "
                         "from stdin (end with Ctrl-D; nothing is enqueued before the end)\n")
        sys.stderr.flush()
    payloads = []
    for n, line in enumerate(sys.stdin, start=1):
        if not line.strip():
            continue
        try:
            payloads.append(parse_json(line))
        except ValueError as exc:
            raise ConfigError(
                f"stdin line {n}: invalid JSON: {exc}; nothing was enqueued"
            ) from None
    return payloads


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def enqueue_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.db import Queries, connect
    from drainer.migrate import check_schema
    from drainer.producer import JobSpec, enqueue, enqueue_many

    if not args.queue.strip():
        raise ConfigError("QUEUE must not be empty")
    run_at = _run_at(args)
    payloads = _parse_payloads(args)  # all parsed before anything is written
    if settings.app:
        _check_handler(settings.app, args.queue)
    common: dict[str, Any] = {"run_at": run_at, "priority": args.priority,
                              "max_attempts": settings.max_attempts,
                              "dedup_key": args.dedup_key}
    with connect(settings) as conn:
        q = Queries(conn, settings.schema_name, settings.table)
        check_schema(q)
        if not settings.app and not _seen(q, args.queue):
            sys.stderr.write(
                f"drainer enqueue: warning: queue {args.queue!r} has never been seen in "
                f"{settings.schema_name}.{settings.table} (no job of it, of any status): a "
                "misspelt queue name? The job is enqueued; pass --app to check the queue "
                "against your handlers.\n")
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


def _seen(q: Any, queue: str) -> bool:
    """Whether the queue has been seen; True when the role may not read the queue column
    (grants older than this check: no warning rather than a failed enqueue)."""
    import psycopg

    try:
        return bool(q.queue_seen(queue))
    except psycopg.errors.InsufficientPrivilege:
        if not q.conn.autocommit:
            q.conn.rollback()
        return True


def _check_handler(app: str, queue: str) -> None:
    """With --app: the queue must have a handler in it, or nothing would ever drain it."""
    from drainer.app import load_app
    from drainer.registry import default_registry

    load_app(app)
    if queue not in default_registry.tasks:
        known = ", ".join(default_registry.queues()) or "none"
        raise ConfigError(f"no handler for queue {queue!r} in {app} (handlers exist for: "
                          f"{known}); nothing was enqueued")


# -- jobs and show --------------------------------------------------------------------------------


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
    from drainer.ops import list_jobs, render_jobs, task_attempts_limits, with_attempts_applied

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
    from drainer.ops import get_job, render_job, task_attempts_limits, with_attempts_applied

    if (args.id is None) == (args.flag_id is None):
        raise ConfigError("show takes one job id: drainer show ID or drainer show --id ID")
    limits = task_attempts_limits(settings.app) if settings.app else None
    job = get_job(settings, args.id if args.id is not None else args.flag_id)
    if limits is not None:
        job = with_attempts_applied(job, limits)
    emit(job, render_job, as_json=args.json)
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
                        "else is touched. Prints the counts; exit 1 when none of the --id "
                        "given exists."))
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", dest="ids", metavar="N", type=job_id, nargs="+",
                       action="extend", help="These failed jobs (ids that are not failed "
                       "are counted as not_failed / not_found and left alone; unknown ids "
                       "are named on stderr, exit 1 when none of them exists).")
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
    return _ids_not_found("retry", args.ids, report, settings)


def configure_cancel(sub: Any) -> None:
    p = add_command(sub, "cancel", "Cancel queued or running jobs by id.", cancel_command,
                    description=(
                        "Cancel jobs: queued and running jobs become failed with last_error "
                        "'cancelled'. A running job's owner notices at its next heartbeat "
                        "(within about two thirds of the lease), sets job.cancelled so the "
                        "handler can stop, and its outcome is not written; a handler that "
                        "ignores job.cancelled runs to its end. Done and failed jobs are "
                        "left alone; jobs locked by a transaction (a transaction-mode job in "
                        "flight) are counted as busy. Prints the counts; exit 1 when none "
                        "of the ids given exists."))
    p.add_argument("--id", dest="ids", metavar="N", type=job_id, nargs="+",
                   action="extend", required=True, help="The jobs to cancel (unknown ids are "
                   "counted as not_found and named on stderr; exit 1 when none of them "
                   "exists).")
    p.add_argument("--dry-run", action="store_true",
                   help="Report what would be cancelled; change nothing.")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def cancel_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.ops import cancel_jobs, render_counts

    report = cancel_jobs(settings, args.ids, dry_run=args.dry_run)
    emit(report, render_counts, as_json=args.json)
    return _ids_not_found("cancel", args.ids, report, settings)


def _ids_not_found(command: str, ids: list[int] | None, report: dict[str, Any],
                   settings: Settings) -> int:
    """After the report: one line on stderr naming the ``--id`` values not in the table.
    Exit 1 when none of them is (as ``drainer show`` of an unknown id), else a warning and
    exit 0 (the others were handled)."""
    missing = int(report.get("not_found", 0))
    if not ids or not missing:
        return 0
    named = [str(i) for i in report.get("not_found_ids", [])]
    if missing > len(named):
        named.append(f"and {missing - len(named)} more")
    where = f"{settings.schema_name}.{settings.table}"
    job = "job" if missing == 1 else "jobs"
    if missing >= len(set(ids)):
        sys.stderr.write(f"drainer {command}: no {job} {', '.join(named)} in {where}\n")
        return EXIT_ERROR
    sys.stderr.write(f"drainer {command}: warning: no {job} {', '.join(named)} in {where} "
                     "(counted as not_found; the other ids were handled)\n")
    return 0


def configure_purge(sub: Any) -> None:
    p = add_command(sub, "purge", "Delete old done or failed jobs now (manual archival).",
                    purge_command, description=(
                        "Delete finished jobs now (manual archival), in batches of "
                        "DRAINER_ARCHIVE_BATCH_SIZE rows a statement. Queued and running "
                        "jobs are never purged. Prints the count."))
    p.add_argument("--status", required=True, choices=PURGEABLE,
                   type=any_case("--status", PURGEABLE),
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
    if older_than > MAX_PURGE_AGE_S:
        raise ConfigError(f"--older-than: at most {MAX_PURGE_AGE_S / 86400:.0f}d, got "
                          f"{args.older_than!r}")
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


# -- limit ----------------------------------------------------------------------------------------


def configure_limit(sub: Any) -> None:
    p = add_command(sub, "limit", "Set a queue's limits: max running, rate.",
                    limit_command, description=(
                        "An operator's per-queue limits, across all drainers, without a "
                        "deploy: --max-running N (at most N jobs of the queue running at "
                        "once) and --rate COUNT/PERIOD (at most COUNT claimed in any "
                        "PERIOD: 10/m, 5/s, 100/h). They override --max-running / "
                        "--rate-limit of the drainers and the task's, from each drainer's next "
                        "run (a run reads them once, at its start; jobs already running "
                        "finish). --clear drops the operator's limits (the setting's or the "
                        "task's apply again). With no option, prints the queues' limits. "
                        "`drainer status` lists them."))
    p.add_argument("queues", metavar="QUEUE", nargs="+", help="The queues to limit.")
    p.add_argument("--max-running", dest="limit_max_running", metavar="N",
                   type=positive_int, help="At most N jobs of the queue running at once.")
    p.add_argument("--rate", dest="limit_rate", metavar="COUNT/PERIOD",
                   help="At most COUNT jobs claimed in any PERIOD (10/m, 5/s, 2/30s).")
    p.add_argument("--clear", action="store_true",
                   help="Drop the operator's max_running and rate of these queues.")
    p.add_argument("--clear-max-running", action="store_true",
                   help="Drop the operator's max_running only.")
    p.add_argument("--clear-rate", action="store_true", help="Drop the operator's rate only.")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def limit_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.ops import limit, render_limits

    emit(limit(settings, args.queues, max_running=args.limit_max_running,
               rate=args.limit_rate, clear_max_running=args.clear or args.clear_max_running,
               clear_rate=args.clear or args.clear_rate), render_limits, as_json=args.json)
    return 0
