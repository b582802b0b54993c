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
