"""Recurring jobs declared in code, kept in the jobs table: no process has to stay up.

A definition (``@task("digest", cron="0 8 * * *", timezone="Europe/Berlin")``, or
``drainer.recurring("digest", "0 8 * * mon-fri", key="weekday-digest", payload={...})``,
both in :mod:`drainer.registry`) lives in the app module; this module defines, checks and
syncs definitions and knows no registry. Its next occurrence lives in the table as an
ordinary queued job: ``run_at`` = the fire time, ``recurring_key`` / ``scheduled_for`` /
``recurring_hash`` naming the definition, the fire time and the definition's content (the
first two are the occurrence's identity, unique in the table; its ``dedup_key`` is NULL,
that namespace is the producers'), and
the fire time in the payload under :data:`SCHEDULED_FOR_KEY` (``job.scheduled_for`` on
the handler's :class:`~drainer.Job`). Any drain-and-exit run (cron, a Kubernetes CronJob,
Lambda, ``schedule --wake-policy known-work``) serves it, and the run report's
``next_due_at`` includes it.

Every drain syncs the definitions of the queues it serves in one statement
(``recurring_sync`` in queries.sql, parameters from :func:`sync_params`): it inserts the next
occurrence of each definition, rewrites a future occurrence whose definition changed,
deletes future occurrences of definitions that are gone from the code, and applies the
catch-up policy to occurrences nothing ran in time. Only the served queues are touched, so
two deployments with different apps (or ``--queue`` subsets) on one table never remove each
other's schedules; a definition's key must be unique in the table.

Fire times are cron's (:mod:`drainer.cron`, the parser ``drainer schedule --cron`` uses),
in the definition's time zone (UTC unless given). Daylight saving time, for a fixed-time
expression such as ``30 2 * * *``: a time the clocks skip runs once, when they jump
(03:00 CEST on the last Sunday of March in Europe/Berlin); a time that occurs twice runs
once, at its first occurrence. A wildcard expression (``0 * * * *``, ``*/15 * * * *``)
follows the clock as it is: no run in a skipped hour, runs in both passes of a repeated
one (they are different instants).

Catch-up (``catch_up=``), when an occurrence was not run before its definition's next fire
time passed too (nothing drained the queue for a while). An occurrence that was claimed at
least once (a retry) is never caught up: it is an ordinary job.

- ``latest`` (default): one run for the whole missed window, for its latest fire time.
- ``all``: one run for every missed fire time, the latest ``catch_up_max`` of them
  (default :data:`CATCH_UP_MAX` = 100), oldest first.
- ``skip``: none; the series goes on at the next fire time.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo
from typing import TYPE_CHECKING, Any

from drainer.errors import ConfigError
from drainer.job import DEFAULT_MAX_ATTEMPTS

if TYPE_CHECKING:
    from drainer.cron import CronExpr
    from drainer.db import Queries

logger = logging.getLogger(__name__)

__all__ = [
    "CATCH_UP_MAX", "CATCH_UP_POLICIES", "DEFAULT_CATCH_UP",
    "DEFAULT_TIMEZONE", "SCHEDULED_FOR_KEY", "Definition", "SyncResult", "define",
    "fire_times_before", "sync", "sync_params",
]

#: The payload key holding the occurrence's fire time (ISO 8601, in the definition's zone).
SCHEDULED_FOR_KEY = "scheduled_for"
CATCH_UP_POLICIES = ("latest", "all", "skip")
DEFAULT_CATCH_UP = "latest"
#: ``catch_up="all"`` runs at most this many missed occurrences of a definition (the latest).
CATCH_UP_MAX = 100
CATCH_UP_MAX_LIMIT = 10_000
DEFAULT_TIMEZONE = "UTC"

_UTC = timezone.utc


def _zone(name: str) -> tzinfo:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if name.upper() == "UTC":
        return _UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"unknown time zone {name!r} (use an IANA name such as "
                          "'Europe/Berlin', or 'UTC')") from None


def fire_times_before(spec: CronExpr, tz: tzinfo, at: datetime, n: int) -> list[datetime]:
    """The latest ``n`` fire times at or before ``at`` (fewer if there are not so many in
    eight years), ascending, as UTC datetimes: :func:`drainer.cron.iter_fire_times` run
    backwards, day by day."""
    from drainer.cron import SEARCH_DAYS

    at = at.astimezone(_UTC)
    day = at.astimezone(tz).date() + timedelta(days=1)
    found: list[datetime] = []
    quiet = 0
    extra: int | None = None  # days still to look at once n were found
    while quiet <= SEARCH_DAYS:
        fresh = [t for t in spec.instants_on(day, tz) if t <= at]
        quiet = 0 if fresh else quiet + 1
        found.extend(fresh)
        if extra is not None:
            extra -= 1
            if extra < 0:
                break
        elif len(found) >= n:
            # a day's times can run past the next midnight (clocks going back): one more
            # day back cannot hold a later time than the n found
            extra = 1
        day -= timedelta(days=1)
    return sorted(set(found))[-n:] if n > 0 else []


@dataclass(frozen=True)
class Definition:
    """A recurring job: a queue, a cron expression in a time zone, a payload, a key."""

    key: str
    queue: str
    cron: str
    timezone: str = DEFAULT_TIMEZONE
    payload: Mapping[str, Any] = field(default_factory=dict)
    catch_up: str = DEFAULT_CATCH_UP
    catch_up_max: int = CATCH_UP_MAX
    priority: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS

    @functools.cached_property
    def spec(self) -> CronExpr:
        from drainer.cron import parse_cron

        return parse_cron(self.cron)

    @functools.cached_property
    def tz(self) -> tzinfo:
        return _zone(self.timezone)

    @functools.cached_property
    def content_hash(self) -> str:
        """What an occurrence row holds of the definition, hashed: when it changes, the
        future occurrence is rewritten."""
        text = json.dumps([self.queue, self.spec.text, self.timezone, self.payload,
                           self.priority, self.max_attempts], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def next_after(self, now: datetime) -> datetime | None:
        """The first fire time strictly after ``now`` (UTC), None if it never fires again."""
        from drainer.cron import iter_fire_times

        nxt = next(iter_fire_times(self.spec, self.tz, now), None)
        return None if nxt is None else nxt.astimezone(_UTC)

    def latest_at(self, now: datetime) -> datetime | None:
        """The latest fire time at or before ``now`` (UTC), None if none in eight years."""
        found = fire_times_before(self.spec, self.tz, now, 1)
        return found[0] if found else None

    @property
    def schedule(self) -> dict[str, str]:
        """What each occurrence row keeps of the definition (``recurring_schedule``), so that
        ``drainer status`` shows the schedule of a series without loading the app."""
        return {"cron": self.cron, "timezone": self.timezone, "catch_up": self.catch_up}

    def payload_for(self, at: datetime) -> dict[str, Any]:
        """The payload of the occurrence at ``at``: the definition's, plus its fire time."""
        return {**self.payload, SCHEDULED_FOR_KEY: at.astimezone(self.tz).isoformat()}

    def describe(self) -> str:
        return f"{self.key!r} on queue {self.queue!r}: {self.cron!r} ({self.timezone})"


