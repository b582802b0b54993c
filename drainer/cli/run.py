"""Draining: ``drainer run-once``, ``drainer demo`` and the always-on ``drainer worker``."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from drainer.cli._base import add_command
from drainer.cli._output import print_json, seconds_arg, stdout_for_reports_only
from drainer.errors import ConfigError, DrainerError

if TYPE_CHECKING:
    from drainer.settings import Settings

logger = logging.getLogger("drainer.worker")


# -- run-once -------------------------------------------------------------------------------------


def configure_run_once(sub: Any) -> None:
    add_command(sub, "run-once", "Drain every due job once, run maintenance, print the run "
                "report, exit.", run_once_command)


def run_once_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.cli._progress import progress_printer
    from drainer.drain import run_once

    progress = progress_printer()
    try:
        with stdout_for_reports_only():  # a handler's print() goes to stderr
            report = run_once(settings, handle_signals=True, progress=progress)
    finally:
        if progress is not None:
            progress.close()
    log_where_to_look(report.run_id)  # the report stays the last line on a terminal
    print_json(report.as_dict())
    return 0


def log_where_to_look(run_id: str) -> None:
    """The run report's last line: where the jobs of this run are (the run_id column)."""
    logging.getLogger("drainer.drain").info(
        "jobs of this run: drainer jobs --run %s", run_id, extra={"run_id": run_id})


# -- demo -----------------------------------------------------------------------------------------


def configure_demo(sub: Any) -> None:
    p = add_command(sub, "demo", "Run the whole flow on a throwaway embedded PostgreSQL (or "
                    "DRAINER_DATABASE_URL).", demo_command)
    p.add_argument("--jobs", type=int, default=200, help="Sample jobs to enqueue "
                   "[default: 200].")
    p.add_argument("--keep", action="store_true", help="Keep the demo's schema afterwards "
                   "(on DRAINER_DATABASE_URL).")


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def demo_command(args: argparse.Namespace, settings: Settings) -> int:
    from psycopg import sql
    from pydantic import SecretStr

    from drainer.cli.status import render_status
    from drainer.db import connect
    from drainer.demo import demo_database, demo_jobs, demo_registry
    from drainer.drain import run_once
    from drainer.migrate import migrate
    from drainer.producer import enqueue_many
    from drainer.status import collect_status

    if settings.database_url is None:
        _say("demo: no DRAINER_DATABASE_URL set, starting a throwaway embedded PostgreSQL ...")
    with stdout_for_reports_only(), demo_database(settings) as (url, embedded):
        schema = settings.schema_name if embedded else f"drainer_demo_{uuid.uuid4().hex[:8]}"
        run_settings = settings.model_copy(update={
            "database_url": SecretStr(url),
            "schema_name": schema,
            # a short backoff so the demo can show retries succeeding (default 10 s)
            "retry_base": min(settings.retry_base, 1.0),
        })
        try:
            with connect(run_settings) as conn:
                result = migrate(conn, schema, run_settings.table)
                _say(f"demo: migrated {schema}.{run_settings.table} to version "
                     f"{result.to_version}")
                enq = enqueue_many(conn, demo_jobs(args.jobs), schema=schema,
                                   table=run_settings.table)
                _say(f"demo: enqueued {enq.enqueued} jobs on emails, webhooks and reports")
            _say(render_status(collect_status(run_settings)))
            _say("\ndemo: draining (run-once) ...")
            report = run_once(run_settings, registry=demo_registry())
            print_json(report.as_dict())
            _say(f"demo: {report.succeeded} succeeded, {report.retried} wait for a retry "
                 f"(backoff {run_settings.retry_base:g}s * 2^attempts), {report.failed} "
                 f"failed, in {report.duration_s:.2f}s with one connection, now closed.")
            if report.next_due_at:
                wait = (datetime.fromisoformat(report.next_due_at)
                        - datetime.now(timezone.utc)).total_seconds()
                _say(f"\ndemo: no connection open; waking again in {max(wait, 0):.1f}s "
                     "when the retries are due ...")
                time.sleep(max(wait, 0) + 0.1)
                report = run_once(run_settings, registry=demo_registry())
                print_json(report.as_dict())
                _say(f"demo: second drain: {report.succeeded} succeeded, {report.failed} "
                     "failed.")
            _say("")
            _say(render_status(collect_status(run_settings)))
        finally:
            if not embedded and not args.keep:
                with connect(run_settings) as conn:
                    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                        sql.Identifier(schema)))
    return 0


# -- worker ---------------------------------------------------------------------------------------


def configure_worker(sub: Any) -> None:
    p = add_command(sub, "worker", "Always-on worker: LISTEN/NOTIFY on a direct connection "
                    "plus a fallback poll (keeps the compute awake).", worker_command)
    p.add_argument("--max-poll-interval", metavar="DURATION", default="60",
                   help="Longest fallback poll interval while empty: seconds, or 30s, 5m "
                   "[default: 60s].")
    p.add_argument("--min-poll-interval", metavar="DURATION", default="1",
                   help="First fallback poll interval after work was seen; doubles while "
                   "the queue stays empty [default: 1s].")


def _poll_interval(flag: str, value: str) -> float:
    seconds = seconds_arg(flag, value)
    if seconds <= 0:
        raise ConfigError(f"{flag} must be positive")
    return seconds


def _warn_without_notify_trigger(settings: Settings, max_poll: float) -> bool:
    """Say loudly at start when the NOTIFY trigger is missing (the worker then only polls).

    True when it is installed. One short connection; a database that cannot be reached
    is left to the worker's own reconnect loop.
    """
    import psycopg

    from drainer.db import Queries, connect

    try:
        with connect(settings) as conn:
            rows = Queries(conn, settings.schema_name, settings.table).fetch_dicts(
                "notify_trigger_installed", {"schema": settings.schema_name,
                                             "table": settings.table,
                                             "trigger": f"{settings.table}_notify"})
    except (psycopg.Error, DrainerError):
        return True
    if rows and rows[0]["installed"]:
        return True
    logger.warning(
        "NO NOTIFY TRIGGER on %s.%s: this worker will not hear new jobs; it falls back to "
        "polling (every %gs at most, --max-poll-interval). Install the trigger with: "
        "drainer migrate --notify-trigger", settings.schema_name, settings.table, max_poll,
        extra={"notify_trigger": False})
    return False


def worker_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer._signals import stop_on_signals
    from drainer.drain import resolve_queues
    from drainer.registry import default_registry
    from drainer.worker import Worker, warn_at_start

    min_poll = _poll_interval("--min-poll-interval", args.min_poll_interval)
    max_poll = _poll_interval("--max-poll-interval", args.max_poll_interval)
    if min_poll > max_poll:
        raise ConfigError("--min-poll-interval must not be longer than --max-poll-interval")
    settings.dsn  # noqa: B018 - a missing database URL is a configuration error (exit 2)
    queues = resolve_queues(settings, default_registry)
    warn_at_start(settings, min_poll, max_poll)
    _warn_without_notify_trigger(settings, max_poll)
    stop = threading.Event()

    def stopping(name: str) -> None:
        logger.info("received %s: stopping (no new claims; running jobs get the grace "
                    "period)", name)

    with stop_on_signals(stop, stopping), stdout_for_reports_only():
        stats = Worker(settings, queues, min_poll=min_poll, max_poll=max_poll,
                       stop=stop).run()
    print_json(vars(stats))
    return 0
