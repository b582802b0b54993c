"""drainer ui's pure rules: the auto-refresh interval, the sign-in cookie and CSRF token,
the Host and Origin checks, the actions' parameters, escaping and static file names."""

from __future__ import annotations

import pytest

from drainer.errors import ConfigError
from drainer.ui.actions import Action
from drainer.ui.auth import SESSION_TTL_S, Guard, check_token, is_loopback, parse_cookies
from drainer.ui.data import JobFilter, sample_seconds
from drainer.ui.html import Safe, h, join, tag
from drainer.ui.refresh import MIN_REFRESH_S, RefreshPolicy, parse_refresh
from drainer.ui.routes import _safe_next
from drainer.ui.static import safe_name
from drainer.waking import IdleTimeout

NEON = IdleTimeout(300.0, "--platform neon")
TOKEN = "a-ui-token-of-24-chars!!"


# -- auto-refresh ---------------------------------------------------------------------------------


def test_refresh_is_off_unless_asked_for() -> None:
    assert RefreshPolicy(NEON).choose(None) == (None, None)
    assert RefreshPolicy(NEON).choose(0) == (None, None)


def test_a_refresh_as_often_as_the_idle_timeout_is_slowed_to_just_over_it() -> None:
    policy = RefreshPolicy(NEON)
    assert policy.minimum == 301.0
    for asked in (10.0, 299.0, 300.0):
        interval, note = policy.choose(asked)
        assert interval == 301.0 and note is not None and "keep the compute awake" in note
    assert policy.choose(301.0) == (301.0, None)
    assert policy.choose(3600.0) == (3600.0, None)
    assert all(o > NEON.seconds for o in policy.offers())


def test_allow_always_on_or_a_compute_that_never_sleeps_refresh_as_asked() -> None:
    for policy in (RefreshPolicy(NEON, allow_always_on=True),
                   RefreshPolicy(IdleTimeout(0.0, "--platform always-on"))):
        assert policy.choose(10.0) == (10.0, None)
        interval, note = policy.choose(1.0)
        assert interval == MIN_REFRESH_S and note is not None


def test_the_refresh_parameter() -> None:
    assert parse_refresh("600") == 600.0 and parse_refresh("10m") == 600.0
    for off in (None, "", "0", "soon", "-5", "nan"):
        assert parse_refresh(off) is None, off


# -- the token, the cookie, CSRF ------------------------------------------------------------------


def test_tokens_shorter_than_16_characters_are_refused() -> None:
    assert check_token(None) is None and check_token("") is None
    assert check_token("x" * 16) == "x" * 16
    with pytest.raises(ConfigError, match=r"too short \(15 characters\)"):
        check_token("x" * 15)


def test_a_sign_in_cookie_is_signed_expires_and_holds_no_token() -> None:
    guard = Guard(TOKEN, bind_host="127.0.0.1")
    cookie = guard.new_session(now=1_000_000.0)
    assert TOKEN not in cookie
    nonce = guard.session_nonce(cookie, now=1_000_000.0 + 60)
    assert nonce is not None
    assert guard.session_nonce(cookie, now=1_000_000.0 + SESSION_TTL_S + 1) is None
    issued, n, mac = cookie.split(".")
    for forged in (f"{int(issued) + 1}.{n}.{mac}", f"{issued}.{n}x.{mac}", f"{issued}.{n}",
                   "", "a.b.c", Guard("another-token-0123456", bind_host="::1")
                   .new_session(now=1_000_000.0)):
        assert guard.session_nonce(forged, now=1_000_000.0 + 60) is None, forged
    assert guard.csrf_matches(nonce, guard.csrf(nonce))
    assert not guard.csrf_matches(nonce, guard.csrf("another nonce"))
    assert not guard.csrf_matches(None, guard.csrf(nonce))


def test_a_guard_without_a_token_lets_no_one_act() -> None:
    guard = Guard(None, bind_host="127.0.0.1")
    assert not guard.token_matches("")
    visitor = guard.visitor({"authorization": "Bearer "}, {})
    assert visitor.can_view and not visitor.can_act
    assert "actions are off" in (guard.may_post(visitor, {}, {}) or "")


def test_off_loopback_or_for_other_names_viewing_needs_a_token() -> None:
    assert not Guard(None, bind_host="127.0.0.1").view_needs_token
    assert Guard(TOKEN, bind_host="0.0.0.0").view_needs_token
    assert Guard(TOKEN, bind_host="127.0.0.1", allowed_hosts=["dash.example"]).view_needs_token
    for host, allowed in (("0.0.0.0", ()), ("192.168.1.4", ()), ("127.0.0.1", ["d.example"])):
        with pytest.raises(ConfigError, match="set DRAINER_UI_TOKEN"):
            Guard(None, bind_host=host, allowed_hosts=allowed)


