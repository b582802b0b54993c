"""Command implementations that are more than a call into the library."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

from drainer.errors import ConfigError
from drainer.settings import Settings, parse_duration


def _run_at(args: argparse.Namespace) -> datetime | None:
    if args.delay is not None:
        try:
            seconds = float(parse_duration(args.delay))
        except ValueError as exc:
            raise ConfigError(f"--delay: {exc}") from None
        if seconds < 0:
            raise ConfigError("--delay must not be negative")
        return datetime.now(timezone.utc) + timedelta(seconds=seconds)
    if args.run_at is not None:
        try:
            when = datetime.fromisoformat(args.run_at.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(f"--run-at: not an ISO 8601 time: {args.run_at!r}") from None
        return when if when.tzinfo else when.replace(tzinfo=timezone.utc)
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
    sys.stdout.write(json.dumps(out) + "\n")
    _fire_trigger(settings, out["enqueued"])
    return 0


def _fire_trigger(settings: Settings, enqueued: int) -> None:
    """After the commit, ask for a drain when a trigger URL is set (never loses the job)."""
    if not enqueued or not settings.trigger_url:
        return
    try:
        from drainer.trigger import fire
    except ImportError:
        return
    fire(settings)
