"""Keep DSN passwords out of every message drainer prints."""

from __future__ import annotations

import re
from urllib.parse import unquote

_secrets: set[str] = set()

_URL_PASSWORD = re.compile(
    r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)(?P<pw>[^@\s]*)(?P<tail>@)", re.I
)
_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<pw>'(?:[^'\\]|\\.)*'|\S+)", re.I)


#: Secrets shorter than this are masked only where they stand alone (not inside a word):
#: masking a one-letter token everywhere garbles every message (``e***pected HOST:PORT``).
WHOLE_WORD_BELOW = 8


def remember_secret(value: str | None) -> None:
    """Register a secret (a password) that must never be printed."""
    if value:
        _secrets.add(value)
        _secrets.add(unquote(value))


def password_of(dsn: str) -> str | None:
    """The password inside a URL or key=value DSN, if any (no validation)."""
    m = _URL_PASSWORD.search(dsn)
    if m and m.group("pw"):
        return m.group("pw")
    m = _KV_PASSWORD.search(dsn)
    if m:
        return m.group("pw").strip("'")
    return None


def redact(text: str) -> str:
    """Return ``text`` with DSN passwords and registered secrets replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + "***" + m.group("tail"), text)
    text = _KV_PASSWORD.sub(lambda m: m.group("head") + "***", text)
    for secret in sorted(_secrets, key=len, reverse=True):
        if len(secret) >= WHOLE_WORD_BELOW:
            text = text.replace(secret, "***")
        elif secret:
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", "***", text)
    return text
