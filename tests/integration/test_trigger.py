"""The producer-side trigger: one POST after a commit, none on rollback, never raises."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer import trigger
from drainer.producer import JobSpec
from drainer.settings import Settings
from tests.conftest import make_settings


class _Counter:
    def __init__(self) -> None:
        self.posts: list[dict[str, str]] = []
        self.status = 202
        self.lock = threading.Lock()


@pytest.fixture
def counter() -> Iterator[tuple[_Counter, str]]:
    """A local HTTP server on 127.0.0.1 that counts the POSTs it receives."""
    state = _Counter()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            with state.lock:
                state.posts.append({"path": self.path,
                                    "auth": self.headers.get("Authorization", "")})
            self.send_response(state.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}/drain"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def producer(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A producer's connection as apps open them: not autocommit."""
    with psycopg.connect(pg_url) as c:
        yield c


def _settings(migrated: Settings, url: str, **kw: Any) -> Settings:
    return make_settings(migrated.database_url.get_secret_value(),  # type: ignore[union-attr]
                         migrated.schema_name, trigger_url=url, trigger_token="s3cret", **kw)


def _count_jobs(conn: psycopg.Connection[Any], schema: str) -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
        sql.Identifier(schema, "jobs"))).fetchone()
    assert row is not None
    return int(row[0])


def test_commit_fires_once_for_many_enqueues(migrated: Settings, conn: psycopg.Connection[Any],
                                             producer: psycopg.Connection[Any],
                                             counter: tuple[_Counter, str]) -> None:
    state, url = counter
    settings = _settings(migrated, url)
    with trigger.transaction(producer, settings) as tx:
        for i in range(5):
            tx.enqueue("emails", {"n": i})
        tx.enqueue_many([JobSpec("emails", {"bulk": i}) for i in range(10)])
        assert tx.enqueue_many([{"bulk": i} for i in range(3)], queue="emails") == 3
        assert state.posts == []  # nothing before the commit
        assert _count_jobs(conn, migrated.schema_name) == 0  # not visible yet
    assert tx.fired is True
    assert len(state.posts) == 1
    assert state.posts[0] == {"path": "/drain", "auth": "Bearer s3cret"}
    assert _count_jobs(conn, migrated.schema_name) == 18


def test_rollback_fires_nothing(migrated: Settings, conn: psycopg.Connection[Any],
                                producer: psycopg.Connection[Any],
                                counter: tuple[_Counter, str]) -> None:
    state, url = counter
    settings = _settings(migrated, url)
    with pytest.raises(RuntimeError), trigger.transaction(producer, settings) as tx:
        tx.enqueue("emails", {"n": 1})
        raise RuntimeError("the order could not be saved")
    with trigger.transaction(producer, settings) as tx2:
        tx2.enqueue("emails", {"n": 2})
        raise psycopg.Rollback()  # psycopg's quiet rollback: swallowed, still no trigger
    assert tx2.fired is False
    assert state.posts == []
    assert _count_jobs(conn, migrated.schema_name) == 0


def test_failed_commit_fires_nothing(migrated: Settings, conn: psycopg.Connection[Any],
                                     producer: psycopg.Connection[Any],
                                     counter: tuple[_Counter, str]) -> None:
    state, url = counter
    settings = _settings(migrated, url)
    side = sql.Identifier(migrated.schema_name, "side")
    conn.execute(sql.SQL("CREATE TABLE {} (k int UNIQUE DEFERRABLE INITIALLY DEFERRED)")
                 .format(side))
    with pytest.raises(psycopg.errors.UniqueViolation), \
            trigger.transaction(producer, settings) as tx:
        producer.execute(sql.SQL("INSERT INTO {} VALUES (1), (1)").format(side))
        tx.enqueue("emails", {"n": 1})  # the duplicate is only caught at COMMIT
    assert state.posts == []
    assert _count_jobs(conn, migrated.schema_name) == 0


def test_nothing_enqueued_fires_nothing(migrated: Settings, producer: psycopg.Connection[Any],
                                        counter: tuple[_Counter, str]) -> None:
    state, url = counter
    with trigger.transaction(producer, _settings(migrated, url)) as tx:
        producer.execute("SELECT 1")
    assert tx.fired is False
    assert state.posts == []


def test_plain_sql_insert_marked_fires_once(migrated: Settings, conn: psycopg.Connection[Any],
                                           producer: psycopg.Connection[Any],
                                           counter: tuple[_Counter, str]) -> None:
    state, url = counter
    with trigger.transaction(producer, _settings(migrated, url)) as tx:
        producer.execute(sql.SQL("INSERT INTO {} (queue, payload) VALUES ('a', '{{}}'), "
                                 "('a', '{{}}')").format(sql.Identifier(migrated.schema_name,
                                                                        "jobs")))
        tx.mark(2)
    assert len(state.posts) == 1
    assert trigger.enqueue_and_trigger(producer, _settings(migrated, url), "a", {"x": 1})
    assert len(state.posts) == 2
    assert _count_jobs(conn, migrated.schema_name) == 3


def _capture(logger_name: str) -> tuple[logging.Handler, list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []

    class H(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = H(logging.WARNING)
    logging.getLogger(logger_name).addHandler(handler)
    return handler, records


def test_failed_trigger_is_logged_and_keeps_the_job(migrated: Settings,
                                                   conn: psycopg.Connection[Any],
                                                   producer: psycopg.Connection[Any],
                                                   counter: tuple[_Counter, str]) -> None:
    state, url = counter
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{s.getsockname()[1]}/drain"
    handler, records = _capture("drainer.trigger")
    try:
        with trigger.transaction(producer, _settings(migrated, dead_url)) as tx:
            tx.enqueue("emails", {"n": 1})
        assert tx.fired is False  # no exception reached the producer
        state.status = 500
        with trigger.transaction(producer, _settings(migrated, url)) as tx:
            tx.enqueue("emails", {"n": 2})
        assert tx.fired is False
    finally:
        logging.getLogger("drainer.trigger").removeHandler(handler)
    messages = [r.getMessage() for r in records]
    assert any("failed" in m and "the job is queued" in m for m in messages), messages
    assert any("500" in m for m in messages), messages
    assert not any("s3cret" in m for m in messages)
    assert _count_jobs(conn, migrated.schema_name) == 2


def test_open_transaction_is_refused(migrated: Settings, producer: psycopg.Connection[Any],
                                     counter: tuple[_Counter, str]) -> None:
    state, url = counter
    producer.execute("SELECT 1")  # psycopg opened a transaction implicitly
    with pytest.raises(ValueError, match="no transaction open"), \
            trigger.transaction(producer, _settings(migrated, url)):
        pass
    producer.rollback()
    assert state.posts == []


def test_autocommit_connection_works_too(migrated: Settings, conn: psycopg.Connection[Any],
                                         counter: tuple[_Counter, str]) -> None:
    state, url = counter
    assert conn.autocommit
    with trigger.transaction(conn, _settings(migrated, url)) as tx:
        tx.enqueue("emails", {"n": 1})
        tx.enqueue("emails", {"n": 2})
    assert tx.fired is True and len(state.posts) == 1
    with pytest.raises(KeyError), trigger.transaction(conn, _settings(migrated, url)) as tx:
        tx.enqueue("emails", {"n": 3})
        raise KeyError("rolled back")
    assert len(state.posts) == 1
    assert _count_jobs(conn, migrated.schema_name) == 2
