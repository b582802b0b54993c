"""``drainer serve``: an HTTP trigger that runs coalesced drains; no connection while idle.

What a trigger does: :class:`Coalescer` (one drain running, at most one queued), the
drain it runs, the server it is served by (:func:`make_server`, :func:`serve_until`) and
the trigger's settings. The HTTP side (connections, parsing, routes, :class:`HttpHost`)
is drainer/_http.py."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from drainer._http import Closed, HttpHost, Server
from drainer._redact import redact
from drainer.errors import ConfigError, DrainerError

if TYPE_CHECKING:
    from drainer.settings import Settings

logger = logging.getLogger(__name__)

#: Finished runs kept for GET /runs/<id>.
KEEP_RUNS = 100
#: Shortest DRAINER_TRIGGER_TOKEN serve and schedule --listen accept.
MIN_TOKEN_LENGTH = 16
#: Port when neither --port nor $PORT is given (Cloud Run's default).
DEFAULT_PORT = 8080

DrainFunc = Callable[[threading.Event], dict[str, Any]]

_requested = threading.local()


def requested_run_id() -> str | None:
    """Inside a drain that POST /drain started: the run_id it answered (the drain passes
    it to ``run_once(run_id=...)`` so that report, logs and rows carry the same id)."""
    value = getattr(_requested, "run_id", None)
    return value if isinstance(value, str) else None


@dataclass
class Run:
    """One drain requested through POST /drain."""

    id: str
    status: str = "queued"  # queued, running, done, error, cancelled
    requested_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    report: dict[str, Any] | None = None
    error: str | None = None
    exit_code: int | None = None
    finished: threading.Event = field(default_factory=threading.Event, repr=False)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run_id": self.id, "status": self.status,
                               "requested_at": _iso(self.requested_at),
                               "started_at": _iso(self.started_at),
                               "finished_at": _iso(self.finished_at)}
        if self.report is not None:
            out["report"] = self.report
        if self.error is not None:
            out["error"] = self.error
            out["exit_code"] = self.exit_code
        return out


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


class Coalescer:
    """One drain running, at most one queued behind it; later triggers join the queued one.

    A trigger that arrives while a drain runs may be for a job committed after that
    drain's last claim, so it gets the queued drain (which starts when the running one
    ends); every trigger that arrives while one is queued joins it.
    """

    def __init__(self, drain: DrainFunc, keep: int = KEEP_RUNS,
                 on_request: Callable[[], None] | None = None) -> None:
        self._drain = drain
        self._on_request = on_request
        self._keep = keep
        self.keep = keep
        self._lock = threading.Lock()
        self.running: Run | None = None
        self.queued: Run | None = None
        self._finished: OrderedDict[str, Run] = OrderedDict()
        self._thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.started = 0
        #: called with each completed drain's report (serve's SelfWake)
        self.after: Callable[[dict[str, Any]], None] | None = None

    def request(self) -> tuple[Run, bool]:
        """The run that will serve this trigger, and whether it joined an existing one."""
        with self._lock:
            if self.stop.is_set():
                raise Closed()
            if self._on_request is not None:
                self._on_request()  # e.g. drainer schedule notes the trigger for its ticks
            if self.queued is not None:
                return self.queued, True
            run = Run(uuid.uuid4().hex[:12])
            if self.running is None:
                run.status = "running"
                self.running = run
                self._thread = threading.Thread(target=self._loop, args=(run,),
                                                name="drainer-serve-drain", daemon=True)
                self._thread.start()
            else:
                self.queued = run
            return run, False

    def get(self, run_id: str) -> Run | None:
        with self._lock:
            for run in (self.running, self.queued):
                if run is not None and run.id == run_id:
                    return run
            return self._finished.get(run_id)

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {"draining": self.running is not None, "queued": self.queued is not None,
                    "runs_started": self.started, "stopping": self.stop.is_set()}

    def _loop(self, run: Run | None) -> None:
        while run is not None:
            with self._lock:
                run.status = "running"
                run.started_at = time.time()
                self.started += 1
            logger.info("drain %s started", run.id, extra={"run_id": run.id})
            _requested.run_id = run.id
            try:
                report = self._drain(self.stop)
                report["run_id"] = run.id
                run.report = report
                run.status = "done"
            except DrainerError as exc:
                run.status, run.error, run.exit_code = "error", redact(str(exc)), exc.exit_code
            except Exception as exc:
                run.status = "error"
                run.error = redact(f"{type(exc).__name__}: {' '.join(str(exc).split())}")
                run.exit_code = 1
            run.finished_at = time.time()
            _requested.run_id = None
            if run.status == "done":
                logger.info("drain %s done", run.id, extra={"run_id": run.id,
                                                            "report": run.report})
                if self.after is not None:
                    self.after(report)
            else:
                logger.error("drain %s failed: %s", run.id, run.error,
                             extra={"run_id": run.id})
            with self._lock:
                self._remember(run)
                run.finished.set()
                nxt = self.queued
                self.queued = None
                if nxt is not None and self.stop.is_set():
                    nxt.status = "cancelled"
                    nxt.finished_at = time.time()
                    self._remember(nxt)
                    nxt.finished.set()
                    nxt = None
                self.running = nxt
            run = nxt

    def _remember(self, run: Run) -> None:
        self._finished[run.id] = run
        while len(self._finished) > self._keep:
            self._finished.popitem(last=False)

    def shutdown(self, timeout: float | None = None) -> None:
        """No new drains; ask the running one to stop (finish or release); wait for it."""
        with self._lock:
            self.stop.set()
            queued, self.queued = self.queued, None
            if queued is not None:
                queued.status = "cancelled"
                queued.finished_at = time.time()
                self._remember(queued)
                queued.finished.set()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)


class SelfWake(threading.Thread):
    """``drainer serve``'s own trigger for the work its drains saw coming: the report's
    ``next_due_at`` (a retry, a delayed job, a snooze, the lease of a job left running) or
    work left due (a drain that --max-runtime ended). At that time it asks the coalescer
    for a drain, as a POST /drain would, so a retry runs without another trigger (as
    ``schedule --wake-policy known-work --listen`` does). Nothing known: it sleeps, with no
    connection; it lives as long as the process (a platform that scales serve to zero
    stops it, and the next trigger's drain runs what came due)."""

    def __init__(self, coalescer: Coalescer) -> None:
        super().__init__(name="drainer-serve-wake", daemon=True)
        self.coalescer = coalescer
        self.due: float | None = None  # epoch seconds
        self.why = ""
        self.changed = threading.Condition()

    def note(self, report: dict[str, Any]) -> None:
        """A drain completed: what it left is the next wake (a later drain's word wins)."""
        nxt = report.get("next_due_at")
        with self.changed:
            if report.get("remaining_due") and report.get("stopped_by") != "signal":
                self.due, self.why = time.time(), \
                    f"due work left: {report['remaining_due']} due job(s) after the last drain"
            elif nxt:
                # a little past it: the database's clock and this machine's may differ
                self.due = datetime.fromisoformat(nxt).timestamp() + 0.05
                self.why = f"retry due: a job the last drain saw waiting came due at {nxt}"
            else:
                self.due = None
            self.changed.notify()

    def run(self) -> None:
        while not self.coalescer.stop.is_set():
            with self.changed:
                wait = 1.0 if self.due is None else self.due - time.time()
                if wait > 0:
                    self.changed.wait(min(wait, 1.0))  # looks at stop every second
                    continue
                self.due, why = None, self.why
            try:
                run, joined = self.coalescer.request()
            except Closed:
                return
            logger.info("wake: %s", why, extra={"run_id": run.id, "joined": joined})


def drain_func(settings: Settings) -> DrainFunc:
    """The drain each POST /drain runs: :func:`drainer.drain.run_once` with the stop event."""

    def drain(stop: threading.Event) -> dict[str, Any]:
        from drainer.drain import run_once

        return run_once(settings, stop=stop, run_id=requested_run_id()).as_dict()

    return drain


def fleet_drain_func(settings: Settings, logs: Any = None) -> DrainFunc:
    """The drain of ``drainer serve --fleet``: one fleet run (the tenants due by then, the
    marked ones among them), its report under the run id POST /drain answered."""

    def drain(stop: threading.Event) -> dict[str, Any]:
        from drainer.fleet.run import run_fleet

        return run_fleet(settings, stop=stop, run_id=requested_run_id(),
                         logs=logs).as_dict()

    return drain


def make_server(settings: Settings, host: str, port: int, *, token: str | None,
                drain: DrainFunc | None = None,
                on_request: Callable[[], None] | None = None,
                mark: Callable[[Sequence[str]], None] | None = None) -> Server:
    """The HTTP server, bound and ready for ``serve_forever`` (used by tests too).

    ``drainer schedule --listen`` uses it too, with its own ``drain`` (which waits for a
    scheduled run to end) and ``on_request`` (called under the coalescer's lock for every
    accepted POST /drain). ``mark``: a fleet's (``--fleet``): POST /drain?tenant=NAME marks
    the tenant due with it before the drain (a fleet run) is asked for; without it, a
    ``tenant`` parameter is refused.
    """
    from drainer.fleet.trigger import tenant_screen

    coalescer = Coalescer(drain or drain_func(settings), on_request=on_request)
    try:
        server = Server((host, port), coalescer, token, screen=tenant_screen(mark))
    except OSError as exc:
        raise DrainerError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    if drain is None:  # drainer serve: its own wake for known work (schedule has its ticks)
        wake = SelfWake(coalescer)
        coalescer.after = wake.note
        wake.start()
    return server


def serve_until(server: Server, stop: threading.Event, *, grace: float, note: str,
                on_listening: Callable[[str, int], None] | None = None) -> int:
    """Serve POST /drain until ``stop`` is set, shut down in order; return drains started.

    The library form of ``drainer serve`` (no signal handlers installed: set ``stop``).
    """
    with HttpHost(server, name="drainer-serve-http", grace=grace) as http:
        http.start(note, on_listening)
        while not stop.wait(0.5):
            pass
    return http.started


def trigger_token(settings: Settings, no_auth: bool) -> str | None:
    """The bearer token POST /drain wants (None with --no-auth); ConfigError when unset."""
    token = settings.trigger_token.get_secret_value() if settings.trigger_token else None
    if not token and not no_auth:
        raise ConfigError("no trigger token: set DRAINER_TRIGGER_TOKEN (or --trigger-token), "
                          "or pass --no-auth when something in front authenticates")
    if no_auth:
        logger.warning("--no-auth: anyone who can reach this port can start drains")
        return None
    assert token is not None
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"DRAINER_TRIGGER_TOKEN is too short ({len(token)} characters): use "
                          f"at least {MIN_TOKEN_LENGTH}, e.g. python3 -c 'import secrets; "
                          "print(secrets.token_urlsafe(32))'")
    return token


def parse_listen(value: str, flag: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT``, ``[::1]:PORT`` or ``:PORT`` (all interfaces) -> (host, port)."""
    host, sep, port_s = value.rpartition(":")
    if not sep or not port_s.isascii() or not port_s.isdigit() or int(port_s) > 65535:
        raise ConfigError(f"{flag}: expected HOST:PORT (e.g. 127.0.0.1:8080), got {value!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port_s)
