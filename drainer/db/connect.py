"""Opening drainer's connections (session settings, keepalives, retries while a compute
resumes) and telling what a database error means (a timeout, a prepared-statement clash,
the server out of a resource, read-only or shutting down)."""

from __future__ import annotations

import functools
import logging
import re
import time
from typing import TYPE_CHECKING, Any

import psycopg

from drainer._redact import redact
from drainer.db.loaders import register_safe_loaders
from drainer.errors import (
    ConfigError,
    DatabaseReadOnly,
    DatabaseUnavailable,
    DrainerError,
    ServerOutOfResources,
    ServerShutdown,
)

if TYPE_CHECKING:
    from drainer.settings import Settings

logger = logging.getLogger("drainer.db")

# A connection string libpq cannot use: a configuration error (exit 2), never retried.
_MALFORMED = re.compile(r"invalid [\w ]*value|invalid port number|invalid connection option",
                        re.I)

# Errors that retrying will not fix: wrong password, unknown database or role, bad DSN.
_PERMANENT = (
    "password authentication failed",
    "does not exist",
    "no password supplied",
    "invalid connection option",
    "invalid dsn",
    "missing \"=\"",
    "invalid integer value",
    "invalid sslmode",
    "authentication failed",
    "permission denied",
)


#: TCP keepalive probes before a peer counts as dead (see keepalive_options).
KEEPALIVE_COUNT = 3


def keepalive_options(dead_peer_timeout: float) -> dict[str, Any]:
    """libpq's keepalives, keepalives_idle/_interval/_count and tcp_user_timeout for a dead
    peer noticed within about ``dead_peer_timeout`` seconds (0: the OS defaults, ~2 h)."""
    if dead_peer_timeout <= 0:
        return {}
    idle = max(1, round(dead_peer_timeout * 0.4))
    interval = max(1, round((dead_peer_timeout - idle) / KEEPALIVE_COUNT))
    return {"keepalives": 1, "keepalives_idle": idle, "keepalives_interval": interval,
            "keepalives_count": KEEPALIVE_COUNT,
            "tcp_user_timeout": int(dead_peer_timeout * 1000)}


@functools.cache
def warm_dumpers() -> None:
    """Once a process, before its first connection: dump the kinds of parameters drainer's
    statements send (lists of names and of numbers with NULLs, numbers, text). psycopg
    builds each kind's dumper the first time (a list's quoting regex: about 0.5 ms), and
    the first time was the run's first statement, inside the open (billed) session."""
    tx = psycopg.adapt.Transformer()
    for value in (["queue"], [None], [None, 1], 1, 1.5, "text", True):
        tx.get_dumper(value, psycopg.adapt.PyFormat.AUTO).dump(value)


def connect(settings: Settings, *, purpose: str = "work") -> psycopg.Connection[Any]:
    """Open one autocommit connection with drainer's session settings.

    Retries with exponential backoff (0.5 s, 1 s, 2 s, ...) while the server cannot be
    reached: the first connection after a suspend may take seconds while the compute
    resumes. Raises DatabaseUnavailable (exit 3) when every attempt failed.
    """
    kwargs: dict[str, Any] = {
        "autocommit": True,
        "connect_timeout": max(1, round(settings.connect_timeout)),
        "application_name": settings.application_name if purpose == "work" else
        f"{settings.application_name}-{purpose}",
        **keepalive_options(settings.dead_peer_timeout),
    }
    if settings.session_options:
        opts = []
        for name, value in (
            ("statement_timeout", settings.statement_timeout),
            ("lock_timeout", settings.lock_timeout),
            ("idle_in_transaction_session_timeout", settings.idle_in_transaction_timeout),
        ):
            opts.append(f"-c {name}={int(value * 1000)}")
        kwargs["options"] = " ".join(opts)
    dsn = settings.dsn
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)  # syntax only: no network
    except psycopg.Error as exc:
        # libpq quotes the word it choked on, which may be anything (even a password)
        message = re.sub(r'(missing "=" after) "[^"]*"', r"\1 a word", one_line(exc))
        raise ConfigError(f"invalid database URL: {message}") from None
    warm_dumpers()
    attempts = settings.connect_retries + 1
    delay = 0.5
    last: Exception | None = None
    for attempt in range(1, attempts + 1):
        started = time.monotonic()
        try:
            conn = psycopg.connect(dsn, **kwargs)
        except psycopg.Error as exc:
            last = exc
            message = one_line(exc)
            if _MALFORMED.search(message):
                raise ConfigError(f"invalid database URL: {message}") from None
            if settings.session_options and "unsupported startup parameter" in message.lower():
                # a pooler (PgBouncer < 1.20: any 'options'; >= 1.20: a setting it does
                # not track) refuses the timeouts drainer sends: retrying will not help
                raise ConfigError(
                    f"cannot connect: {message}; the server or pooler rejects the 'options' "
                    "startup parameter: set DRAINER_SESSION_OPTIONS=false "
                    "(--no-session-options) and set the timeouts on the role instead "
                    "(ALTER ROLE ... SET statement_timeout = '60s', lock_timeout, "
                    "idle_in_transaction_session_timeout)"
                ) from None
            if any(p in message.lower() for p in _PERMANENT):
                raise DatabaseUnavailable(f"cannot connect: {message}") from None
            if attempt < attempts:
                logger.warning(
                    "connect attempt %d/%d failed after %.1fs: %s; retrying in %.1fs",
                    attempt, attempts, time.monotonic() - started, message, delay,
                )
                time.sleep(delay)
                delay = min(delay * 2, 30.0)
            continue
        if not settings.prepared_statements:
            conn.prepare_threshold = None
        # a row the client cannot represent must not fail a whole claim or an ops command
        register_safe_loaders(conn.adapters)
        return conn
    assert last is not None
    condition = server_condition(last)
    if condition is not None:  # the server answered: full, or starting or stopping
        raise type(condition)(f"{condition} (after {attempts} attempts)") from None
    raise DatabaseUnavailable(
        f"database unreachable after {attempts} attempts: {one_line(last)}"
    )


