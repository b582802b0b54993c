"""``drainer ui``'s routes: :class:`Dashboard` answers a request (method, path, headers,
body) with a page, apart from the socket (drainer/ui/server.py).

A page load opens one database connection, reads, closes it, and only then is the page
drawn; between two requests nothing here holds a database connection or runs a timer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Protocol
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from drainer._redact import redact
from drainer.errors import ConfigError, DatabaseUnavailable, DrainerError
from drainer.ui import auth, data
from drainer.ui.actions import Action
from drainer.ui.html import Frame
from drainer.ui.refresh import RefreshPolicy, parse_refresh

if TYPE_CHECKING:
    from email.message import Message

    from drainer.registry import Registry
    from drainer.settings import Settings

logger = logging.getLogger("drainer.ui")

#: Headers of every page: no caching, no framing (clickjacking of the action buttons), no
#: script or anything fetched (the pages need neither), no Referer to other sites (a
#: same-origin one: a POST of the pages' own forms then carries their Origin, not "null").
PAGE_HEADERS = (
    ("Content-Type", "text/html; charset=utf-8"),
    ("Cache-Control", "no-store"),
    ("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; "
     "img-src data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
)


@dataclass
class Response:
    status: int
    body: str
    headers: list[tuple[str, str]] = field(default_factory=list)


class ExtraPage(Protocol):
    """A page served beside the built-in ones, listed in the navigation: the fleet view
    (tenants with their due time, last outcome and error, read from the fleet's control
    database only) plugs in here. ``render`` draws it from the query parameters."""

    path: str
    title: str

    def render(self, query: Mapping[str, str], frame: Frame) -> str: ...


class ServerLinks:
    """The server's paths (drainer/ui/html.Links)."""

    def queues(self) -> str:
        return "/"

    def jobs(self, f: data.JobFilter) -> str:
        q = {"queue": f.queue, "status": f.status, "run": f.run_id, "error": f.error,
             "before": f.before, "after": f.after}
        query = urlencode({k: v for k, v in q.items() if v is not None})
        return "/jobs" + (f"?{query}" if query else "")

    def job(self, job_id: int) -> str:
        return f"/jobs/{job_id}"

    def runs(self, page: int = 1) -> str:
        return "/runs" if page == 1 else f"/runs?page={page}"

    def run(self, run_id: str) -> str:
        return "/runs/" + quote(run_id, safe="")

    def recurring(self) -> str:
        return "/recurring"

    def awake(self) -> str:
        return "/awake"


def attempts_limits(registry: Registry | None) -> dict[str, int | None]:
    """Each queue of the app -> its task's max_attempts (None: the row's applies)."""
    return {} if registry is None else {q: t.attempts_limit
                                        for q, t in registry.tasks.items()}


def _int(query: Mapping[str, str], name: str) -> int | None:
    raw = query.get(name, "").strip()
    if not raw:
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 19:
        raise ConfigError(f"{name}: not a number: {raw[:40]!r}")
    return int(raw)


def _safe_next(value: str | None) -> str:
    """Where to go after signing in: a path of this server only (no //host, no scheme, and
    nothing that would end the Location header: it is sent as it is)."""
    if (not value or not value.startswith("/") or value.startswith("//") or "\\" in value
            or not value.isprintable() or not value.isascii()):
        return "/"
    return value


