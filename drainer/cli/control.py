"""Changing jobs and queues: ``drainer retry``, ``cancel`` and ``purge`` (jobs), ``pause``,
``resume`` and ``limit`` (queues). Each touches only what it names and prints what it
changed: counts and ids, as JSON or as text on a terminal."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from drainer.cli._base import add_command, any_case
from drainer.cli._output import JSON_HELP, emit, job_id, positive_int, seconds_arg
from drainer.errors import EXIT_ERROR, ConfigError
from drainer.ops import PURGEABLE

if TYPE_CHECKING:
    from drainer.settings import Settings

#: The longest --older-than of purge (now() minus more is out of PostgreSQL's range).
MAX_PURGE_AGE_S = 36500 * 86400.0


# -- retry, cancel, purge -------------------------------------------------------------------------


def configure_retry(sub: Any) -> None:
    p = add_command(sub, "retry", "Put failed jobs back in the queue (by id, queue, or all).",
                    retry_command, description=(
                        "Put failed jobs back in the queue: status queued, attempts 0, due "
                        "now (last_error is kept until the job runs again). Give exactly one "
                        "of: job ids (drainer retry 7 8, or --id 7 8), --queue, --all-failed. "
                        "Cancelled jobs come back only by id: --queue and --all-failed leave "
                        "them cancelled. Jobs whose dedup key is now held by a queued or "
                        "running job, and jobs cancelled while running whose owner's lease "
                        "has not run out yet, are skipped and counted; nothing else is "
                        "touched. Prints the counts; exit 1 when none of the ids given "
                        "exists."))
    which = p.add_mutually_exclusive_group(required=True)
    _add_ids(which, "These failed or cancelled jobs (ids that are neither are counted as "
             "not_failed / not_found and left alone; unknown ids are named on stderr, exit "
             "1 when none of them exists).")
    which.add_argument("--queue", dest="job_queue", metavar="QUEUE",
                       help="Every failed job of this queue (not the cancelled ones).")
    which.add_argument("--all-failed", action="store_true",
                       help="Every failed job of every queue (not the cancelled ones).")
    p.add_argument("--dry-run", action="store_true",
                   help="Report what would be retried; change nothing.")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def retry_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.ops import retry_jobs

    ids = _ids_given(args)
    report = retry_jobs(settings, ids=ids, queue=args.job_queue,
                        all_failed=args.all_failed, dry_run=args.dry_run)
    emit(report, render_counts, as_json=args.json)
    return _ids_not_found("retry", ids, report, settings)


def configure_cancel(sub: Any) -> None:
    p = add_command(sub, "cancel", "Cancel queued or running jobs by id (drainer cancel 7 8).",
                    cancel_command,
                    description=(
                        "Cancel jobs: queued and running jobs get the status cancelled "
                        "(last_error 'cancelled'), apart from failed ones: retry --all-failed "
                        "and --queue leave them, retry ID takes one back. A running job's "
                        "owner notices at its next heartbeat "
                        "(within about two thirds of the lease), sets job.cancelled so the "
                        "handler can stop, and its outcome is not written; a handler that "
                        "ignores job.cancelled runs to its end. Finished jobs are "
                        "left alone; jobs locked by a transaction (a transaction-mode job in "
                        "flight) are counted as busy. Prints the counts; exit 1 when none "
                        "of the ids given exists."))
    _add_ids(p.add_mutually_exclusive_group(required=True), "The jobs to cancel (unknown "
             "ids are counted as not_found and named on stderr; exit 1 when none of them "
             "exists).")
    p.add_argument("--dry-run", action="store_true",
                   help="Report what would be cancelled; change nothing.")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def cancel_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.ops import cancel_jobs

    ids = _ids_given(args)
    report = cancel_jobs(settings, ids or [], dry_run=args.dry_run)
    emit(report, render_counts, as_json=args.json)
    return _ids_not_found("cancel", ids, report, settings)


def _add_ids(group: argparse._MutuallyExclusiveGroup, help_text: str) -> None:
    """The job ids, positional (``drainer retry 7 8``, as ``drainer show 7``) or with
    ``--id 7 8``: one form or the other."""
    # default=[]: argparse counts a positional that got nothing as given unless its value
    # is the default itself, and the group would refuse --queue beside it
    group.add_argument("id_args", metavar="ID", type=job_id, nargs="*", default=[],
                       help=help_text)
    group.add_argument("--id", dest="ids", metavar="N", type=job_id, nargs="+",
                       action="extend", help="The same ids as a flag.")


def _ids_given(args: argparse.Namespace) -> list[int] | None:
    return list(args.id_args) or args.ids


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
    p = add_command(sub, "purge", "Delete old done, failed or cancelled jobs now (manual "
                    "archival).",
                    purge_command, description=(
                        "Delete finished jobs now (manual archival), in batches of "
                        "DRAINER_ARCHIVE_BATCH_SIZE rows a statement. Queued and running "
                        "jobs are never purged. Prints the count."))
    p.add_argument("--status", required=True, choices=PURGEABLE,
                   type=any_case("--status", PURGEABLE),
                   help="Which finished jobs: done, failed (the dead-letter queue) or "
                   "cancelled.")
    p.add_argument("--older-than", required=True, metavar="AGE",
                   help="Only jobs finished longer ago than this: seconds or 30s, 15m, "
                   "12h, 7d (0 = all of them).")
    p.add_argument("--dry-run", action="store_true",
                   help="Count what would be purged; change nothing.")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def purge_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.ops import purge_jobs

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
    from drainer.ops import pause

    report = pause(settings, args.queues)
    emit(report, render_counts, as_json=args.json)
    _warn_never_seen("pause", report, settings, "paused")
    return 0


def _warn_never_seen(command: str, report: dict[str, Any], settings: Settings,
                     done: str) -> None:
    """One warning line on stderr for queues that no job ever had (as enqueue's)."""
    unseen = report.get("never_seen") or []
    if not unseen:
        return
    names = ", ".join(repr(n) for n in unseen)
    which = "queue" if len(unseen) == 1 else "queues"
    sys.stderr.write(f"drainer {command}: warning: {which} {names} never seen in "
                     f"{settings.schema_name}.{settings.table} (no job of it, of any status): "
                     f"a misspelt queue name? {done.capitalize()} all the same.\n")


def configure_resume(sub: Any) -> None:
    p = add_command(sub, "resume", "Resume paused queues.", resume_command, description=(
        "Resume paused queues: drainers claim their jobs again from their next run. "
        "Prints what changed."))
    p.add_argument("queues", metavar="QUEUE", nargs="+", help="The queues to resume.")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def resume_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.ops import resume

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
    from drainer.ops import limit

    report = limit(settings, args.queues, max_running=args.limit_max_running,
                   rate=args.limit_rate, clear_max_running=args.clear or args.clear_max_running,
                   clear_rate=args.clear or args.clear_rate)
    emit(report, render_limits, as_json=args.json)
    _warn_never_seen("limit", report, settings, "limited")
    return 0


# -- text on a terminal ---------------------------------------------------------------------------


def render_counts(report: dict[str, Any]) -> str:
    """The counts on one line (the zero ones left out, but for what the command is for),
    then each list of ids on its own line."""
    head = "dry run, nothing changed: " if report.get("dry_run") else ""
    counts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in report.items()
                       if isinstance(v, int) and not isinstance(v, bool) and k != "statements"
                       and (v or k in ("retried", "cancelled", "purged")))
    lines = [head + counts]
    for k, v in report.items():
        if isinstance(v, list) and v:
            lines.append(f"  {k.replace('_', ' ')}: {', '.join(map(str, v))}")
    return "\n".join(lines)


def render_limits(report: dict[str, Any]) -> str:
    """One line a queue: the operator's max_running and rate."""
    lines = []
    for e in report["limits"]:
        mr = "-" if e["max_running"] is None else str(e["max_running"])
        rate = e["rate_limit"] or "-"
        lines.append(f"{e['queue']}: max_running {mr}, rate {rate} (operator's; '-': the "
                     "setting's or the task's applies)")
    return "\n".join(lines)
