"""What a server error means, by its SQLSTATE (and, at connect time, libpq's message)."""

from __future__ import annotations

import psycopg
import pytest

from drainer.db import server_condition
from drainer.errors import EXIT_READ_ONLY, EXIT_SERVER_RESOURCES, EXIT_SERVER_SHUTDOWN
from drainer.fleet.run import classify

errors = psycopg.errors


@pytest.mark.parametrize(("exc", "code", "words"), [
    (errors.DiskFull("could not extend file"), EXIT_SERVER_RESOURCES, "disk is full"),
    (errors.OutOfMemory("out of memory"), EXIT_SERVER_RESOURCES, "out of memory"),
    (errors.TooManyConnections("sorry"), EXIT_SERVER_RESOURCES, "no connection slot"),
    (errors.ConfigurationLimitExceeded("temp_file_limit"), EXIT_SERVER_RESOURCES,
     "out of a resource"),
    (errors.ReadOnlySqlTransaction("cannot execute UPDATE"), EXIT_READ_ONLY, "read-only"),
    (errors.AdminShutdown("terminating"), EXIT_SERVER_SHUTDOWN, "admin shutdown"),
    (errors.CrashShutdown("terminating"), EXIT_SERVER_SHUTDOWN, "crash shutdown"),
    (errors.CannotConnectNow("starting up"), EXIT_SERVER_SHUTDOWN, "accepts no connection"),
    (psycopg.OperationalError('connection failed: FATAL:  sorry, too many clients already'),
     EXIT_SERVER_RESOURCES, "SQLSTATE 53300"),
    (psycopg.OperationalError("connection failed: FATAL:  the database system is starting "
                              "up"), EXIT_SERVER_SHUTDOWN, "SQLSTATE 57P03"),
])
def test_the_servers_conditions_have_their_own_line_and_code(
        exc: psycopg.Error, code: int, words: str) -> None:
    found = server_condition(exc)
    assert found is not None and found.exit_code == code
    assert words in str(found) and "\n" not in str(found)
    assert classify(exc) == ("unavailable", code)


@pytest.mark.parametrize("exc", [
    psycopg.OperationalError("server closed the connection unexpectedly"),
    errors.QueryCanceled("canceling statement due to user request"),
    errors.UniqueViolation("duplicate key"),
    ValueError("not a database error"),
])
def test_anything_else_is_not_a_server_condition(exc: Exception) -> None:
    assert server_condition(exc) is None
