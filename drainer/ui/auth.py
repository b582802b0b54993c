"""Who may look and act on ``drainer ui``: the token, the sign-in cookie, the CSRF token and
the Origin/Host checks. Pure: nothing here reads a socket or the database.

- ``DRAINER_UI_TOKEN`` (at least 16 characters) is compared in constant time
  (:func:`hmac.compare_digest`). Scripts send it as ``Authorization: Bearer``; a browser
  signs in once with it and gets a cookie (``HttpOnly``, ``SameSite=Strict``) that holds a
  signature made with the token, never the token itself.
- Actions need the token. Viewing needs it too when the server listens on anything but
  loopback (or answers for other host names, ``--allowed-host``).
- A form posted with the cookie carries a CSRF token, an HMAC of the sign-in's nonce keyed
  by the UI token (a new token invalidates them all), and must come from the page's own
  origin (``Origin``, else ``Referer``, must name the Host the request was sent to).
- On loopback the Host header must be a loopback name: a page of another site that
  resolves its own name to 127.0.0.1 (DNS rebinding) gets nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from drainer.errors import ConfigError
from drainer.serve import MIN_TOKEN_LENGTH as MIN_TOKEN_LENGTH

#: The sign-in cookie.
COOKIE = "drainer_ui"
#: How long a sign-in lasts (seconds).
SESSION_TTL_S = 12 * 3600
LOOPBACK_NAMES = ("localhost", "localhost.localdomain")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost (a bind address or a Host header's name)."""
    name = host.strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_token(token: str | None) -> str | None:
    """The UI token as set, or a ConfigError when it is too short."""
    if token is None or token == "":
        return None
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"DRAINER_UI_TOKEN is too short ({len(token)} characters): use at "
                          f"least {MIN_TOKEN_LENGTH}, e.g. the output of python3 -c 'import "
                          "secrets; print(secrets.token_urlsafe(32))'")
    return token


def _split_host(value: str) -> str:
    """The name of a Host header (``[::1]:8080`` -> ``::1``, ``a.example:80`` -> ``a.example``)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


@dataclass(frozen=True)
class Visitor:
    """What one request may do: view, act, and the nonce of its sign-in (for its CSRF)."""

    can_view: bool
    can_act: bool
    nonce: str | None = None
    by_bearer: bool = False


class Guard:
    """The rules of one ``drainer ui`` server."""

    def __init__(self, token: str | None, *, bind_host: str,
                 allowed_hosts: Iterable[str] = ()) -> None:
        self._key = None if token is None else token.encode("utf-8")
        self.allowed_hosts = {h.lower() for h in allowed_hosts}
        self.loopback = is_loopback(bind_host)
        #: viewing needs the token too: reachable from elsewhere than this machine
        self.view_needs_token = not self.loopback or bool(self.allowed_hosts)
        if self.view_needs_token and self._key is None:
            raise ConfigError(
                f"drainer ui on {bind_host}"
                + (f" answering for {', '.join(sorted(self.allowed_hosts))}"
                   if self.allowed_hosts else "")
                + " is reachable from other machines: set DRAINER_UI_TOKEN (at least "
                f"{MIN_TOKEN_LENGTH} characters), which viewing needs there too")

    @property
    def has_token(self) -> bool:
        return self._key is not None

    # -- the token ----------------------------------------------------------------------------
    def token_matches(self, given: str) -> bool:
        """Constant time: how much of a guess is right does not show in the time taken."""
        if self._key is None:
            return False
        return hmac.compare_digest(given.encode("utf-8", "replace"), self._key)

    def _mac(self, kind: str, *parts: str) -> str:
        assert self._key is not None
        return hmac.new(self._key, "|".join((kind, *parts)).encode(), hashlib.sha256
                        ).hexdigest()

    # -- the sign-in cookie -------------------------------------------------------------------
    def new_session(self, now: float | None = None) -> str:
        """A cookie value: ``issued.nonce.signature`` (the token itself is not in it)."""
        issued = str(int(time.time() if now is None else now))
        nonce = secrets.token_urlsafe(18)
        return f"{issued}.{nonce}.{self._mac('session', issued, nonce)}"

    def session_nonce(self, cookie: str | None, now: float | None = None) -> str | None:
        """The nonce of a valid, unexpired cookie value, else None."""
        if self._key is None or not cookie or cookie.count(".") != 2:
            return None
        issued, nonce, mac = cookie.split(".")
        if not hmac.compare_digest(mac.encode(), self._mac("session", issued, nonce).encode()):
            return None
        age = (time.time() if now is None else now) - int(issued) if issued.isdigit() else -1
        return nonce if 0 <= age <= SESSION_TTL_S else None

    def csrf(self, nonce: str) -> str:
        """The CSRF token of the forms shown to one sign-in."""
        return self._mac("csrf", nonce)

    def csrf_matches(self, nonce: str | None, given: str | None) -> bool:
        if nonce is None or not given or self._key is None:
            return False
        return hmac.compare_digest(given.encode("utf-8", "replace"), self.csrf(nonce).encode())

    # -- requests -----------------------------------------------------------------------------
    def host_allowed(self, host_header: str | None) -> bool:
        """On loopback: only loopback names or --allowed-host ones; else any Host (viewing
        needs the token there anyway)."""
        if not host_header:
            return False
        name = _split_host(host_header)
        if name in self.allowed_hosts:
            return True
        return is_loopback(name) if self.loopback else True

    def visitor(self, headers: Mapping[str, str], cookies: Mapping[str, str]) -> Visitor:
        """``headers``: the request's, names in lower case (as everywhere here)."""
        auth = headers.get("authorization", "")
        if auth.startswith("Bearer ") and self.token_matches(auth[len("Bearer "):]):
            return Visitor(True, True, None, by_bearer=True)
        nonce = self.session_nonce(cookies.get(COOKIE))
        if nonce is not None:
            return Visitor(True, True, nonce)
        return Visitor(not self.view_needs_token, False)

    def same_origin(self, headers: Mapping[str, str]) -> bool:
        """The request was sent by a page of this server: its Origin (else its Referer)
        names the Host it was sent to. Neither: refused (a browser sends Origin on every
        POST)."""
        host = (headers.get("host") or "").lower()
        source = headers.get("origin") or headers.get("referer")
        if not host or not source or source == "null":
            return False
        parts = urlsplit(source)
        return parts.scheme in ("http", "https") and parts.netloc.lower() == host

    def may_post(self, visitor: Visitor, headers: Mapping[str, str],
                 form: Mapping[str, str]) -> str | None:
        """None when the visitor may perform a posted action, else why not (one line)."""
        if not self.has_token:
            return ("actions are off: start drainer ui with DRAINER_UI_TOKEN set (at least "
                    f"{MIN_TOKEN_LENGTH} characters)")
        if not visitor.can_act:
            return "sign in with the UI token first"
        if visitor.by_bearer:
            # no ambient credential: a page of another site cannot set this header
            origin = headers.get("origin")
            return None if origin is None or self.same_origin(headers) else \
                "cross-site request refused"
        if not self.same_origin(headers):
            return "cross-site request refused (Origin does not match Host)"
        if not self.csrf_matches(visitor.nonce, form.get("csrf")):
            return "the form's CSRF token is missing or wrong: reload the page and try again"
        return None


def cookie_header(value: str, *, secure: bool, max_age: int = SESSION_TTL_S) -> str:
    """The Set-Cookie value of a sign-in (an empty value with max_age 0 signs out)."""
    return (f"{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}"
            + ("; Secure" if secure else ""))


def parse_cookies(header: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in (header or "").split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name and name not in out:
            out[name] = value
    return out
