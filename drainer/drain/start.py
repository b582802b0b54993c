"""A run's first Query: planned before the session opens, sent once, read back.

Every run starts with one simple-protocol Query (one round trip) of up to three statements:

- ``run_start``: the schema version, the reaper (only at the version this drainer needs,
  so an outdated table is not touched), which served queues have due jobs, which an
  operator paused or limited; when the app has no recurring definition on the served
  queues, it deletes their future occurrences (of definitions removed from the code: no
  sync follows to do it);
- ``claim_first``: the run's first claim, from the first due queue that may be claimed so
  (not transaction mode, no max_running or rate limit: those claim under a lock of their
  own); the loop's first claim when it claims anything;
- ``finish_run`` (``if_idle``): the end of a run that found nothing to claim (archive,
  table health, what is left due); a no-op otherwise.

They are three statements, not one, because claim_first must see what run_start reaped
(jobs queued again): the data-modifying parts of one statement are invisible to its other
parts, while the next statement of the same transaction sees them. They go in one message
because every round trip is billed. So the later two must act on what run_start found
before the client has read it: run_start writes its decision with ``set_config(...,
true)`` in one setting, ``drainer.start`` (``idle``: nothing to claim; ``q:`` and a queue:
the queue to claim from; empty: the table is not at the version this drainer needs),
which holds for this Query's transaction only, so nothing leaks into a session a pooler
hands to another client.

Not sent so: with recurring definitions (their sync comes between run_start and the
rest), with ``--archive-mode move`` (its archive has statements of its own): then
run_start goes alone and the run's end is its own statement.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from drainer.db.encoders import PLACEHOLDER
from drainer.db.queries import ClaimedRow, claim_order, finish_params, finish_row, how_many_start
from drainer.db.statements import QUERIES, identifiers, regclass_literal
from drainer.drain.claims import combinable, first_claim_size
from drainer.queue_limits import Control, Rate

if TYPE_CHECKING:
    from drainer.db.queries import Queries
    from drainer.drain.limits import SettingLimits
    from drainer.registry import Registry
    from drainer.settings import Settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """What the first Query sends, decided before connecting."""

    schema: str
    table: str
    queues: list[str]
    latest: int  # the schema version this drainer needs
    max_attempts: list[int | None]  # each queue's task's (None: the row's), for the reaper
    #: finish_run's arguments (archive_after, failed_retention, batch_size, served); None:
    #: run_start goes alone
    finish: dict[str, Any] | None
    #: no recurring definition on the served queues (no sync follows): run_start deletes
    #: their future occurrences
    unschedule: bool = False
    first: dict[str, Any] | None = None  # claim_first's parameters; None: not sent
    first_size: int = 0  # the first claim's size (the loop counts it as its first claim)
    text: str | None = None  # the whole Query, rendered (None: run_start alone)

    def without_first(self) -> Plan:
        """The same Query without the first claim (the deadline passed while connecting)."""
        if self.first is None:
            return self
        plan = replace(self, first=None, first_size=0)
        return replace(plan, text=render(plan))


@dataclass
class Start:
    """What the first Query found."""

    version: int | None  # None: no jobs table (or one too old for the statement)
    reaped: list[tuple[int, str, int]] = field(default_factory=list)  # (id, status, attempts)
    due: list[str] = field(default_factory=list)  # served queues with due jobs, in order
    paused: set[str] = field(default_factory=set)
    controls: dict[str, Control] = field(default_factory=dict)  # operators' limits
    fin: dict[str, Any] | None = None  # finish_run's result when it did the run's end
    claimed: list[ClaimedRow] = field(default_factory=list)  # the first claim, claim order
    unscheduled: int = 0  # future occurrences of removed definitions, deleted


def plan(settings: Settings, registry: Registry, queues: list[str], latest: int,
         limits: SettingLimits, run_id: str, *, alone: bool) -> Plan:
    """The first Query of a run over ``queues``; ``alone``: run_start without the rest
    (the app has recurring definitions: their sync goes between)."""
    max_attempts = [registry.tasks[name].max_attempts for name in queues]
    finish = None if alone else finish_args(settings, registry)
    p = Plan(settings.schema_name, settings.table, queues, latest, max_attempts,
             unschedule=not alone, finish=finish)
    if finish is None:
        return p
    first, size = _first(settings, registry, queues, limits, run_id)
    p = replace(p, first=first, first_size=size)
    return replace(p, text=render(p))


def finish_args(settings: Settings, registry: Registry) -> dict[str, Any] | None:
    """finish_run's arguments for the end of a run (None: archive mode move, whose
    archive has statements of its own)."""
    if settings.archive_mode != "delete":
        return None
    return {"archive_after": settings.archive_after,
            "failed_retention": settings.failed_retention,
            "batch_size": settings.archive_batch_size, "served": registry.queues()}


def _first(settings: Settings, registry: Registry, queues: list[str],
           limits: SettingLimits, run_id: str) -> tuple[dict[str, Any] | None, int]:
    """claim_first's parameters and size; None when no served queue may be claimed so
    (an operator's limit is read by the statement itself) or --max-jobs is 0."""
    size = first_claim_size(settings.batch_size, settings.concurrency, settings.max_jobs)
    tasks = [registry.tasks[name] for name in queues]
    eligible = [combinable(t) and t.queue not in limits.max_running
                and t.queue not in limits.rates for t in tasks]
    if size <= 0 or not any(eligible):
        return None, 0
    leases = [float(t.lease if t.lease is not None else settings.lease) for t in tasks]
    return {"eligible": eligible, "leases": leases, "batch_size": size,
            "start_now": how_many_start(settings.concurrency, size), "run_id": run_id}, size


def render(p: Plan) -> str:
    """The Query's text, its values quoted by psycopg's ``sql.Literal`` (as its
    ClientCursor would), without a connection: rendering and quoting it inside the
    session (with 300 queues, each list 9 times) took 1.5-2.7 ms of billed time."""
    assert p.finish is not None
    params = {**_run_start_params(p),
              **finish_params(regclass_literal(p.schema, p.table), p.queues, if_idle=True,
                              **p.finish),
              **(p.first or {})}

    def value(m: re.Match[str]) -> str:
        return "%" if m.group(0) == "%%" else sql.Literal(params[m.group(1)]).as_string(None)

    ids = identifiers(p.schema, p.table)
    names = ("run_start", "claim_first", "finish_run") if p.first is not None \
        else ("run_start", "finish_run")
    return ";\n".join(PLACEHOLDER.sub(value, sql.SQL(QUERIES[n]).format(**ids).as_string(None))
                      for n in names)


def _run_start_params(p: Plan) -> dict[str, Any]:
    return {"table": p.table, "queues": list(p.queues), "latest": p.latest,
            "max_attempts": list(p.max_attempts), "unschedule": p.unschedule}


def send(q: Queries, p: Plan) -> Start:
    """Send the first Query and read what it found. A table older than a table or column
    run_start reads (an upgrade without ``drainer migrate``), or none at all: the version
    alone, which tells the caller to migrate."""
    try:
        if p.text is None:
            rows = q.conn.execute(q.text("run_start"), _run_start_params(p)).fetchall()
            return _found(rows)
        cur = psycopg.ClientCursor(q.conn)
        cur.execute(p.text)
        start = _found(cur.fetchall())
        if p.first is not None:
            cur.nextset()
            start.claimed = sorted((ClaimedRow(*r) for r in cur.fetchall()), key=claim_order)
        cur.nextset()
        cur.row_factory = dict_row
        start.fin = finish_row(cur)
        return start
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName,
            psycopg.errors.UndefinedColumn):
        if not q.conn.autocommit:
            q.conn.rollback()
        if p.text is not None:  # they rolled back together: run_start alone says more
            return send(q, replace(p, first=None, finish=None, text=None))
        return Start(q.schema_version())


def _found(rows: Sequence[tuple[Any, ...]]) -> Start:
    """run_start's rows: (kind, id, status, attempts, queue, n). A 'limit' row carries
    max_running in id, rate_count in attempts, the rate period in microseconds in n."""
    due = sorted((r for r in rows if r[0] == "due"), key=lambda r: r[5])
    unscheduled = sum(int(r[5]) for r in rows if r[0] == "unscheduled")
    if unscheduled:
        logger.info("recurring jobs synced: %d removed", unscheduled,
                    extra={"removed": unscheduled})
    return Start(
        unscheduled=unscheduled,
        version=next((r[1] for r in rows if r[0] == "version"), None),
        reaped=[(r[1], r[2], r[3]) for r in rows if r[0] == "reaped"],
        due=[r[4] for r in due],
        paused={r[4] for r in rows if r[0] == "paused"},
        controls={r[4]: Control(r[1], None if r[3] is None else Rate(r[3], r[5] / 1e6))
                  for r in rows if r[0] == "limit"})
