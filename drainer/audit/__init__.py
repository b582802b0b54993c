"""``drainer audit``: sample pg_stat_activity and name what keeps a serverless compute awake.

The rules are those of a compute's activity monitor as "Postgres as a job queue: using
FOR UPDATE SKIP LOCKED correctly" describes it
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

import logging
import threading
from typing import TYPE_CHECKING

from drainer.audit.findings import (
    AuditResult,
    ClientFinding,
    SessionFinding,
    UnseenFinding,
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
from drainer.waking import IdleTimeout, idle_timeout_of

if TYPE_CHECKING:
    from drainer.settings import Settings

logger = logging.getLogger(__name__)

__all__ = [
    "COUNTERS_MIN_SERVER", "COUNTERS_SQL", "DEFAULT_DURATION_S", "HIDDEN_QUERY",
    "POLL_MIN_QUERIES", "POLL_STILL_GOING_PERIODS", "QUERY_CHARS", "RECONNECT_MIN_NEW",
    "SAMPLE_INTERVAL_S", "SAMPLE_SQL", "SHOWN_QUERY_CHARS", "Activity", "AuditResult",
    "ClientFinding", "IdleTimeout", "Sample", "SessionFilter", "SessionFinding", "SessionRow",
    "UnseenFinding", "audit", "judge", "sample_activity", "shorten",
]


def audit(settings: Settings, *, duration: float = DEFAULT_DURATION_S,
          filters: SessionFilter | None = None, idle: IdleTimeout | None = None,
          stop: threading.Event | None = None) -> AuditResult:
    """Sample for ``duration`` seconds and judge (the library form of ``drainer audit``)."""
    activity = sample_activity(settings, duration=duration, filters=filters, stop=stop)
    return judge(activity, idle or idle_timeout_of(settings))
