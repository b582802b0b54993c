"""What the heartbeat thread logs when a beat fails: a pooler's prepared-statement clash
gets the one line that names DRAINER_PREPARED_STATEMENTS, any other error its own line."""

from __future__ import annotations

import logging
import threading

import psycopg
import pytest

from drainer.drain.leases import Heartbeat
from drainer.settings import Settings


def _one_failed_tick(exc: Exception, caplog: pytest.LogCaptureFixture) -> str:
    hb = Heartbeat(Settings(), "run-1", 0.01, lambda: [], threading.Lock())

    def beat() -> set[int]:
        hb.stopped.set()  # one tick
        raise exc

    hb.beat = beat  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="drainer.drain"):
        hb.run()
    return "\n".join(r.getMessage() for r in caplog.records)


def test_a_prepared_statement_clash_names_the_setting(caplog: pytest.LogCaptureFixture) -> None:
    text = _one_failed_tick(psycopg.errors.DuplicatePreparedStatement(
        'prepared statement "_pg3_0" already exists'), caplog)
    assert "heartbeat failed: DuplicatePreparedStatement" in text
    assert "DRAINER_PREPARED_STATEMENTS=false" in text


def test_another_error_keeps_its_own_line(caplog: pytest.LogCaptureFixture) -> None:
    text = _one_failed_tick(psycopg.OperationalError("server closed the connection"), caplog)
    assert "heartbeat failed: server closed the connection" in text
    assert "DRAINER_PREPARED_STATEMENTS" not in text
