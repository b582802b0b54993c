"""``drainer fleet run-once``: drain the fleet's due tenants, each as ``run-once`` would.

One statement on the control database leases the tenants whose known due time has passed
and those never drained (:meth:`Control.claim`); no other tenant is connected to. They
wait in one line; ``--fleet-concurrency`` threads take them from its head, each tenant's
turn a :func:`drainer.drain.run_once` with the tenant's own URL and a deadline of
``--tenant-budget`` (one short connection, plus its heartbeat's). A tenant that used its
budget with due work left goes to the back of the line for another turn, while the run's
``--max-runtime`` allows: round robin, so one deep tenant cannot starve the rest. When a
tenant is done, what its last run report says comes next (``next_due_at``, due work left)
is written back to its row, fenced on the run's lease. A tenant that is down, not
migrated or failing gets its error in its line and a backoff; the others go on.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from pydantic import SecretStr

from drainer._redact import redact
from drainer.db.connect import server_condition
from drainer.errors import (
    EXIT_ERROR,
    EXIT_SCHEMA,
    EXIT_TIMEOUT,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    ConfigError,
    DatabaseReadOnly,
    DatabaseUnavailable,
    SchemaError,
    ServerOutOfResources,
    ServerShutdown,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from drainer.drain import RunReport
    from drainer.fleet.control import Control
    from drainer.fleet.tenants import Shard, Tenant
    from drainer.registry import Registry
    from drainer.settings import Settings

logger = logging.getLogger("drainer.fleet")

#: A tenant's lease covers its turn: the budget, the grace period its running handlers get,
#: and this margin for the end of the run (the --max-runtime watchdog of each turn cuts it
#: 2 s after the grace period; maintenance is bounded by what the watchdog leaves).
LEASE_MARGIN_S = 60.0

#: The job counts of a run report a tenant's line adds up over its turns.
COUNTS = ("claimed", "succeeded", "retried", "failed", "released", "reaped", "archived",
          "lost", "snoozed", "discarded", "followups", "rate_limited")

#: A tenant's outcome when it failed, by the exception, with the exit code ``drainer
#: run-once`` would have had on that tenant alone.
FAILURES: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str, int], ...] = (
    (DatabaseUnavailable, "unavailable", EXIT_UNAVAILABLE),
    (SchemaError, "schema", EXIT_SCHEMA),
    ((psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable,
      psycopg.errors.IdleInTransactionSessionTimeout), "timeout", EXIT_TIMEOUT),
    (ConfigError, "config", EXIT_USAGE),
    ((psycopg.OperationalError, psycopg.InterfaceError), "unavailable", EXIT_UNAVAILABLE),
)
#: Outcomes of a tenant whose run worked.
DRAINED, WORK_LEFT = "drained", "work_left"

#: The tenant a thread drains now, for the log lines of its run (see :class:`TenantLogs`).
current_tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "drainer_fleet_tenant", default=None)


def classify(exc: BaseException) -> tuple[str, int]:
    """(outcome, exit code) of a tenant whose run raised ``exc``."""
    known = (ServerOutOfResources, DatabaseReadOnly, ServerShutdown)
    condition = exc if isinstance(exc, known) else server_condition(exc)
    if condition is not None:  # full, read-only, shutting down: its own code
        return "unavailable", condition.exit_code
    for kinds, outcome, code in FAILURES:
        if isinstance(exc, kinds):
            return outcome, code
    return "error", EXIT_ERROR


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return redact(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


@dataclass
class TenantLine:
    """One tenant's line of the fleet report: its own runs only (counts added over its
    turns), never another tenant's."""

    tenant: str
    never_seen: bool = False
    outcome: str | None = None
    error: str | None = None
    exit_code: int = 0
    turns: int = 0
    run_ids: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    remaining_due: int = 0
    next_due_at: str | None = None
    """What its last run report says (ISO); the control row's is in ``recorded_next_due_at``."""
    recorded_next_due_at: str | None = None
    recorded: bool = False
    deadline_hit: bool = False
    stopped_by: str | None = None
    duration_s: float = 0.0
    connected_s: float = 0.0

    def add(self, report: RunReport) -> None:
        self.turns += 1
        for name in COUNTS:
            self.counts[name] += int(getattr(report, name))
        self.remaining_due = report.remaining_due
        self.next_due_at = report.next_due_at
        self.deadline_hit = report.deadline_hit
        self.stopped_by = report.stopped_by
        self.duration_s = round(self.duration_s + report.duration_s, 6)
        self.connected_s = round(self.connected_s + report.connected_s, 6)
        self.outcome = WORK_LEFT if report.remaining_due else DRAINED

    def fail(self, exc: BaseException, took: float) -> None:
        self.turns += 1
        self.outcome, self.exit_code = classify(exc)
        self.error = one_line(exc)
        self.duration_s = round(self.duration_s + took, 6)

    @property
    def failed(self) -> bool:
        return self.outcome not in (DRAINED, WORK_LEFT)

    def as_dict(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "outcome": self.outcome, "error": self.error,
                "exit_code": self.exit_code, "never_seen": self.never_seen,
                "turns": self.turns, "run_ids": self.run_ids, **self.counts,
                "remaining_due": self.remaining_due, "next_due_at": self.next_due_at,
                "recorded": self.recorded, "recorded_next_due_at": self.recorded_next_due_at,
                "deadline_hit": self.deadline_hit, "stopped_by": self.stopped_by,
                "duration_s": self.duration_s, "connected_s": self.connected_s}


