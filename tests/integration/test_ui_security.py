"""drainer ui's security rules over real HTTP, on a real PostgreSQL: the token (length,
constant-time compare, never shown), CSRF and Origin/Host checks, viewing off loopback,
escaping of what users put in jobs, and serve's connection cap and header deadline."""

from __future__ import annotations

import hmac
import http.client
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest
from psycopg import sql

from drainer import ops
from drainer.producer import enqueue
from drainer.settings import Settings
from drainer.status import collect_status
from drainer.ui import Dashboard, make_ui_server, serve_ui
from drainer.ui.auth import COOKIE, Guard
from drainer.ui.html import Frame
from drainer.ui.refresh import RefreshPolicy
from drainer.ui.server import UiServer
from drainer.waking import IdleTimeout
from tests.conftest import run_cli

TOKEN = "ui-test-token-0123456789"
HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)>"
ODD_QUEUE = "<marquee>odd queue</marquee>"


@dataclass
class Served:
    port: int
    settings: Settings
    dashboard: Dashboard
    cookies: dict[str, str] = field(default_factory=dict)

    def request(self, method: str, path: str, *, form: dict[str, str] | None = None,
                headers: dict[str, str] | None = None, cookie: bool = True
                ) -> tuple[int, dict[str, str], str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        hdrs = {"Host": f"127.0.0.1:{self.port}", **(headers or {})}
        if cookie and self.cookies:
            hdrs["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body = urlencode(form)
            hdrs["Content-Type"] = "application/x-www-form-urlencoded"
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        text = resp.read().decode()
        out = {k.lower(): v for k, v in resp.getheaders()}
        conn.close()
        return resp.status, out, text

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sign_in(self) -> None:
        status, headers, _ = self.request("POST", "/login", form={"token": TOKEN, "next": "/"},
                                          headers={"Origin": self.origin})
        assert status == 303, status
        name, _, value = headers["set-cookie"].split(";")[0].partition("=")
        self.cookies[name] = value

    def csrf(self, path: str = "/") -> str:
        _, _, page = self.request("GET", path)
        match = re.search(r'name="csrf" value="([^"]+)"', page)
        assert match, page[:500]
        return match[1]


def _serve(settings: Settings, token: str | None, *, host: str = "127.0.0.1",
           max_connections: int | None = None) -> Iterator[Served]:
    dashboard = Dashboard(settings, guard=Guard(token, bind_host=host),
                          refresh=RefreshPolicy(IdleTimeout(300.0, "--idle-timeout")))
    server = (make_ui_server(dashboard, "127.0.0.1", 0) if max_connections is None
              else UiServer(("127.0.0.1", 0), dashboard, max_connections))
    stop = threading.Event()
    thread = threading.Thread(target=serve_ui, args=(server, stop), daemon=True)
    thread.start()
    try:
        yield Served(server.server_address[1], settings, dashboard)
    finally:
        stop.set()
        thread.join(10)


@pytest.fixture
def jobs(migrated: Settings, conn: psycopg.Connection[Any]) -> dict[str, int]:
    s = migrated
    ids = {"queued": enqueue(conn, "mail", {"n": 1}, schema=s.schema_name),
           "hostile": enqueue(conn, ODD_QUEUE, {"x": HOSTILE}, schema=s.schema_name)}
    failed = enqueue(conn, "mail", {"n": 2}, schema=s.schema_name)
    conn.execute(sql.SQL("UPDATE {} SET status = 'failed', attempts = 5, finished_at = now(), "
                         "last_error = %s WHERE id = ANY(%s)").format(
        sql.Identifier(s.schema_name, "jobs")), [f"ValueError: {HOSTILE}",
                                                   [failed, ids["hostile"]]])
    ids["failed"] = failed
    assert all(ids.values())
    return {k: int(v) for k, v in ids.items() if v is not None}


@pytest.fixture
def served(migrated: Settings, jobs: dict[str, int]) -> Iterator[Served]:
    yield from _serve(migrated, TOKEN)


def _status(settings: Settings, job_id: int) -> str:
    return str(ops.get_job(settings, job_id)["status"])


# -- the token ------------------------------------------------------------------------------------


def test_a_ui_token_shorter_than_16_characters_is_refused_at_start(pg_url: str,
                                                                     schema: str) -> None:
    result = run_cli(["ui", "--port", "0"], pg_url=pg_url, schema=schema,
                     DRAINER_UI_TOKEN="fifteen-chars15")
    assert result.returncode == 2, result.stderr
    assert "DRAINER_UI_TOKEN is too short (15 characters): use at least 16" in result.stderr
    assert "fifteen-chars15" not in result.stderr + result.stdout


def test_listening_off_loopback_needs_the_token(pg_url: str, schema: str) -> None:
    result = run_cli(["ui", "--host", "0.0.0.0", "--port", "0"], pg_url=pg_url, schema=schema)
    assert result.returncode == 2
    assert "reachable from other machines: set DRAINER_UI_TOKEN" in result.stderr


def test_off_loopback_viewing_needs_the_token_too(migrated: Settings,
                                                  jobs: dict[str, int]) -> None:
    for s in _serve(migrated, TOKEN, host="0.0.0.0"):
        status, _, page = s.request("GET", "/", headers={"Host": "dash.example:8080"})
        assert status == 401 and "Viewing and actions need the UI token here" in page
        assert "mail" not in page and "Read the database at" not in page
        status, _, page = s.request("GET", f"/jobs/{jobs['queued']}",
                                    headers={"Host": "dash.example:8080",
                                             "Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and f"Job {jobs['queued']}" in page


def test_the_token_is_compared_in_constant_time(served: Served,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr("drainer.ui.auth.hmac.compare_digest", recording)
    status, _, _ = served.request("POST", "/login", form={"token": "x" * 24},
                                  headers={"Origin": served.origin})
    assert status == 401
    assert (b"x" * 24, TOKEN.encode()) in calls
    calls.clear()
    served.request("GET", "/", headers={"Authorization": f"Bearer {TOKEN}"})
    assert (TOKEN.encode(), TOKEN.encode()) in calls


def test_the_token_never_appears_in_pages_headers_or_logs(
        served: Served, jobs: dict[str, int], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="drainer")
    seen: list[str] = []
    for token in ("wrong-token-000000000", TOKEN):
        _, headers, page = served.request("POST", "/login", form={"token": token},
                                          headers={"Origin": served.origin})
        seen += [page, *headers.values()]
    served.sign_in()
    for path in ("/", "/jobs", f"/jobs/{jobs['failed']}", f"/confirm/retry?job={jobs['failed']}",
                 "/runs", "/recurring", "/login"):
        status, headers, page = served.request("GET", path)
        assert status == 200, path
        seen += [page, *headers.values()]
    csrf = served.csrf()
    _, headers, page = served.request("POST", "/act/retry", form={
        "job": str(jobs["failed"]), "confirm": "yes", "csrf": csrf},
        headers={"Origin": served.origin})
    assert "retried" in page
    seen += [page, *headers.values(), *served.cookies.values(), caplog.text]
    assert not [s for s in seen if TOKEN in s]


# -- cross-site requests --------------------------------------------------------------------------


def test_an_action_needs_the_sign_in_the_csrf_token_and_the_pages_origin(
        served: Served, jobs: dict[str, int]) -> None:
    form = {"queue": "mail", "confirm": "yes"}
    status, _, page = served.request("POST", "/act/pause", form=form,
                                     headers={"Origin": served.origin})
    assert status == 403 and "sign in with the UI token first" in page
    served.sign_in()
    csrf = served.csrf()
    refused = [
        ({**form}, {"Origin": served.origin}, "CSRF token is missing or wrong"),
        ({**form, "csrf": csrf[:-1] + ("0" if csrf[-1] != "0" else "1")},
         {"Origin": served.origin}, "CSRF token is missing or wrong"),
        ({**form, "csrf": csrf}, {"Origin": "http://evil.example"}, "cross-site request"),
        ({**form, "csrf": csrf}, {"Origin": "null"}, "cross-site request"),
        ({**form, "csrf": csrf}, {}, "cross-site request"),
        ({**form, "csrf": csrf}, {"Referer": "http://evil.example/page"}, "cross-site"),
        ({"queue": "mail", "csrf": csrf}, {"Origin": served.origin}, "not confirmed"),
    ]
    for f, headers, why in refused:
        status, _, page = served.request("POST", "/act/pause", form=f, headers=headers)
        assert status in (400, 403) and why in page, (f, headers, status, page[-600:])
    assert collect_status(served.settings)["paused_queues"] == {}
    status, _, page = served.request("POST", "/act/pause", form={**form, "csrf": csrf},
                                     headers={"Referer": served.origin + "/confirm/pause"})
    assert status == 200 and "Pause queue mail: done" in page
    status, _, page = served.request("GET", "/")
    assert "paused" in page


def test_a_csrf_token_of_another_sign_in_or_ui_token_is_refused(
        served: Served, migrated: Settings) -> None:
    served.sign_in()
    mine = served.csrf()
    other_guard = Guard("another-ui-token-0123", bind_host="127.0.0.1")
    nonce = "x" * 24
    forged = {"queue": "mail", "confirm": "yes", "csrf": other_guard.csrf(nonce)}
    status, _, page = served.request("POST", "/act/pause", form=forged,
                                     headers={"Origin": served.origin})
    assert status == 403 and "CSRF" in page
    # a cookie signed with another token is no sign-in at all
    status, _, page = served.request("POST", "/act/pause", form={**forged, "csrf": mine},
                                     headers={"Origin": served.origin,
                                              "Cookie": f"{COOKIE}={other_guard.new_session()}"},
                                     cookie=False)
    assert status == 403 and "sign in" in page


def test_a_host_header_naming_another_site_is_refused_on_loopback(served: Served) -> None:
    # DNS rebinding: evil.example resolved to 127.0.0.1 reads nothing
    status, _, text = served.request("GET", "/", headers={"Host": "evil.example"})
    assert status == 403 and "unknown Host" in text
    assert served.request("GET", "/", headers={"Host": f"localhost:{served.port}"})[0] == 200


def test_a_script_can_act_with_the_bearer_token_and_is_fenced_as_the_cli(
        served: Served, jobs: dict[str, int]) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    status, _, page = served.request("POST", "/act/retry", form={
        "job": str(jobs["failed"]), "confirm": "yes"}, headers=bearer)
    assert status == 200 and re.search(r"<dt>retried</dt><dd>1</dd>", page)
    assert _status(served.settings, jobs["failed"]) == "queued"
    status, _, page = served.request("POST", "/act/retry", form={
        "job": str(jobs["failed"]), "confirm": "yes"}, headers=bearer)
    assert re.search(r"<dt>retried</dt><dd>0</dd>", page)
    assert re.search(r"<dt>not failed</dt><dd>1</dd>", page)
    status, _, page = served.request("POST", "/act/cancel", form={
        "job": str(jobs["queued"]), "confirm": "yes"}, headers=bearer)
    assert re.search(r"<dt>cancelled queued</dt><dd>1</dd>", page)
    assert _status(served.settings, jobs["queued"]) == "cancelled"
    # a queue's failed jobs: the hostile queue's one
    status, _, page = served.request("POST", "/act/retry", form={
        "queue": ODD_QUEUE, "confirm": "yes"}, headers=bearer)
    assert re.search(r"<dt>retried</dt><dd>1</dd>", page), page[-800:]
    assert _status(served.settings, jobs["hostile"]) == "queued"


def test_limits_are_set_through_their_confirm_step(served: Served) -> None:
    served.sign_in()
    status, _, page = served.request("GET", "/confirm/limit?queue=mail&max_running=3&rate=5%2Fm")
    assert status == 200 and "set to 3" in page and "set to 5/m" in page
    assert "Limits now" in page
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match
    served.request("POST", "/act/limit", form={"queue": "mail", "max_running": "3",
                                               "rate": "5/m", "confirm": "yes",
                                               "csrf": match[1]},
                   headers={"Origin": served.origin})
    [entry] = ops.limit(served.settings, ["mail"])["limits"]
    assert (entry["max_running"], entry["rate_limit"]) == (3, "5/m")
    status, _, page = served.request("GET", "/confirm/limit?queue=mail&rate=lots")
    assert status == 400 and "not a rate limit: &#x27;lots&#x27;" in page


# -- escaping -------------------------------------------------------------------------------------


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_payloads_errors_and_queue_names_are_escaped(served: Served,
                                                     jobs: dict[str, int]) -> None:
    for path in ("/", "/jobs", f"/jobs/{jobs['hostile']}",
                 "/jobs?" + urlencode({"queue": ODD_QUEUE}), "/jobs?error=%3Cscript%3E"):
        status, headers, page = served.request("GET", path)
        assert status == 200, path
        assert "script-src" not in headers["content-security-policy"]  # no script at all
        p = _Tags()
        p.feed(page)
        assert not {"script", "img", "marquee"} & set(p.tags), (path, set(p.tags))
        text = "".join(p.text)
        assert ODD_QUEUE in text, path
        if path != "/":
            assert "<script>" in text, path


# -- the server's defences (serve's) --------------------------------------------------------------


def test_a_client_that_trickles_its_headers_is_cut_off(
        migrated: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("drainer._http.HEADER_DEADLINE_S", 0.5)
    for s in _serve(migrated, TOKEN):
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(b"GET / HTTP/1.1\r\nHo")
            try:
                while sock.recv(1024):
                    pass
            except ConnectionResetError:
                pass
            assert time.monotonic() - started < 5


def test_at_the_connection_cap_the_oldest_idle_connection_makes_room(
        migrated: Settings) -> None:
    for s in _serve(migrated, TOKEN, max_connections=2):
        idle = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(2)]
        # both accepted and counted before the third comes: a fifth of a second was not
        # always enough on a loaded machine (the oldest was closed without its 503)
        time.sleep(1.0)
        try:
            status, _, _ = s.request("GET", "/healthz")
            assert status == 200
            assert b"503" in idle[0].recv(1024)  # told why, then closed
        finally:
            for sock in idle:
                sock.close()


def test_at_the_cap_the_connection_accepted_first_makes_room_whatever_thread_started_first(
        migrated: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two idle connections: the first accepted one's thread starts after the second's (held
    back here, as a loaded machine may). The oldest is the one accepted first: it is told
    503 and closed, and the second one still waits for its request."""
    from drainer._http import GuardedHandler

    first = threading.Event()
    setup = GuardedHandler.setup

    def late_first(handler: GuardedHandler) -> None:
        if not first.is_set():
            first.set()
            time.sleep(0.5)
        setup(handler)

    monkeypatch.setattr(GuardedHandler, "setup", late_first)
    for s in _serve(migrated, TOKEN, max_connections=2):
        idle = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(2)]
        time.sleep(1.0)  # both threads started, the first one last
        try:
            status, _, _ = s.request("GET", "/healthz")
            assert status == 200
            assert b"503" in idle[0].recv(1024)
            idle[1].settimeout(0.3)
            with pytest.raises(TimeoutError):  # still open, nothing sent to it
                idle[1].recv(1024)
        finally:
            for sock in idle:
                sock.close()


# -- the extra pages (the fleet view's place) -----------------------------------------------------


@dataclass
class _Page:
    path: str = "/fleet"
    title: str = "Fleet"
    calls: int = 0

    def render(self, query: dict[str, str], frame: Frame) -> str:
        self.calls += 1
        return f"<p>tenants: {len(query)}</p>"


def test_an_extra_page_is_served_and_listed_in_the_navigation(migrated: Settings) -> None:
    page = _Page()
    dashboard = Dashboard(migrated, guard=Guard(None, bind_host="127.0.0.1"),
                          refresh=RefreshPolicy(IdleTimeout(300.0, "--idle-timeout")),
                          extra_pages=[page])
    got = dashboard.handle("GET", "/fleet?a=1", {"Host": "127.0.0.1:8080"})
    assert (got.status, got.body) == (200, "<p>tenants: 1</p>") and page.calls == 1
    nav = dashboard.handle("GET", "/awake", {"Host": "127.0.0.1:8080"})
    assert '<a href="/fleet">Fleet</a>' in nav.body
