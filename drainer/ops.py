"""What the operator's commands do: list and show jobs; retry, cancel and purge them;
pause, resume and limit queues.

Each is a function that takes the settings and returns data: a list of rows or a small
dict of counts and ids (drainer/cli/ prints it as JSON or as text). Each opens one
connection, runs a few statements of ``sql/queries.sql``, and touches only the jobs or
queues it names.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from drainer._text import iso
from drainer.errors import ConfigError, DrainerError

if TYPE_CHECKING:
    from drainer.db import Queries
    from drainer.queue_limits import Rate
    from drainer.settings import Settings

logger = logging.getLogger(__name__)

#: Statuses a job can have (the table's CHECK constraint).
STATUSES = ("queued", "running", "done", "failed", "cancelled")
#: Statuses `drainer purge` may delete: finished jobs only.
PURGEABLE = ("done", "failed", "cancelled")
#: Statuses of finished jobs.
FINISHED = ("done", "failed", "cancelled")
#: Default number of rows `drainer jobs` lists.
DEFAULT_LIST_LIMIT = 50
#: Longest list of ids echoed in a report (the counts are always complete).
MAX_IDS_SHOWN = 100
#: Times retry runs again when a concurrent enqueue takes a dedup key between its steps.
RETRY_CONFLICT_ATTEMPTS = 3


class JobNotFound(DrainerError):
    """``drainer show`` of an id that is not in the table (exit 1)."""


@contextmanager
def _queries(settings: Settings) -> Iterator[Queries]:
    """One connection, schema checked, closed on exit."""
    from drainer.db import Queries, connect
    from drainer.migrate import check_schema

    with connect(settings) as conn:
        q = Queries(conn, settings.schema_name, settings.table)
        check_schema(q)
        yield q


def _row(d: dict[str, Any]) -> dict[str, Any]:
    return {k: iso(v) for k, v in d.items()}


def _ids(ids: Sequence[int]) -> list[int]:
    return sorted(ids)[:MAX_IDS_SHOWN]


# -- jobs and show --------------------------------------------------------------------------------


def list_jobs(settings: Settings, *, queue: str | None = None, status: str | None = None,
              limit: int = DEFAULT_LIST_LIMIT, queues: Sequence[str] | None = None,
              run_id: str | None = None) -> list[dict[str, Any]]:
    """The newest ``limit`` jobs, of these queues (``queue``: one), a status, the run that
    last claimed them (``run_id``, the run report's) when given."""
    if status is not None and status not in STATUSES:
        raise ConfigError(f"--status must be one of {', '.join(STATUSES)}")
    if limit < 1:
        raise ConfigError("--limit must be at least 1")
    wanted = [*(queues or ()), *([queue] if queue is not None else [])] or None
    with _queries(settings) as q:
        rows = q.fetch_dicts("job_list", {"queues": wanted, "status": status, "limit": limit,
                                          "run_id": run_id})
    return [_row(r) for r in rows]


def get_job(settings: Settings, job_id: int) -> dict[str, Any]:
    """One job with every column and its full last_error; JobNotFound when absent."""
    with _queries(settings) as q:
        rows = q.fetch_dicts("job_get", {"id": job_id})
    if not rows:
        raise JobNotFound(f"no job {job_id} in {settings.schema_name}.{settings.table}")
    return _row(rows[0])


# -- retry ----------------------------------------------------------------------------------------


def retry_jobs(settings: Settings, *, ids: Sequence[int] | None = None,
               queue: str | None = None, all_failed: bool = False,
               dry_run: bool = False) -> dict[str, Any]:
    """Failed jobs back to queued, attempts reset to 0, due now.

    Exactly one selector: ``ids`` (failed or cancelled jobs), ``queue`` (its failed jobs)
    or ``all_failed``: cancelled jobs come back only by id. Jobs
    whose dedup_key is now held by a queued or running job are skipped and reported
    (the unique index allows one), as are jobs cancelled while running whose owner's
    lease has not yet run out, and named ids that are not failed.
    """
    import psycopg

    chosen = [bool(ids), queue is not None, all_failed]
    if sum(chosen) != 1:
        raise ConfigError("retry needs exactly one of --id, --queue, --all-failed")
    id_list = sorted(set(ids)) if ids else None
    with _queries(settings) as q:
        for attempt in range(1, RETRY_CONFLICT_ATTEMPTS + 1):
            try:
                with q.conn.transaction(force_rollback=dry_run):
                    plan = q.fetch_dicts("retry_plan", {"ids": id_list, "queue": queue})
                    go = [p["id"] for p in plan if p["verdict"] == "retry"]
                    retried = go if dry_run or not go else [
                        r["id"] for r in q.fetch_dicts("retry_many", {"ids": go})]
                break
            except psycopg.errors.UniqueViolation:
                # a producer enqueued a job with one of these dedup keys between the
                # plan and the update: plan again, it will now be skipped
                if attempt == RETRY_CONFLICT_ATTEMPTS:
                    raise DrainerError("retry: dedup keys kept being taken by concurrent "
                                       "enqueues; nothing was changed, try again") from None
                logger.info("retry: a dedup key was taken meanwhile; planning again")
        others = _explain(q, id_list, plan)
    by = {v: [p for p in plan if p["verdict"] == v]
          for v in ("dedup_taken", "dedup_duplicate", "lease_active")}
    out: dict[str, Any] = {
        "dry_run": dry_run,
        "retried": len(retried),
        "skipped_dedup": len(by["dedup_taken"]) + len(by["dedup_duplicate"]),
        "skipped_lease_active": len(by["lease_active"]),
        "not_failed": len(others["not_failed"]),
        "not_found": len(others["not_found"]),
        "busy": len(others["busy"]),
    }
    if id_list is not None:
        out["retried_ids"] = _ids(retried)
    if out["skipped_dedup"]:
        out["skipped_dedup_ids"] = _ids([p["id"] for p in by["dedup_taken"]
                                         + by["dedup_duplicate"]])
        out["skipped_dedup_keys"] = sorted({p["dedup_key"] for p in by["dedup_taken"]
                                            + by["dedup_duplicate"]})[:MAX_IDS_SHOWN]
    if out["skipped_lease_active"]:
        out["skipped_lease_active_ids"] = _ids([p["id"] for p in by["lease_active"]])
    for key in ("not_failed", "not_found", "busy"):
        if others[key]:
            out[f"{key}_ids"] = _ids(others[key])
    if not dry_run:
        logger.info("retry: %d failed jobs back to queued (%s)", len(retried),
                    f"ids {_ids(retried)}" if id_list else f"queue {queue!r}" if queue else
                    "all failed", extra={k: v for k, v in out.items() if isinstance(v, int)})
    return out


def _explain(q: Queries, ids: list[int] | None, plan: list[dict[str, Any]]
             ) -> dict[str, list[int]]:
    """For named ids the plan left out: not found, not failed, or locked by someone else."""
    out: dict[str, list[int]] = {"not_failed": [], "not_found": [], "busy": []}
    if ids is None:
        return out
    planned = {p["id"] for p in plan}
    rest = [i for i in ids if i not in planned]
    if not rest:
        return out
    found = {r["id"]: r["status"] for r in q.fetch_dicts("job_status_many", {"ids": rest})}
    for i in rest:
        status = found.get(i)
        if status is None:
            out["not_found"].append(i)
        elif status in ("failed", "cancelled"):
            out["busy"].append(i)  # locked by a concurrent retry: SKIP LOCKED left it
        else:
            out["not_failed"].append(i)
    return out


# -- cancel ---------------------------------------------------------------------------------------


def cancel_jobs(settings: Settings, ids: Sequence[int], *, dry_run: bool = False
                ) -> dict[str, Any]:
    """Queued and running jobs -> cancelled (last_error 'cancelled'); ``retry`` takes them
    back by id only (``--all-failed`` and ``--queue`` leave them).

    A running job is cancelled in the table at once; its owner learns it at its next
    heartbeat (the lease extension updates 0 rows), sets ``job.cancelled`` so the handler
    can stop, and its outcome is not written. Finished jobs are left alone.
    """
    if not ids:
        raise ConfigError("cancel needs at least one --id")
    id_list = sorted(set(ids))
    with _queries(settings) as q:
        before = {r["id"]: r["status"]
                  for r in q.fetch_dicts("job_status_many", {"ids": id_list})}
        if dry_run:
            hit = {i: s for i, s in before.items() if s in ("queued", "running")}
        else:
            hit = {r["id"]: r["was"] for r in q.fetch_dicts("cancel_many", {"ids": id_list})}
    queued = [i for i, s in hit.items() if s == "queued"]
    running = [i for i, s in hit.items() if s == "running"]
    finished = [i for i in id_list if i not in hit and before.get(i) in FINISHED]
    missing = [i for i in id_list if i not in before]
    busy = [i for i in id_list if i not in hit and before.get(i) in ("queued", "running")]
    out: dict[str, Any] = {
        "dry_run": dry_run,
        "cancelled": len(hit),
        "cancelled_queued": len(queued),
        "cancelled_running": len(running),
        "already_finished": len(finished),
        "not_found": len(missing),
        "busy": len(busy),
        "cancelled_ids": _ids(list(hit)),
    }
    for key, vals in (("already_finished_ids", finished), ("not_found_ids", missing),
                      ("busy_ids", busy)):
        if vals:
            out[key] = _ids(vals)
    if not dry_run:
        logger.info("cancel: %d jobs cancelled (%d queued, %d running)", len(hit),
                    len(queued), len(running), extra={"cancelled_ids": out["cancelled_ids"]})
    return out


# -- purge ----------------------------------------------------------------------------------------


def purge_jobs(settings: Settings, *, status: str, older_than: float,
               dry_run: bool = False) -> dict[str, Any]:
    """Delete ``status`` jobs (done or failed) finished more than ``older_than`` seconds ago,
    in batches of ``archive_batch_size`` rows a statement."""
    if status not in PURGEABLE:
        raise ConfigError(f"--status must be one of {', '.join(PURGEABLE)} (queued and "
                          "running jobs are never purged; cancel them first)")
    if older_than < 0:
        raise ConfigError("--older-than must not be negative")
    batch = settings.archive_batch_size
    deleted = 0
    statements = 0
    with _queries(settings) as q:
        if dry_run:
            rows = q.fetch_dicts("purge_count", {"status": status, "older_than": older_than})
            deleted = int(rows[0]["count"])
            statements = 1
        else:
            deleted, statements = purge_batches(q, status, older_than, batch)
    if not dry_run:
        logger.info("purge: deleted %d %s jobs finished more than %.0fs ago", deleted, status,
                    older_than)
    return {"dry_run": dry_run, "status": status, "older_than_s": older_than,
            "purged": deleted, "statements": statements}


def purge_batches(q: Queries, status: str, older_than: float, batch: int) -> tuple[int, int]:
    """The deletes of `drainer purge`: batches of ``batch`` rows until one comes back short.
    Returns (rows deleted, statements run)."""
    deleted = statements = 0
    while True:
        n = q.archive_batch(status, older_than, batch, move=False)
        statements += 1
        deleted += n
        if n < batch:
            return deleted, statements


# -- pause and resume -----------------------------------------------------------------------------


def pause(settings: Settings, queues: Sequence[str]) -> dict[str, Any]:
    """Pause ``queues``: no drainer claims their jobs from its next run on (a run reads
    the paused queues once, at its start); jobs keep arriving. Idempotent.
    ``never_seen`` (when any): the queues paused that had no job and no operator's row
    before (a misspelt name?)."""
    names = _queue_names(queues)
    with _queries(settings) as q:
        unseen = _never_seen(q, names)
        changed = q.pause_queues(names)
    return {"paused": sorted(changed), "already_paused": sorted(set(names) - set(changed)),
            **({"never_seen": unseen} if unseen else {})}


def _never_seen(q: Queries, names: list[str]) -> list[str]:
    """The queues of ``names`` with no job of any status and no operator's row; none when
    the role may not read the queue column (no warning rather than a failed command)."""
    import psycopg

    try:
        return sorted(r["queue"] for r in q.fetch_dicts("queues_never_seen",
                                                          {"queues": names}))
    except psycopg.errors.InsufficientPrivilege:
        return []


def resume(settings: Settings, queues: Sequence[str]) -> dict[str, Any]:
    """Resume paused ``queues``: claimed again from each drainer's next run."""
    names = _queue_names(queues)
    with _queries(settings) as q:
        changed = q.resume_queues(names)
    return {"resumed": sorted(changed),
            "not_paused": sorted(set(names) - set(changed))}


def limit(settings: Settings, queues: Sequence[str], *, max_running: int | None = None,
          rate: str | Rate | None = None, clear_max_running: bool = False,
          clear_rate: bool = False) -> dict[str, Any]:
    """The operator's limits of ``queues`` (``drainer limit``): ``max_running`` (at most N
    running across all drainers), ``rate`` (``"10/m"``: at most 10 claimed in any minute);
    ``clear_*`` drops the operator's, so the setting's or the task's applies again. They
    override the settings and the tasks from each drainer's next run. With nothing to
    change, the limits as they are. ``never_seen`` (when any): the queues given a limit that
    had no job and no operator's row before (a misspelt name?)."""
    from drainer.queue_limits import parse_max_running, parse_rate

    names = _queue_names(queues)
    try:
        cap = None if max_running is None else parse_max_running(max_running)
        parsed = None if rate is None else parse_rate(rate)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if (cap is not None and clear_max_running) or (parsed is not None and clear_rate):
        raise ConfigError("set a limit or clear it, not both")
    unseen: list[str] = []
    with _queries(settings) as q:
        if cap is None and parsed is None and not clear_max_running and not clear_rate:
            rows = [r for r in q.fetch_dicts("queue_limits") if r["queue"] in names]
        else:
            if cap is not None or parsed is not None:
                unseen = _never_seen(q, names)
            rows = q.set_limits(names, max_running=cap, rate=parsed,
                                clear_max_running=clear_max_running, clear_rate=clear_rate)
    by_queue = {r["queue"]: r for r in rows}
    return {"limits": [_limit_entry(name, by_queue.get(name, {})) for name in names],
            **({"never_seen": unseen} if unseen else {})}


def _limit_entry(queue: str, row: dict[str, Any]) -> dict[str, Any]:
    from drainer.queue_limits import Rate

    rate = None if row.get("rate_count") is None else str(
        Rate(int(row["rate_count"]), float(row["rate_period_s"])))
    next_at = row.get("rate_next_at")
    return {"queue": queue, "max_running": row.get("max_running"), "rate_limit": rate,
            **({"rate_next_at": next_at.isoformat()} if next_at is not None else {})}


def _queue_names(queues: Sequence[str]) -> list[str]:
    names = list(dict.fromkeys(queues))
    if not names or any(not n for n in names):
        raise ConfigError("name at least one queue (non-empty names)")
    return names


# -- max_attempts: the task's or the row's --------------------------------------------------------


def task_attempts_limits(app: str) -> dict[str, int | None]:
    """Each queue of the app (``--app``) -> its task's max_attempts (None: the row's applies).

    At run time a task's ``@task(max_attempts=...)`` (or its ``Retry(max_attempts=...)``)
    overrides the row's max_attempts column, for the failure and for the reaper alike."""
    from drainer.app import load_app
    from drainer.registry import default_registry

    load_app(app)
    return {queue: t.attempts_limit for queue, t in default_registry.tasks.items()}


def with_attempts_applied(row: dict[str, Any], limits: dict[str, int | None]
                          ) -> dict[str, Any]:
    """``row`` with ``max_attempts_applied`` (what a drain applies) and
    ``max_attempts_source`` ("task", or "row" when the task sets none or the app has no
    handler for the queue); the row's own ``max_attempts`` is kept as it is."""
    limit = limits.get(row["queue"])
    return {**row, "max_attempts_applied": row["max_attempts"] if limit is None else limit,
            "max_attempts_source": "row" if limit is None else "task"}
