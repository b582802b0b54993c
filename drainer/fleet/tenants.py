"""The tenants of a fleet: a tenants file or a query on the control database, and shards.

A tenants file has one tenant a line, ``NAME URL``: the name, then (after white space) the
rest of the line is the tenant's connection string (a URL or key=value words). ``#`` starts
a comment at the beginning of a line or after white space. ``${VAR}`` in a URL is the
environment variable's value, ``${file:PATH}`` a file's contents (a mounted Secret), so
passwords stay out of the file; both go in as they are (percent-encode what a URL needs).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drainer._redact import password_of, remember_secret
from drainer.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    import psycopg

    from drainer.settings import Settings

#: A tenant name: letters, digits, '.', '_' and '-', starting with a letter or a digit, at
#: most 63 characters (the control table's CHECK says the same).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
NAME_RULE = ("letters, digits, '.', '_' and '-', starting with a letter or a digit, at most "
             "63 characters")
_REFERENCE = re.compile(r"\$\{(?P<ref>[^}]*)\}")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_COMMENT = re.compile(r"(^|\s)#.*$")
#: ``schema.table`` or ``table``: --tenants-query names a table rather than giving a query.
_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)?")
#: What Kubernetes sets in each pod of an Indexed Job.
COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"


@dataclass(frozen=True)
class Tenant:
    """One tenant database: its name and its own connection string (never printed)."""

    name: str
    url: str

    def __repr__(self) -> str:  # the URL may hold a password
        return f"Tenant({self.name!r})"


def check_name(name: str, where: str = "") -> str:
    """``name`` when it is a valid tenant name, else ConfigError naming ``where``."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        shown = repr(name)[:80]
        raise ConfigError(f"{where}invalid tenant name {shown}: use {NAME_RULE}")
    return name


def expand(url: str, where: str = "", environ: dict[str, str] | None = None) -> str:
    """``${VAR}`` and ``${file:PATH}`` in ``url`` replaced by their values; the password of
    the result is remembered as a secret (never printed). ConfigError names what is
    missing, never a value."""
    env = os.environ if environ is None else environ

    def value(m: re.Match[str]) -> str:
        ref = m.group("ref")
        if ref.startswith("file:"):
            path = Path(ref[5:])
            try:
                return path.read_text("utf-8").rstrip("\r\n")
            except OSError as exc:
                raise ConfigError(f"{where}cannot read ${{file:{path}}}: "
                                  f"{exc.strerror or type(exc).__name__}") from None
        if not _VARIABLE.fullmatch(ref):
            raise ConfigError(f"{where}${{{ref[:40]}}} is not a variable name (${{NAME}} or "
                              "${file:PATH})")
        found = env.get(ref)
        if found is None:
            raise ConfigError(f"{where}${{{ref}}} is not set in the environment")
        return found

    out = _REFERENCE.sub(value, url)
    from drainer.settings import plain_url

    out = plain_url(out)
    remember_secret(password_of(out))
    return out


def parse_tenants(text: str, source: str = "tenants file",
                  environ: dict[str, str] | None = None) -> list[Tenant]:
    """The tenants of a tenants file's ``text``; ConfigError (one line: the file, the line
    number, what is wrong) for a bad name, a missing URL, a duplicate or an unset variable."""
    tenants: list[Tenant] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _COMMENT.sub("", raw).strip()
        if not line:
            continue
        where = f"{source} line {number}: "
        name, *rest = line.split(None, 1)
        url = rest[0].strip() if rest else ""
        check_name(name, where)
        if not url:
            raise ConfigError(f"{where}tenant {name!r} has no URL (one tenant a line: NAME URL)")
        if name in seen:
            raise ConfigError(f"{where}tenant {name!r} is listed twice (first on line "
                              f"{seen[name]})")
        seen[name] = number
        tenants.append(Tenant(name, expand(url, f"{where}tenant {name!r}: ", environ)))
    return tenants


def read_tenants_file(path: str | Path) -> list[Tenant]:
    """The tenants of a tenants file (ConfigError when it cannot be read)."""
    try:
        text = Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise ConfigError(f"cannot read the tenants file {path}: {reason}") from None
    return parse_tenants(text, f"tenants file {path}")


def tenants_query(spec: str) -> tuple[str, Any]:
    """What --tenants-query runs: (a description, the statement). A ``schema.table`` or
    ``table`` name reads that table's name and url columns; anything else is a query run as
    it is, which must return columns named name and url."""
    from psycopg import sql

    spec = spec.strip().rstrip(";").strip()
    if _TABLE_NAME.fullmatch(spec):
        parts = spec.split(".")
        return f"table {spec}", sql.SQL("SELECT name, url FROM {} ORDER BY name").format(
            sql.Identifier(*parts))
    return "query", sql.SQL(spec)  # the operator's own SQL, as a psql user's


