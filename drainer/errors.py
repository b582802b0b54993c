"""Errors raised by drainer, each mapped to a documented exit code."""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_SCHEMA = 4
#: A database timeout (statement_timeout, lock_timeout, idle_in_transaction_session_timeout)
#: or a cancel ended a statement: the server is reachable, the statement took too long.
EXIT_TIMEOUT = 5
#: ``--max-runtime`` watchdog: the run did not end within max-runtime + grace + the margin,
#: even after its connections were cut; the process exits without a report.
EXIT_WATCHDOG = 6
#: ``drainer fleet run-once`` / ``fleet migrate``: some tenants failed (down, not migrated,
#: a failing run); the others were served, and the report's line of each says what failed.
EXIT_TENANTS_FAILED = 7
#: The database server ran out of a resource (SQLSTATE class 53: disk full, out of memory,
#: too many connections): it answered, the connection was fine.
EXIT_SERVER_RESOURCES = 8
#: The database accepts no writes (25006 read_only_sql_transaction: a hot standby, a read
#: replica, default_transaction_read_only).
EXIT_READ_ONLY = 9
#: The server ended the session or refused it for now (57P01 admin shutdown, 57P02 crash
#: shutdown, 57P03 cannot connect now: a shutdown, restart, pg_terminate_backend, recovery).
EXIT_SERVER_SHUTDOWN = 10


class DrainerError(Exception):
    """Base class: ``str(error)`` is the one line shown to the user."""

    exit_code = EXIT_ERROR


class ConfigError(DrainerError):
    """A missing or invalid setting, flag or app module (exit 2)."""

    exit_code = EXIT_USAGE


class DatabaseUnavailable(DrainerError):
    """The database could not be reached after the connect retries (exit 3)."""

    exit_code = EXIT_UNAVAILABLE


class SchemaError(DrainerError):
    """The jobs table is missing or its schema is out of date (exit 4)."""

    exit_code = EXIT_SCHEMA


class ServerOutOfResources(DrainerError):
    """The server is out of disk, memory or connection slots (SQLSTATE class 53, exit 8)."""

    exit_code = EXIT_SERVER_RESOURCES


class DatabaseReadOnly(DrainerError):
    """The database refused a write: read-only (25006, exit 9)."""

    exit_code = EXIT_READ_ONLY


class ServerShutdown(DrainerError):
    """The server ended the session or accepts none now (57P01-57P03, exit 10)."""

    exit_code = EXIT_SERVER_SHUTDOWN


class JobRejected(DrainerError, ValueError):
    """A job the table cannot store (a NUL or a lone surrogate in a string, NaN in a
    payload, a number out of range): one line, raised by the producer functions instead
    of psycopg's error (exit 2, as ``drainer enqueue``'s bad values)."""

    exit_code = EXIT_USAGE