def define(queue: str, cron: str, *, key: str | None = None,
           payload: Mapping[str, Any] | None = None, timezone: str | None = None,
           catch_up: str = DEFAULT_CATCH_UP, catch_up_max: int = CATCH_UP_MAX,
           priority: int = 0, max_attempts: int | None = None) -> Definition:
    """A checked :class:`Definition`; ConfigError (one line, exit 2) if anything is wrong."""
    from drainer.cron import parse_cron

    key = queue if key is None else key
    where = f"recurring {key!r}"
    if not isinstance(queue, str) or not queue:
        raise ConfigError(f"{where}: needs a non-empty queue name")
    if not isinstance(key, str) or not key or any(c.isspace() for c in key):
        raise ConfigError(f"{where}: the key must be a non-empty string without spaces")
    if not isinstance(cron, str):
        raise ConfigError(f"{where}: cron must be a string like '0 8 * * *'")
    try:
        spec = parse_cron(cron)
    except ValueError as exc:
        raise ConfigError(f"{where}: invalid cron {cron!r}: {exc}") from None
    tz_name = timezone or DEFAULT_TIMEZONE
    tz = _zone(tz_name)
    if catch_up not in CATCH_UP_POLICIES:
        raise ConfigError(f"{where}: catch_up must be one of {', '.join(CATCH_UP_POLICIES)}, "
                          f"not {catch_up!r}")
    if not 1 <= catch_up_max <= CATCH_UP_MAX_LIMIT:
        raise ConfigError(f"{where}: catch_up_max must be 1-{CATCH_UP_MAX_LIMIT}")
    if max_attempts is not None and max_attempts < 1:
        raise ConfigError(f"{where}: max_attempts must be at least 1")
    if not isinstance(payload, Mapping | None):
        raise ConfigError(f"{where}: the payload must be a dict")
    body = dict(payload or {})
    if SCHEDULED_FOR_KEY in body:
        raise ConfigError(f"{where}: the payload key {SCHEDULED_FOR_KEY!r} is drainer's "
                          "(the occurrence's fire time)")
    try:
        json.dumps(body)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: the payload is not JSON: {exc}") from None
    definition = Definition(key, queue, cron, tz_name, body, catch_up, catch_up_max,
                            priority, max_attempts or DEFAULT_MAX_ATTEMPTS)
    definition.__dict__.update(spec=spec, tz=tz)  # checked above: no need to do it twice
    if definition.next_after(datetime.now(_UTC)) is None:
        raise ConfigError(f"{where}: {cron!r} never fires")
    return definition