@dataclass
class FleetReport:
    """What one fleet run did: a line per tenant drained, and the totals."""

    run_id: str
    shard: str | None
    listed: int
    lines: list[TenantLine] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    """Due tenants another fleet run was draining: not touched by this one."""
    left: list[str] = field(default_factory=list)
    """Due tenants this run leased and did not reach (--max-runtime, a signal): released,
    still due for the next run."""
    duration_s: float = 0.0
    stopped_by: str | None = None

    @property
    def failed(self) -> list[TenantLine]:
        return [line for line in self.lines if line.failed]

    def totals(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tenants_listed": self.listed, "tenants_due": len(self.lines) + len(self.left),
            "tenants_drained": sum(line.outcome == DRAINED for line in self.lines),
            "tenants_work_left": sum(line.outcome == WORK_LEFT for line in self.lines),
            "tenants_failed": len(self.failed), "tenants_busy": len(self.busy),
            "tenants_left": len(self.left),
            "turns": sum(line.turns for line in self.lines)}
        for name in COUNTS:
            out[name] = sum(line.counts[name] for line in self.lines)
        out["remaining_due"] = sum(line.remaining_due for line in self.lines)
        out["connected_s"] = round(sum(line.connected_s for line in self.lines), 6)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "shard": self.shard,
                "tenants": [line.as_dict() for line in self.lines],
                "totals": self.totals(), "busy": self.busy, "left": self.left,
                "duration_s": self.duration_s,
                "deadline_hit": bool(self.left) or any(
                    line.deadline_hit and line.remaining_due for line in self.lines),
                "stopped_by": self.stopped_by}


class TenantLogs(logging.Filter):
    """Adds ``tenant`` to the log records of a tenant's run: by the thread's tenant, or by
    the record's run id (a heartbeat or handler thread of the run)."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: dict[str, str] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        tenant = current_tenant.get() or self.runs.get(str(getattr(record, "run_id", "")))
        if tenant is not None and not hasattr(record, "tenant"):
            record.tenant = tenant
        return True


def tenant_settings(settings: Settings, tenant: Tenant, *, tracing: bool) -> Settings:
    """A tenant's run settings: the fleet's, with the tenant's own URL and nothing of
    another tenant. --max-runtime is the fleet run's (each turn gets a deadline instead);
    the Pushgateway group is the tenant's (one group a tenant, not the last one's)."""
    update: dict[str, Any] = {"database_url": SecretStr(tenant.url), "max_runtime": None}
    if settings.pushgateway_url:
        import socket

        base = settings.pushgateway_instance or socket.gethostname()
        update["pushgateway_instance"] = f"{base}/{tenant.name}"
    if not tracing:
        update["otel"] = "off"
    return settings.model_copy(update=update)


def _tracing_allowed(settings: Settings) -> bool:
    """Job spans only with one tenant at a time: drainer keeps the open spans of a process
    by (job id, attempt), which two tenants' jobs share."""
    if settings.fleet_concurrency == 1 or settings.otel == "off":
        return True
    if settings.otel == "on" or "opentelemetry.trace" in sys.modules:
        logger.warning("OpenTelemetry job spans are off in this fleet run: with "
                       "--fleet-concurrency > 1, two tenants' jobs would share span keys "
                       "(set --fleet-concurrency 1 to trace)")
    return False


