"""What kind of error a database error is: a timeout, a prepared-statement clash, one line."""

from __future__ import annotations

import psycopg

from drainer._redact import redact
from drainer.errors import ConfigError


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