# -- the sync -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyncResult:
    """What one sync changed (rows)."""

    inserted: int = 0
    changed: int = 0
    removed: int = 0
    rescheduled: int = 0
    superseded: int = 0
    caught_up: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"inserted": self.inserted, "changed": self.changed, "removed": self.removed,
                "rescheduled": self.rescheduled, "superseded": self.superseded,
                "caught_up": self.caught_up}


def iso_utc(t: datetime | str | None) -> str | None:
    """UTC ISO 8601 (also of a timestamp that came back as JSON text)."""
    if isinstance(t, str):
        t = datetime.fromisoformat(t)
    return None if t is None else t.astimezone(_UTC).isoformat()


def served(definitions: Iterable[Definition], queues: Sequence[str]) -> list[Definition]:
    """The definitions of the served queues, in key order (every sync locks rows in the
    same order, whichever deployment sends it)."""
    wanted = set(queues)
    return sorted((d for d in definitions if d.queue in wanted), key=lambda d: d.key)


def sync_params(definitions: Iterable[Definition], queues: Sequence[str], now: datetime
                ) -> dict[str, Any]:
    """The parameters of ``recurring_sync`` for the definitions of ``queues`` at ``now``."""
    from psycopg.types.json import Jsonb

    rows: list[dict[str, Any]] = []
    missed: list[dict[str, Any]] = []
    for d in served(definitions, queues):
        nxt = d.next_after(now)
        latest = d.latest_at(now)
        rows.append({
            "key": d.key, "queue": d.queue, "hash": d.content_hash, "catch_up": d.catch_up,
            "priority": d.priority, "max_attempts": d.max_attempts, "schedule": d.schedule,
            "next_at": iso_utc(nxt), "next_payload": nxt and d.payload_for(nxt),
            "latest_at": iso_utc(latest), "latest_payload": latest and d.payload_for(latest),
        })
        if d.catch_up == "all" and latest is not None:
            for at in fire_times_before(d.spec, d.tz, now, d.catch_up_max):
                missed.append({"key": d.key, "at": iso_utc(at), "payload": d.payload_for(at)})
    return {"definitions": Jsonb(rows), "missed": Jsonb(missed), "queues": list(queues),
            "now": now.astimezone(_UTC)}


def sync(q: Queries, definitions: Iterable[Definition], queues: Sequence[str],
         now: datetime | None = None) -> SyncResult:
    """Sync the recurring definitions of ``queues`` in one statement (``recurring_sync``):
    what the sync changed. (The drain reaps in its first statement, ``run_start``.)"""
    now = now or datetime.now(_UTC)
    params = sync_params(definitions, queues, now)
    [counts] = q.conn.execute(q.text("recurring_sync"), params).fetchall()
    result = SyncResult(int(counts[1]), *(int(v) for v in counts[4:]))
    if any(result.as_dict().values()):
        logger.info("recurring jobs synced: %s",
                    ", ".join(f"{v} {k}" for k, v in result.as_dict().items() if v),
                    extra=result.as_dict())
    return result