def test_the_host_header_on_loopback() -> None:
    guard = Guard(TOKEN, bind_host="127.0.0.1", allowed_hosts=["dash.example"])
    for ok in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080", "LOCALHOST", "dash.example:443"):
        assert guard.host_allowed(ok), ok
    for bad in ("evil.example:8080", "127.0.0.1.evil.example", "", None):
        assert not guard.host_allowed(bad), bad
    assert Guard(TOKEN, bind_host="0.0.0.0").host_allowed("anything.example")


def test_same_origin() -> None:
    guard = Guard(TOKEN, bind_host="127.0.0.1")
    host = {"host": "127.0.0.1:8080"}
    assert guard.same_origin({**host, "origin": "http://127.0.0.1:8080"})
    assert guard.same_origin({**host, "origin": "https://127.0.0.1:8080"})
    assert guard.same_origin({**host, "referer": "http://127.0.0.1:8080/confirm/x?y=1"})
    for bad in ({"origin": "http://127.0.0.1:8081"}, {"origin": "null"}, {},
                {"origin": "http://evil.example"}, {"referer": "file:///tmp/x.html"}):
        assert not guard.same_origin({**host, **bad}), bad


def test_loopback_names() -> None:
    assert all(map(is_loopback, ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost")))
    assert not any(map(is_loopback, ("0.0.0.0", "10.0.0.1", "example.com", "::")))


def test_cookies_and_where_a_sign_in_may_go_next() -> None:
    assert parse_cookies("a=1; drainer_ui=x.y.z; b") == {"a": "1", "drainer_ui": "x.y.z"}
    assert _safe_next("/jobs?status=failed") == "/jobs?status=failed"
    for bad in (None, "", "//evil.example/", "http://evil.example/", "/\\evil", "jobs",
                "/\r\nSet-Cookie: x=1", "/jobs\x00", "/jöbs"):
        assert _safe_next(bad) == "/", bad


# -- actions and filters --------------------------------------------------------------------------


def test_actions_take_exactly_what_they_act_on() -> None:
    assert Action.parse("retry", {"job": "7"}).job == 7
    assert Action.parse("retry", {"queue": "mail"}).queue == "mail"
    assert Action.parse("limit", {"queue": "q", "rate": "10/ m"}).rate == "10/m"
    clear = Action.parse("limit", {"queue": "q", "clear": "1"})
    assert clear.clear_max_running and clear.clear_rate
    for kind, params, why in (
            ("retry", {}, "name a job or a queue"), ("retry", {"job": "7", "queue": "q"}, "name"),
            ("cancel", {"queue": "q"}, "name a job"), ("pause", {"job": "1"}, "name a queue"),
            ("retry", {"job": "-1"}, "not a job id"), ("retry", {"job": "9" * 20}, "job id"),
            ("retry", {"job": "１"}, "not a job id"), ("delete", {"job": "1"}, "no such action"),
            ("limit", {"queue": "q"}, "give a max running"),
            ("limit", {"queue": "q", "max_running": "0"}, "at least 1"),
            ("limit", {"queue": "q", "rate": "fast"}, "not a rate limit"),
            ("limit", {"queue": "q", "max_running": "2", "clear": "1"}, "not both")):
        with pytest.raises(ConfigError, match=why):
            Action.parse(kind, params)


def test_job_filters() -> None:
    assert JobFilter.of(queue="  ", error="") == JobFilter()
    with pytest.raises(ConfigError, match="status must be one of"):
        JobFilter.of(status="lost")
    with pytest.raises(ConfigError, match="at most 200"):
        JobFilter.of(error="x" * 201)
    with pytest.raises(ConfigError, match="before or after"):
        JobFilter(before=1, after=2)
    assert sample_seconds(None) == 10.0 and sample_seconds("30s") == 30.0
    for bad in ("0", "61", "soon"):
        with pytest.raises(ConfigError):
            sample_seconds(bad)


# -- HTML -----------------------------------------------------------------------------------------


def test_everything_is_escaped_unless_built_safe() -> None:
    assert h("<a href='x'>&</a>") == "&lt;a href=&#x27;x&#x27;&gt;&amp;&lt;/a&gt;"
    assert h(None) == "-" and h(Safe("<b>")) == "<b>"
    assert tag("td", "<x>", class_='a"b') == '<td class="a&quot;b">&lt;x&gt;</td>'
    assert join(["<", Safe("<i>"), "", None], " ") == "&lt; <i>"


def test_static_file_names_keep_each_name_apart() -> None:
    names = ["a b", "a_b", "a~20b", "a/b", "ä", "a-b"]
    assert len({safe_name(n) for n in names}) == len(names)
    assert all(set(safe_name(n)) <= set("abcdefghijklmnopqrstuvwxyz0123456789~_-ABCDEF")
               for n in names)
