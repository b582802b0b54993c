"""``drainer enqueue``: one job from a JSON argument, or many from JSON lines on stdin."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from drainer.cli._base import add_command
from drainer.cli._output import print_json, seconds_arg
from drainer.errors import ConfigError

if TYPE_CHECKING:
    from drainer.registry import Task
    from drainer.settings import Settings


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
    max_attempts = settings.max_attempts
    if settings.app:
        task = _check_handler(settings.app, args.queue)
        # the task's, as task.enqueue(...) stores it, unless --max-attempts says otherwise
        if task.max_attempts is not None and "max_attempts" not in settings.model_fields_set:
            max_attempts = task.max_attempts
    common: dict[str, Any] = {"run_at": run_at, "priority": args.priority,
                              "max_attempts": max_attempts, "dedup_key": args.dedup_key}
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


def _check_handler(app: str, queue: str) -> Task:
    """With --app: the queue's task; the queue must have one, or nothing would ever drain
    it."""
    from drainer.app import load_app
    from drainer.registry import default_registry

    load_app(app)
    task = default_registry.tasks.get(queue)
    if task is None:
        known = ", ".join(default_registry.queues()) or "none"
        raise ConfigError(f"no handler for queue {queue!r} in {app} (handlers exist for: "
                          f"{known}); nothing was enqueued")
    return task