class DrainSync:
    """What a drain does with the recurring definitions of the queues it serves.

    :meth:`start` sends ``recurring_sync`` after the drain's first statement (only when the
    served queues have definitions: one round trip). Every occurrence that was due then has
    its successor in the table (the first fire time after the start). One that came due
    *during* the run may have run without one, so :meth:`finish`, before the run reads what
    is left, syncs once more, but only if the run lasted past the earliest of those fire
    times.
    """

    def __init__(self, definitions: Iterable[Definition], queues: Sequence[str],
                 clock: Callable[[], datetime] | None = None) -> None:
        self.queues = list(queues)
        self.definitions = served(definitions, self.queues)
        self.clock = clock or (lambda: datetime.now(_UTC))
        self.first_next: datetime | None = None

    def start(self, q: Queries) -> SyncResult:
        """Sync the definitions; what changed."""
        now = self.clock()
        result = sync(q, self.definitions, self.queues, now)
        self.first_next = next_fire(self.definitions, self.queues, now)
        return result

    def finish(self, q: Queries) -> SyncResult | None:
        """Sync again if an occurrence may have come due during the run (else None)."""
        if self.first_next is None or self.clock() < self.first_next:
            return None
        return self.start(q)

    def queues_synced(self) -> list[str]:
        """The queues the definitions put occurrences on (they may be due now)."""
        return list(dict.fromkeys(d.queue for d in self.definitions))


def next_fire(definitions: Iterable[Definition], queues: Sequence[str], now: datetime
              ) -> datetime | None:
    """The earliest next fire time after ``now`` of the definitions of ``queues``."""
    times = [t for d in served(definitions, queues) if (t := d.next_after(now)) is not None]
    return min(times, default=None)


def occurrence_times(definitions: Iterable[Definition], queues: Sequence[str],
                     start: datetime, end: datetime, limit: int = 20_000) -> list[float]:
    """The fire times (epoch seconds) in ``(start, end)`` of the definitions of ``queues``,
    sorted, at most ``limit`` of them (for wake estimates and dry runs)."""
    from drainer.cron import iter_fire_times

    out: list[float] = []
    stop = end.timestamp()
    for d in served(definitions, queues):
        for t in iter_fire_times(d.spec, d.tz, start):
            ts = t.timestamp()
            if ts >= stop or len(out) >= limit:
                break
            out.append(ts)
    return sorted(set(out))[:limit]


def series_status(rows: Iterable[Mapping[str, Any]], definitions: Iterable[Definition],
                  handled: Iterable[str], now: datetime) -> list[dict[str, Any]]:
    """``drainer status``'s recurring series: the table's (``status_recurring`` rows) and
    the app's definitions, by key. ``defined``: the loaded app declares it; ``served``: its
    queue has a handler in the app (None when no app was loaded); ``next_at`` is the
    queued occurrence's fire time, else (``next_in_table`` false) the definition's;
    ``cron``, ``timezone``, ``catch_up``: the app's definition's, else what the sync wrote
    on the series' occurrences (``schedule``, None for rows older than it)."""
    handled = set(handled)
    by_key = {str(r["key"]): dict(r) for r in rows}
    defs = {d.key: d for d in definitions}
    out: list[dict[str, Any]] = []
    for key in sorted(set(by_key) | set(defs)):
        row, d = by_key.get(key, {}), defs.get(key)
        next_at: datetime | str | None = row.get("next_at")
        in_table = next_at is not None
        if next_at is None and d is not None:
            next_at = d.next_after(now)
        queue = d.queue if d is not None else row.get("queue")
        schedule = d.schedule if d is not None else _stored_schedule(row.get("schedule"))
        out.append({
            "key": key, "queue": queue,
            "cron": schedule.get("cron"), "timezone": schedule.get("timezone"),
            "catch_up": schedule.get("catch_up"), "defined": d is not None if defs or
            handled else None,
            "served": (queue in handled) if handled else None,
            "next_at": iso_utc(next_at), "next_in_table": in_table,
            "next_status": row.get("next_status"),
            "last_status": row.get("last_status"),
            "last_scheduled_for": iso_utc(row.get("last_scheduled_for")),
            "last_finished_at": iso_utc(row.get("last_finished_at")),
            "last_error": row.get("last_error"),
        })
    return out


def _stored_schedule(value: Any) -> dict[str, Any]:
    """An occurrence's ``recurring_schedule`` (a dict, or its JSON text inside a JSON row)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}