def read_tenants_query(conn: psycopg.Connection[Any], spec: str) -> list[Tenant]:
    """The tenants a --tenants-query returns on the control connection."""
    import psycopg as pg
    from psycopg.rows import dict_row

    what, statement = tenants_query(spec)
    try:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(statement)
            rows = cur.fetchall()
    except pg.Error as exc:
        from drainer._redact import redact

        raise ConfigError(f"--tenants-query ({what}) failed: "
                          f"{redact(' '.join(str(exc).split()))}") from None
    tenants: list[Tenant] = []
    seen: set[str] = set()
    for number, row in enumerate(rows, start=1):
        if "name" not in row or "url" not in row:
            raise ConfigError(f"--tenants-query ({what}) must return columns named name and "
                              f"url (it returned {', '.join(map(str, row)) or 'none'})")
        where = f"--tenants-query row {number}: "
        name = check_name(row["name"], where)
        if not isinstance(row["url"], str) or not row["url"].strip():
            raise ConfigError(f"{where}tenant {name!r} has no URL")
        if name in seen:
            raise ConfigError(f"{where}tenant {name!r} is returned twice")
        seen.add(name)
        tenants.append(Tenant(name, expand(row["url"].strip(), f"{where}tenant {name!r}: ")))
    return tenants


# -- shards ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count``: the tenants whose name hashes to it."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, name: str) -> bool:
        return shard_of(name, self.count) == self.index


def shard_of(name: str, count: int) -> int:
    """The shard of a tenant among ``count``: the first 8 bytes of the SHA-256 of its name,
    modulo ``count``. It depends on the name and the count only, so a shard keeps its
    tenants when others are added or removed (changing the count moves them)."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count


def parse_shard(text: str, flag: str = "--shard") -> Shard:
    """``INDEX/COUNT`` (0 <= INDEX < COUNT) as a Shard; ConfigError otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m:
        raise ConfigError(f"{flag}: not INDEX/COUNT: {text[:40]!r} (e.g. 0/4)")
    index, count = int(m.group(1)), int(m.group(2))
    if count < 1 or index >= count:
        raise ConfigError(f"{flag}: the index must be from 0 to COUNT-1 and COUNT at least "
                          f"1: {text.strip()!r}")
    return Shard(index, count)


def shard_from(shard: str | None, count: int | None,
               environ: dict[str, str] | None = None) -> Shard | None:
    """The shard of this process: ``--shard INDEX/COUNT``, else ``$JOB_COMPLETION_INDEX``
    (a pod of a Kubernetes Indexed Job) of ``--shard-count``; None: every tenant."""
    env = os.environ if environ is None else environ
    if shard is not None:
        return parse_shard(shard)
    index = env.get(COMPLETION_INDEX_ENV)
    if count is None:
        if index is not None and index.strip():
            raise ConfigError(f"{COMPLETION_INDEX_ENV} is set (a pod of an Indexed Job) but "
                              "--shard-count / DRAINER_FLEET_SHARD_COUNT is not: set it to "
                              "the Job's completions (or --shard 0/1 for every tenant)")
        return None
    if index is None or not index.strip():
        raise ConfigError(f"--shard-count / DRAINER_FLEET_SHARD_COUNT is set but "
                          f"{COMPLETION_INDEX_ENV} is not: give --shard INDEX/COUNT")
    return parse_shard(f"{index}/{count}", f"{COMPLETION_INDEX_ENV} of --shard-count")


def select(tenants: Iterable[Tenant], shard: Shard | None) -> list[Tenant]:
    """The tenants of ``shard`` (all of them without one), in their order."""
    return [t for t in tenants if shard is None or shard.holds(t.name)]


def names(tenants: Sequence[Tenant]) -> list[str]:
    return [t.name for t in tenants]


def load_tenants(settings: Settings, conn: psycopg.Connection[Any] | None = None
                 ) -> tuple[list[Tenant], Shard | None]:
    """The tenants of this process: --tenants FILE and --tenants-query (on the control
    connection ``conn``), then this process's shard of them (see :func:`shard_from`)."""
    found: list[Tenant] = []
    if settings.fleet_tenants:
        found += read_tenants_file(settings.fleet_tenants)
    if settings.fleet_tenants_query:
        if conn is None:
            raise ConfigError("--tenants-query needs the control database (--fleet-url)")
        seen = {t.name for t in found}
        for t in read_tenants_query(conn, settings.fleet_tenants_query):
            if t.name in seen:
                raise ConfigError(f"tenant {t.name!r} is in both the tenants file and "
                                  "--tenants-query")
            found.append(t)
    if not settings.fleet_tenants and not settings.fleet_tenants_query:
        raise ConfigError("no tenants: pass --tenants FILE (DRAINER_FLEET_TENANTS) or "
                          "--tenants-query (DRAINER_FLEET_TENANTS_QUERY)")
    shard = shard_from(settings.fleet_shard, settings.fleet_shard_count)
    return select(found, shard), shard


def listed_names(settings: Settings, conn: psycopg.Connection[Any]) -> list[str] | None:
    """This process's tenant names (its file or query, its shard) when a tenant list is
    configured, else None (every tenant of the control table)."""
    if not settings.fleet_tenants and not settings.fleet_tenants_query:
        return None
    return names(load_tenants(settings, conn)[0])
