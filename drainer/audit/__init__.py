"""``drainer audit``: sample pg_stat_activity and name what keeps a serverless compute awake.

The rules are those of a compute's activity monitor as the Japanese article describes it
(it looks at the client sessions every 0.5 s):

- a session that is not idle (running a query, idle in transaction) is activity now;
- an idle session is activity as of its last state change (when its last query ended);
- a running autovacuum worker and a replication connection (walsender) keep it awake;
- a new connection is activity when it starts, even before its first query.

So an idle connection on its own lets the compute suspend (its last state change gets
older), while a client that polls more often than the idle timeout keeps it up all day.

By default every client backend of the server is examined, whatever its database: they
all run on the same compute, and any of them keeps it awake. ``--only-database``,
``--only-user`` and ``--only-application`` narrow that down. The audit's own session is
left out (it is activity too, while the audit runs: run it from where you would look).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from typing import TYPE_CHECKING

from drainer.audit.findings import (
    AuditResult,
    ClientFinding,
    SessionFinding,
    UnseenFinding,
    format_table,
)
from drainer.audit.judging import (
    HIDDEN_QUERY,
    POLL_MIN_QUERIES,
    POLL_STILL_GOING_PERIODS,
    RECONNECT_MIN_NEW,
    SHOWN_QUERY_CHARS,
    judge,
    shorten,
)
from drainer.audit.sampling import (
    COUNTERS_MIN_SERVER,
    COUNTERS_SQL,
    DEFAULT_DURATION_S,
    QUERY_CHARS,
    SAMPLE_INTERVAL_S,
    SAMPLE_SQL,
    Activity,
    Sample,
    SessionFilter,
    SessionRow,
    sample_activity,
)
from drainer.settings import parse_duration
from drainer.waking import IdleTimeout, fmt_seconds, idle_timeout_of

if TYPE_CHECKING:
    from drainer.settings import Settings

logger = logging.getLogger(__name__)

__all__ = [
    "COUNTERS_MIN_SERVER", "COUNTERS_SQL", "DEFAULT_DURATION_S", "HIDDEN_QUERY",
    "POLL_MIN_QUERIES", "POLL_STILL_GOING_PERIODS", "QUERY_CHARS", "RECONNECT_MIN_NEW",
    "SAMPLE_INTERVAL_S", "SAMPLE_SQL", "SHOWN_QUERY_CHARS", "Activity", "AuditResult",
    "ClientFinding", "IdleTimeout", "Sample", "SessionFilter", "SessionFinding", "SessionRow",
    "UnseenFinding", "audit", "format_table", "judge", "sample_activity", "shorten",
]


def audit(settings: Settings, *, duration: float = DEFAULT_DURATION_S,
          filters: SessionFilter | None = None, idle: IdleTimeout | None = None,
          stop: threading.Event | None = None) -> AuditResult:
    """Sample for ``duration`` seconds and judge (the library form of ``drainer audit``)."""
    activity = sample_activity(settings, duration=duration, filters=filters, stop=stop)
    return judge(activity, idle or idle_timeout_of(settings))


# -- the command ----------------------------------------------------------------------------------


def _filters_from_args(args: argparse.Namespace) -> SessionFilter:
    pids = None
    if getattr(args, "only_pid", None):
        try:
            pids = [int(p) for v in args.only_pid for p in v.split(",") if p.strip()]
        except ValueError:
            from drainer.errors import ConfigError

            raise ConfigError("--only-pid takes process ids (numbers)") from None
    return SessionFilter(databases=getattr(args, "only_database", None) or None,
                         users=getattr(args, "only_user", None) or None,
                         application_names=getattr(args, "only_application", None) or None,
                         pids=pids)


def audit_command(args: argparse.Namespace, settings: Settings) -> int:
    """``drainer audit``: exit 0 if the compute could suspend, 1 if something keeps it up."""
    from drainer.errors import ConfigError

    try:
        duration = float(parse_duration(args.duration))
    except ValueError as exc:
        raise ConfigError(f"--duration: {exc}") from None
    if duration <= 0:
        raise ConfigError("--duration must be more than 0 seconds")
    idle = idle_timeout_of(settings)
    if idle.assumed:
        logger.warning("idle timeout unknown: assuming %s (%s)", fmt_seconds(idle.seconds),
                       idle.source)
    result = audit(settings, duration=duration, filters=_filters_from_args(args), idle=idle)
    if args.json:
        sys.stdout.write(json.dumps(result.as_dict(), default=str) + "\n")
    else:
        sys.stdout.write(format_table(result))
    sys.stdout.flush()
    return 0 if result.could_suspend else 1
