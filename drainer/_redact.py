"""Keep DSN passwords and tokens out of every message drainer prints."""

from __future__ import annotations

import re
import threading
from typing import NamedTuple
from urllib.parse import unquote

_URL_PASSWORD = re.compile(
    r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)(?P<pw>[^@\s]*)(?P<tail>@)", re.I
)
_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<pw>'(?:[^'\\]|\\.)*'|\S+)", re.I)


#: Secrets shorter than this are masked only where they stand alone (not inside a word):
#: masking a one-letter token everywhere garbles every message (``e***pected HOST:PORT``).
WHOLE_WORD_BELOW = 8

#: Where a secret that reads as a word stands as a value, not as a word of a sentence: at
#: the start of a line, after a quote or ``=``, after ``Bearer``, after a flag
#: (``--trigger-token short``). Elsewhere ``short`` is the word of "is too short", and
#: masking it there shows which word the token is.
_VALUE_HEAD = r"(?P<head>^|['\"=]|\bBearer\s+|(?<![\w-])--[A-Za-z][\w-]*\s+)"

# Copy-on-write: remember_secret() replaces the set under the lock, redact() reads one
# reference and never sees a set change while it iterates (the fleet adds its tenants'
# passwords from several threads while others log).
_lock = threading.Lock()
_secrets: frozenset[str] = frozenset()


class _Patterns(NamedTuple):
    """The secrets of one set, compiled by how each is masked (None: no such secret)."""

    secrets: frozenset[str]
    anywhere: re.Pattern[str] | None  # long and not a word: wherever it occurs
    alone: re.Pattern[str] | None  # short, not a word: not inside a longer word
    as_value: re.Pattern[str] | None  # reads as a word (letters only, digits only): values


_compiled: _Patterns | None = None


def remember_secret(value: str | None) -> None:
    """Register a secret (a password, a token) that must never be printed."""
    global _secrets
    if not value:
        return
    with _lock:
        _secrets = _secrets | {s for s in (value, unquote(value)) if s}


def password_of(dsn: str) -> str | None:
    """The password inside a URL or key=value DSN, if any (no validation)."""
    m = _URL_PASSWORD.search(dsn)
    if m and m.group("pw"):
        return m.group("pw")
    m = _KV_PASSWORD.search(dsn)
    if m:
        return m.group("pw").strip("'")
    return None


def _reads_as_a_word(secret: str) -> bool:
    """Letters only or digits only: a word or a number of a message may equal it."""
    return secret.isalpha() or secret.isdigit()


def _alternation(secrets: list[str]) -> str:
    # longest first: the alternation takes the first alternative that matches
    return "|".join(re.escape(s) for s in sorted(secrets, key=len, reverse=True))


def _compile(secrets: frozenset[str]) -> _Patterns:
    words = [s for s in secrets if _reads_as_a_word(s)]
    long_ = [s for s in secrets if not _reads_as_a_word(s) and len(s) >= WHOLE_WORD_BELOW]
    short = [s for s in secrets if not _reads_as_a_word(s) and len(s) < WHOLE_WORD_BELOW]
    return _Patterns(
        secrets,
        re.compile(_alternation(long_)) if long_ else None,
        re.compile(rf"(?<![A-Za-z0-9])(?:{_alternation(short)})(?![A-Za-z0-9])")
        if short else None,
        re.compile(rf"{_VALUE_HEAD}(?:{_alternation(words)})(?![\w])", re.M)
        if words else None,
    )


def _patterns() -> _Patterns:
    global _compiled
    secrets, compiled = _secrets, _compiled
    if compiled is None or compiled.secrets is not secrets:
        compiled = _compiled = _compile(secrets)  # a race compiles the same set twice
    return compiled


def redact(text: str) -> str:
    """Return ``text`` with DSN passwords and registered secrets replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + "***" + m.group("tail"), text)
    text = _KV_PASSWORD.sub(lambda m: m.group("head") + "***", text)
    p = _patterns()
    if p.anywhere is not None:
        text = p.anywhere.sub("***", text)
    if p.alone is not None:
        text = p.alone.sub("***", text)
    if p.as_value is not None:
        text = p.as_value.sub(lambda m: m.group("head") + "***", text)
    return text