class Dashboard:
    """The pages and actions of ``drainer ui``, independent of the socket."""

    def __init__(self, settings: Settings, *, guard: auth.Guard, refresh: RefreshPolicy,
                 registry: Registry | None = None, extra_pages: Sequence[ExtraPage] = (),
                 secure_cookie: bool = False) -> None:
        self.settings = settings
        self.guard = guard
        self.refresh = refresh
        self.registry = registry
        self.extra = {p.path: p for p in extra_pages}
        self.secure_cookie = secure_cookie
        self.links = ServerLinks()
        self.attempts_limits = attempts_limits(registry)
        self._pages: dict[str, Callable[[Mapping[str, str], Frame], str]] = {
            "/": self._queues, "/jobs": self._jobs, "/runs": self._runs,
            "/recurring": self._recurring, "/awake": self._awake}

    # -- the frame ----------------------------------------------------------------------------
    def _frame(self, visitor: auth.Visitor, path: str, query: Mapping[str, str]) -> Frame:
        if visitor.can_act:
            actions = "on"
        elif self.guard.has_token:
            actions = "sign-in"
        else:
            actions = ("start drainer ui with DRAINER_UI_TOKEN set (at least "
                       f"{auth.MIN_TOKEN_LENGTH} characters) to retry, cancel, pause and "
                       "set limits")
        refresh_s, note = self.refresh.choose(parse_refresh(query.get("refresh")))
        rest = {k: v for k, v in query.items() if k != "refresh"}

        def at(value: float | None) -> str:
            q = urlencode({**rest, **({"refresh": f"{value:.0f}"} if value else {})})
            return path + (f"?{q}" if q else "")

        from drainer.waking import fmt_seconds

        choices = [("off", at(None))] + [(f"every {fmt_seconds(s)}", at(s))
                                         for s in self.refresh.offers()]
        return Frame(self.links, actions=actions,
                     csrf=self.guard.csrf(visitor.nonce) if visitor.nonce else None,
                     refresh_s=refresh_s, refresh_note=note, refresh_choices=choices,
                     extra_nav=[(p.title, p.path) for p in self.extra.values()],
                     signed_in=visitor.nonce is not None,
                     view_needs_token=self.guard.view_needs_token)

    # -- the pages ----------------------------------------------------------------------------
    def _queues(self, query: Mapping[str, str], frame: Frame) -> str:
        from drainer.ui.pages import queues_page

        return queues_page(frame, data.queues(self.settings, self.registry))

    def _filter(self, query: Mapping[str, str]) -> data.JobFilter:
        return data.JobFilter.of(queue=query.get("queue"), status=query.get("status"),
                                 run_id=query.get("run"), error=query.get("error"),
                                 before=_int(query, "before"), after=_int(query, "after"))

    def _jobs(self, query: Mapping[str, str], frame: Frame) -> str:
        from drainer.ui.pages import jobs_page

        return jobs_page(frame, data.jobs(self.settings, self._filter(query)))

    def _job(self, job_id: int, frame: Frame) -> str:
        from drainer.ui.job_pages import job_page

        return job_page(frame, data.job(self.settings, job_id), job_id, self.attempts_limits)

    def _runs(self, query: Mapping[str, str], frame: Frame) -> str:
        from drainer.ui.pages import runs_page

        return runs_page(frame, data.runs(self.settings, _int(query, "page") or 1))

    def _run(self, run_id: str, query: Mapping[str, str], frame: Frame) -> str:
        from drainer.ui.job_pages import run_page

        return run_page(frame, data.run(self.settings, run_id, self._filter(query)), run_id)

    def _recurring(self, query: Mapping[str, str], frame: Frame) -> str:
        from drainer.ui.pages import recurring_page

        return recurring_page(frame, data.recurring(self.settings, self.registry))

    def _awake(self, query: Mapping[str, str], frame: Frame) -> str:
        from drainer.ui.pages import awake_page

        if not query.get("sample"):
            return awake_page(frame, None, data.Read.nothing(), data.DEFAULT_SAMPLE_S)
        seconds = data.sample_seconds(query.get("seconds"))
        snap = data.awake(self.settings, seconds)
        return awake_page(frame, snap, snap.read, seconds)

    # -- requests -----------------------------------------------------------------------------
    def handle(self, method: str, target: str, request_headers: Mapping[str, str] | Message,
               body: bytes | None = None) -> Response:
        """Answer one request (``request_headers``: the request's, names in any case)."""
        headers = {k.lower(): v for k, v in request_headers.items()}
        parts = urlsplit(target)
        path = parts.path or "/"
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        if path == "/healthz":  # from the process: a health check must not wake the compute
            return Response(200, "ok\n", [("Content-Type", "text/plain")])
        if not self.guard.host_allowed(headers.get("host")):
            return Response(403, "unknown Host (see drainer ui --allowed-host)\n",
                            [("Content-Type", "text/plain")])
        visitor = self.guard.visitor(headers, auth.parse_cookies(headers.get("cookie")))
        frame = self._frame(visitor, path, query)
        form = dict(parse_qsl((body or b"").decode("utf-8", "replace"),
                              keep_blank_values=True)) if method == "POST" else {}
        try:
            return self._route(method, path, query, form, headers, visitor, frame)
        except DrainerError as exc:
            logger.warning("%s %s: %s", method, path, redact(str(exc)))
            return self._error(frame, exc)
        except Exception as exc:  # a database error: one line, no traceback, no secret
            logger.error("%s %s: %s: %s", method, path, type(exc).__name__,
                         redact(" ".join(str(exc).split())))
            return self._page(500, self._error_text(frame, "Error", f"{type(exc).__name__}: "
                              + redact(" ".join(str(exc).split()))[:500]))

    def _route(self, method: str, path: str, query: Mapping[str, str], form: dict[str, str],
               headers: Mapping[str, str], visitor: auth.Visitor, frame: Frame) -> Response:
        if path.startswith(("/login", "/logout", "/confirm/", "/act/")):
            # a step of an action, or signing in: nothing to refresh
            frame = replace(frame, refresh_s=None, refresh_note=None, refresh_choices=[])
        if path in ("/login", "/logout"):
            return self._sign(method, path, query, form, headers, visitor, frame)
        if not visitor.can_view:
            return self._login(frame, path + (f"?{urlencode(query)}" if query else ""),
                               None, 401)
        if method == "POST" and path.startswith("/act/"):
            return self._act(path[len("/act/"):], form, headers, visitor, frame)
        if method not in ("GET", "HEAD"):
            return self._page(405, self._error_text(frame, "Not allowed", f"{method} {path}"),
                              [("Allow", "GET")])
        if path.startswith("/confirm/"):
            return self._confirm(path[len("/confirm/"):], query, visitor, frame)
        if path in self._pages:
            return self._page(200, self._pages[path](query, frame))
        if path in self.extra:
            return self._page(200, self.extra[path].render(query, frame))
        if path.startswith("/jobs/") and path[len("/jobs/"):].isdigit():
            job_id = _int({"job": path[len("/jobs/"):]}, "job")
            assert job_id is not None
            return self._page(200, self._job(job_id, frame))
        if path.startswith("/runs/") and len(path) > len("/runs/"):
            return self._page(200, self._run(unquote(path[len("/runs/"):]), query, frame))
        return self._page(404, self._error_text(frame, "Not found", f"no page {path}"))

    # -- actions ------------------------------------------------------------------------------
    def _confirm(self, kind: str, query: Mapping[str, str], visitor: auth.Visitor,
                 frame: Frame) -> Response:
        from drainer.ui.job_pages import confirm_page

        if not self.guard.has_token:
            return self._page(403, self._error_text(frame, "Actions are off",
                                                    f"Actions are off: {frame.actions}."))
        if not visitor.can_act:
            return self._login(frame, f"/confirm/{kind}?{urlencode(query)}", None, 401)
        action = Action.parse(kind, query)
        started = time.monotonic()
        preview = action.preview(self.settings)
        read = (data.Read(_now(), time.monotonic() - started) if preview is not None
                else data.Read.nothing())
        return self._page(200, confirm_page(frame, action, preview, read))

    def _act(self, kind: str, form: Mapping[str, str], headers: Mapping[str, str],
             visitor: auth.Visitor, frame: Frame) -> Response:
        from drainer.ui.job_pages import result_page

        refused = self.guard.may_post(visitor, headers, form)
        if refused is not None:
            logger.warning("refused POST /act/%s: %s", kind[:40], refused)
            return self._page(403, self._error_text(frame, "Refused", refused))
        if form.get("confirm") != "yes":
            raise ConfigError("the action was not confirmed (post it from its confirm page)")
        action = Action.parse(kind, form)
        started = time.monotonic()
        result = action.perform(self.settings)
        logger.info("%s: done through drainer ui", action.title(),
                    extra={"action": action.kind, **action.fields()})
        read = data.Read(_now(), time.monotonic() - started)
        return self._page(200, result_page(frame, action, result, read))

    # -- signing in and out -------------------------------------------------------------------
    def _sign(self, method: str, path: str, query: Mapping[str, str], form: Mapping[str, str],
              headers: Mapping[str, str], visitor: auth.Visitor, frame: Frame) -> Response:
        if not self.guard.has_token:
            return self._page(404, self._error_text(frame, "No sign-in", "no UI token is "
                                                    "set: there is nothing to sign in to"))
        if path == "/logout":
            if method != "POST" or self.guard.may_post(visitor, headers, form) is not None:
                return self._page(403, self._error_text(frame, "Refused", "sign out from "
                                                        "the page's own button"))
            return Response(303, "", [("Location", "/"), ("Set-Cookie", auth.cookie_header(
                "", secure=self.secure_cookie, max_age=0))])
        if method != "POST":
            return self._login(frame, _safe_next(query.get("next")), None, 200)
        target = _safe_next(form.get("next"))
        if not self.guard.same_origin(headers):
            return self._login(frame, target, "cross-site sign-in refused", 403)
        if not self.guard.token_matches(form.get("token", "")):
            logger.warning("drainer ui: sign-in with a wrong token refused")
            return self._login(frame, target, "wrong token", 401)
        cookie = auth.cookie_header(self.guard.new_session(), secure=self.secure_cookie)
        return Response(303, "", [("Location", target), ("Set-Cookie", cookie)])

    def _login(self, frame: Frame, next_path: str, error: str | None, status: int
               ) -> Response:
        from drainer.ui.job_pages import login_page

        return self._page(status, login_page(frame, next_path, error, data.Read.nothing()))

    # -- answers ------------------------------------------------------------------------------
    def _page(self, status: int, html: str, extra: Sequence[tuple[str, str]] = ()
              ) -> Response:
        return Response(status, html, [*PAGE_HEADERS, *extra])

    def _error_text(self, frame: Frame, title: str, message: str) -> str:
        from drainer.ui.job_pages import error_page

        return error_page(frame, title, message, data.Read.nothing())

    def _error(self, frame: Frame, exc: DrainerError) -> Response:
        from drainer.ops import JobNotFound

        status = (400 if isinstance(exc, ConfigError) else 404 if isinstance(exc, JobNotFound)
                  else 503 if isinstance(exc, DatabaseUnavailable) or exc.exit_code == 4
                  else 500)
        title = {400: "Bad request", 404: "Not found", 503: "Database unavailable"}.get(
            status, "Error")
        return self._page(status, self._error_text(frame, title, redact(str(exc))))


def _now() -> datetime:
    return datetime.now(timezone.utc)