def timeout_kind(exc: BaseException) -> str | None:
    """What ended a statement when it was a timeout or a cancel, not a lost connection:
    'statement timeout', 'lock timeout', 'idle-in-transaction timeout', 'cancelled'."""
    errors = psycopg.errors
    if isinstance(exc, errors.LockNotAvailable):
        return "lock timeout"
    if isinstance(exc, errors.IdleInTransactionSessionTimeout) or \
            "idle-in-transaction timeout" in str(exc):
        return "idle-in-transaction timeout"
    if isinstance(exc, errors.QueryCanceled):
        return "statement timeout" if "statement timeout" in str(exc) else "cancelled"
    return None


#: What the server's answer says, by SQLSTATE (a class's code "53000" stands for the
#: class): the error to raise, what happened, what to do.
_CONDITIONS: dict[str, tuple[type[DrainerError], str, str]] = {
    "53100": (ServerOutOfResources, "the database server's disk is full",
              "free disk space on the server (or raise its storage), then run again"),
    "53200": (ServerOutOfResources, "the database server is out of memory",
              "lower work_mem, --batch-size or --concurrency, or give the server more memory"),
    "53300": (ServerOutOfResources, "the database server has no connection slot free",
              "fewer clients, a pooler, or a higher max_connections (or the role's "
              "CONNECTION LIMIT)"),
    "53000": (ServerOutOfResources, "the database server is out of a resource",
              "see the server's log"),
    "25006": (DatabaseReadOnly, "the database is read-only",
              "a hot standby, a read replica or default_transaction_read_only: point the "
              "database URL at the primary"),
    "57P01": (ServerShutdown, "the database server ended the session (admin shutdown)",
              "a shutdown, a restart or pg_terminate_backend: run again once it is up"),
    "57P02": (ServerShutdown, "the database server ended the session (crash shutdown)",
              "another server process crashed and the server restarts: run again"),
    "57P03": (ServerShutdown, "the database server accepts no connection now",
              "it is starting up, shutting down or in recovery: run again later"),
}
# At connect time libpq's error has no SQLSTATE, only the server's (English) message.
_CONNECT_MESSAGES = (
    (re.compile(r"too many (connections|clients)|connection slots are reserved", re.I),
     "53300"),
    (re.compile(r"the database system (is (starting up|shutting down|in recovery mode|not "
                r"(yet )?accepting connections))", re.I), "57P03"),
)


def server_condition(exc: BaseException) -> DrainerError | None:
    """The server's answer when it is out of disk, memory or connection slots (class 53),
    read-only (25006), or ended or refused the session (57P01-57P03): the DrainerError to
    report (one line, its own exit code), not a lost connection. None for anything else."""
    if not isinstance(exc, psycopg.Error):
        return None
    state = exc.sqlstate
    if state is None and isinstance(exc, psycopg.OperationalError):
        state = next((code for pattern, code in _CONNECT_MESSAGES
                      if pattern.search(str(exc))), None)
    if state is None:
        return None
    found = _CONDITIONS.get(state) or (_CONDITIONS["53000"] if state.startswith("53")
                                       else None)
    if found is None:
        return None
    kind, what, hint = found
    return kind(f"{what} (SQLSTATE {state}): {one_line(exc)}; {hint}")


def prepared_statement_clash(exc: BaseException) -> ConfigError | None:
    """A prepared statement that another client's session already holds, or that the
    session a statement landed on does not hold: what server-side prepared statements do
    through a transaction-mode pooler that does not track them (PgBouncer < 1.21, or
    max_prepared_statements = 0), where consecutive transactions of one client share
    server sessions with other clients. A configuration error, not a lost connection:
    the one line says what to set. None for any other error."""
    errors = psycopg.errors
    if not isinstance(exc, errors.DuplicatePreparedStatement | errors.InvalidSqlStatementName):
        return None
    return ConfigError(
        f"{type(exc).__name__}: {one_line(exc)}: server-side prepared statements clash "
        "through a transaction-mode pooler that does not track them (PgBouncer < 1.21, or "
        "max_prepared_statements = 0): set DRAINER_PREPARED_STATEMENTS=false "
        "(--no-prepared-statements), or max_prepared_statements > 0 on PgBouncer >= 1.21")


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return redact(text)