@dataclass
class _Entry:
    tenant: Tenant
    line: TenantLine
    taken: bool = False
    """Another run leased it after this run's lease passed (it waited in line that long)."""


class FleetRun:
    """One fleet run over ``tenants`` (this shard's): claim, turns, write-back."""

    def __init__(self, settings: Settings, tenants: Sequence[Tenant], control: Control, *,
                 registry: Registry | None = None, stop: threading.Event | None = None,
                 deadline: float | None = None, run_id: str | None = None,
                 shard: Shard | None = None, logs: TenantLogs | None = None) -> None:
        self.settings = settings
        self.tenants = {t.name: t for t in tenants}
        self.control = control
        self.registry = registry
        self.stop = stop or threading.Event()
        self.started = time.monotonic()
        if settings.max_runtime is not None:
            limit = self.started + settings.max_runtime
            deadline = limit if deadline is None else min(deadline, limit)
        self.deadline = deadline
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.lease = settings.fleet_tenant_budget + settings.grace + LEASE_MARGIN_S
        self.logs = logs
        self.report = FleetReport(self.run_id, None if shard is None else str(shard),
                                  len(self.tenants))
        self.tracing = _tracing_allowed(settings)
        self.waiting: deque[_Entry] = deque()
        self.in_turn = 0
        self.cond = threading.Condition()

    def run(self) -> FleetReport:
        from drainer.drain import resolve_queues

        resolve_queues(self.settings, self._registry())  # a bad app: exit 2 before any claim
        claim = self.control.claim(list(self.tenants), self.run_id, self.lease,
                                   self.settings.fleet_max_sleep)
        self.report.busy = claim.busy
        entries = [_Entry(self.tenants[name], TenantLine(name, never_seen=never_seen))
                   for name, never_seen in claim.claimed]
        self.waiting.extend(entries)
        logger.info("fleet run %s: %d of %d tenants due (%d being drained by another run)",
                    self.run_id, len(self.waiting), len(self.tenants), len(claim.busy),
                    extra={"fleet_run_id": self.run_id, "due": len(self.waiting),
                           "busy": len(claim.busy)})
        workers = [threading.Thread(target=self._work, name=f"drainer-fleet-{i}", daemon=True)
                   for i in range(min(self.settings.fleet_concurrency, len(self.waiting)))]
        try:
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        finally:
            for e in self.waiting:
                if e.line.turns:  # back in line for another turn when the run ended
                    self._record(e.line)
            left = [e.tenant.name for e in self.waiting if not e.line.turns]
            self.waiting.clear()
            self.control.release(left, self.run_id)
            self.report.left = left
            self.report.busy += [e.tenant.name for e in entries
                                 if e.taken and not e.line.turns]
            # a line a tenant this run drained (taken after a turn: its turns so far)
            self.report.lines = [e.line for e in entries if e.line.turns]
        self.report.stopped_by = "signal" if self.stop.is_set() else (
            "max_runtime" if self.report.left else None)
        self.report.duration_s = round(time.monotonic() - self.started, 6)
        return self.report

    def _registry(self) -> Registry:
        from drainer.registry import default_registry

        return self.registry or default_registry

    def _out_of_time(self) -> bool:
        return self.stop.is_set() or (self.deadline is not None
                                      and time.monotonic() >= self.deadline)

    def _work(self) -> None:
        while True:
            with self.cond:
                while not self.waiting and self.in_turn and not self._out_of_time():
                    self.cond.wait(0.5)
                if not self.waiting or self._out_of_time():
                    self.cond.notify_all()
                    return
                entry = self.waiting.popleft()
                self.in_turn += 1
            again = False
            try:
                again = self._turn(entry)
            except Exception:  # a bug in the fleet's own bookkeeping: that tenant only
                logger.exception("fleet run %s: tenant %s", self.run_id, entry.tenant.name)
            finally:
                with self.cond:
                    self.in_turn -= 1
                    if again:
                        self.waiting.append(entry)
                    self.cond.notify_all()

    def _turn(self, entry: _Entry) -> bool:
        """One turn of a tenant; True when it goes to the back of the line for another."""
        from drainer.drain import run_once

        name, line = entry.tenant.name, entry.line
        if not self.control.renew(name, self.run_id, self.lease):
            # its lease passed while it waited in line and another run leased it: that run
            # drains it now, this one must not (and records nothing more of it)
            logger.warning("tenant %s: another fleet run took it while it waited in line",
                           name, extra={"tenant": name, "fleet_run_id": self.run_id})
            entry.taken = True
            return False
        run_id = uuid.uuid4().hex[:12]
        line.run_ids.append(run_id)
        if self.logs is not None:
            self.logs.runs[run_id] = name
        budget = time.monotonic() + self.settings.fleet_tenant_budget
        deadline = budget if self.deadline is None else min(budget, self.deadline)
        token = current_tenant.set(name)
        started = time.monotonic()
        try:
            report = run_once(tenant_settings(self.settings, entry.tenant,
                                              tracing=self.tracing),
                              registry=self._registry(), stop=self.stop, deadline=deadline,
                              run_id=run_id)
        except Exception as exc:
            line.fail(exc, time.monotonic() - started)
            logger.warning("tenant %s: %s", name, line.error,
                           extra={"tenant": name, "outcome": line.outcome, "run_id": run_id})
            self._record(line)
            return False
        finally:
            current_tenant.reset(token)
        line.add(report)
        if report.remaining_due and report.stopped_by in ("max_runtime", "max_jobs") \
                and not self._out_of_time():
            return True  # its budget used with due work left: another turn, later
        self._record(line)
        return False

    def _record(self, line: TenantLine) -> None:
        from drainer.migrate import latest_version

        written, next_due = self.control.record(
            line.tenant, self.run_id, outcome=line.outcome or "error", error=line.error,
            failed=line.failed, work_left=line.remaining_due > 0,
            next_due_at=line.next_due_at,
            schema_version=None if line.failed else latest_version(),
            report={"turns": line.turns, "run_ids": line.run_ids, **line.counts,
                    "remaining_due": line.remaining_due, "duration_s": line.duration_s,
                    "exit_code": line.exit_code})
        line.recorded = written
        line.recorded_next_due_at = None if next_due is None else next_due.isoformat()
        if not line.failed:
            c = line.counts
            logger.info("tenant %s: %s, %d claimed (%d succeeded, %d retried, %d failed) in "
                        "%d turn(s); next due %s", line.tenant, line.outcome, c["claimed"],
                        c["succeeded"], c["retried"], c["failed"], line.turns,
                        line.recorded_next_due_at or "unknown (no known work)",
                        extra={"tenant": line.tenant, "outcome": line.outcome,
                               "fleet_run_id": self.run_id})
        if not written:
            logger.warning("tenant %s: its lease passed and another fleet run took it; "
                           "this run's outcome is not recorded", line.tenant,
                           extra={"tenant": line.tenant, "fleet_run_id": self.run_id})


def run_fleet(settings: Settings, *, tenants: Sequence[Tenant] | None = None,
              registry: Registry | None = None, stop: threading.Event | None = None,
              deadline: float | None = None, run_id: str | None = None,
              logs: TenantLogs | None = None) -> FleetReport:
    """One fleet run (``drainer fleet run-once``): the control connection is open for the
    run (the claim, each turn's lease, each tenant's write-back); ``tenants``: these
    instead of --tenants / --tenants-query and the shard."""
    from drainer.fleet.control import Control, connect_control
    from drainer.fleet.tenants import load_tenants

    shard = None
    if tenants is None and not settings.fleet_tenants_query:
        tenants, shard = load_tenants(settings)  # a bad file: exit 2 before connecting
    with connect_control(settings) as conn:
        control = Control(conn, settings.schema_name)
        if tenants is None:
            tenants, shard = load_tenants(settings, conn)
        control.check()
        return FleetRun(settings, tenants, control, registry=registry, stop=stop,
                        deadline=deadline, run_id=run_id, shard=shard, logs=logs).run()
