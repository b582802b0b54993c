"""Producers on psycopg.AsyncConnection: the same statements and guarantees as the sync ones."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from drainer import trigger
from drainer.job import DEFAULT_MAX_ATTEMPTS
from drainer.producer import (
    EnqueueResult,
    JobSpec,
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
)
from drainer.registry import Registry
from drainer.settings import Settings
from tests.contrib._server import Counter
from tests.contrib.conftest import count_jobs, payloads


def test_await_enqueue_on_an_async_connection_commits_one_job(pg_url: str,
                                                              migrated: Settings) -> None:
    """It failed with "'coroutine' object has no attribute 'fetchone'" before."""
    schema = migrated.schema_name

    async def main() -> int | None:
        async with await psycopg.AsyncConnection.connect(pg_url) as aconn:
            job_id = await enqueue(aconn, "emails", {"n": 1}, schema=schema)
            assert count_jobs(pg_url, schema) == 0  # not committed yet: the caller's tx
        return job_id

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "coroutine was never awaited"
        job_id = asyncio.run(main())
    assert isinstance(job_id, int)
    assert count_jobs(pg_url, schema) == 1


def test_rollback_leaves_no_job(pg_url: str, migrated: Settings) -> None:
    schema = migrated.schema_name

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(pg_url) as aconn:
            await enqueue_async(aconn, "emails", {"n": 1}, schema=schema)
            await enqueue_many_async(aconn, [JobSpec("emails", {"n": 2})], schema=schema)
            await aconn.rollback()

    asyncio.run(main())
    assert count_jobs(pg_url, schema) == 0


def test_enqueue_many_async_takes_every_path_as_the_sync_one(pg_url: str,
                                                             migrated: Settings) -> None:
    schema = migrated.schema_name
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    batches = [
        [JobSpec("a", {"i": i}) for i in range(300)],                     # COPY text, now
        [JobSpec("b", {"i": i}, run_at=later if i % 2 else None) for i in range(10)],  # COPY
        [JobSpec("c", {"k": i % 3}, dedup_key=f"k{i % 3}") for i in range(9)],  # staged
        [{"queue": "d", "payload": {"x": "tab\there \\ back"}, "priority": 3}],
    ]

    async def run_async() -> list[EnqueueResult]:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as aconn:
            return [await enqueue_many(aconn, b, schema=schema) for b in batches]

    got = asyncio.run(run_async())
    assert got == [EnqueueResult(300, 0), EnqueueResult(10, 0), EnqueueResult(3, 6),
                   EnqueueResult(1, 0)]
    async_payloads = payloads(pg_url, schema)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {schema}.jobs")
        assert [enqueue_many(conn, b, schema=schema) for b in batches] == got
    assert payloads(pg_url, schema) == async_payloads


def test_trigger_fires_only_after_commit(migrated: Settings, trig: Settings,
                                         counter: Counter, pg_url: str) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(pg_url) as aconn:
            async with trigger.transaction_async(aconn, trig) as tx:
                await tx.enqueue("emails", {"n": 1})
                await tx.enqueue_many([JobSpec("emails", {"n": 2})])
                assert counter.posts == 0  # not before the commit
            assert tx.fired is True
            with pytest.raises(RuntimeError):
                async with trigger.transaction_async(aconn, trig) as tx2:
                    await tx2.enqueue("emails", {"n": 3})
                    raise RuntimeError("the request failed")
            assert tx2.fired is None
            async with trigger.transaction_async(aconn, trig) as tx3:
                await tx3.enqueue("emails", {"n": 4})
                raise psycopg.Rollback()
            assert tx3.fired is False
            assert await trigger.enqueue_and_trigger_async(aconn, trig, "emails", {"n": 5})

    asyncio.run(main())
    assert counter.posts == 2
    assert count_jobs(pg_url, migrated.schema_name) == 3


def test_a_failed_trigger_loses_no_job_and_raises_nothing(migrated: Settings, pg_url: str,
                                                          caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    # A port nothing listens on: the POST fails fast, the job is committed anyway.
    dead = migrated.model_copy(update={"trigger_url": "http://127.0.0.1:9/drain"})

    async def main() -> bool | None:
        async with await psycopg.AsyncConnection.connect(pg_url) as aconn:
            async with trigger.transaction_async(aconn, dead, timeout=0.5) as tx:
                await tx.enqueue("emails", {"n": 1})
            return tx.fired

    assert asyncio.run(main()) is False
    assert count_jobs(pg_url, migrated.schema_name) == 1
    assert "drain trigger" in caplog.text


def test_sync_transaction_refuses_an_async_connection(migrated: Settings, pg_url: str) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(pg_url) as aconn:
            with pytest.raises(TypeError, match="transaction_async"), \
                    trigger.transaction(aconn, migrated):  # type: ignore[arg-type]
                pass

    asyncio.run(main())


def test_many_concurrent_async_producers_write_each_job_once(pg_url: str,
                                                             migrated: Settings) -> None:
    schema = migrated.schema_name

    async def producer(w: int) -> None:
        async with await psycopg.AsyncConnection.connect(pg_url) as aconn:
            for i in range(50):
                await enqueue(aconn, "emails", {"w": w, "i": i}, schema=schema)
                await aconn.commit()

    async def main() -> None:
        await asyncio.gather(*(producer(w) for w in range(8)))

    asyncio.run(main())
    assert count_jobs(pg_url, schema) == 400


def test_typed_enqueue_is_bound_to_the_tasks_queue(pg_url: str, migrated: Settings) -> None:
    schema = migrated.schema_name
    reg = Registry()

    @reg.task("emails", max_attempts=7)
    def send_email(job: object) -> str:
        return "sent"

    @reg.task("reports")
    async def build_report(job: object) -> str:
        return "built"

    assert send_email(object()) == "sent"  # still the function
    assert reg.tasks["emails"].func is send_email
    assert reg.tasks["reports"].is_async
    assert send_email.queue == "emails"
    with pytest.raises(TypeError, match="the task's own"):
        send_email.enqueue(None, {}, queue="emial")  # type: ignore[arg-type]

    with psycopg.connect(pg_url) as conn:
        assert send_email.enqueue(conn, {"to": "a"}, schema=schema)
        got = send_email.enqueue_many(conn, [{"to": "b"}, {"to": "c"}], priority=1,
                                      schema=schema)
        assert got.enqueued == 2

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(pg_url) as aconn:
            await build_report.enqueue_async(aconn, {"r": 1}, schema=schema)
            await build_report.enqueue(aconn, {"r": 2}, schema=schema, max_attempts=2)
            await build_report.enqueue_many(aconn, [{"r": 3}], schema=schema)
            await aconn.commit()
            async with trigger.transaction_async(aconn, migrated) as tx:
                await tx.enqueue(build_report, {"r": 4})  # the handler stands for its queue

    with psycopg.connect(pg_url) as conn, trigger.transaction(conn, migrated) as stx:
        stx.enqueue(send_email, {"to": "d"})

    asyncio.run(main())
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(f"SELECT queue, max_attempts, priority FROM {schema}.jobs "
                            "ORDER BY id").fetchall()
    d = DEFAULT_MAX_ATTEMPTS  # the task sets none: the producer's default
    assert rows == [("emails", 7, 0), ("emails", 7, 1), ("emails", 7, 1), ("emails", d, 0),
                    ("reports", d, 0), ("reports", 2, 0), ("reports", d, 0), ("reports", d, 0)]


def test_a_garbled_answer_is_a_failed_trigger_not_an_exception(migrated: Settings) -> None:
    """A server that answers something that is not HTTP (http.client.BadStatusLine)."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def answer() -> None:
        c, _ = srv.accept()
        c.recv(65536)
        c.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        c.close()

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    url = f"http://127.0.0.1:{srv.getsockname()[1]}/drain"
    try:
        assert trigger.fire(migrated.model_copy(update={"trigger_url": url}), 2.0) is False
    finally:
        t.join(5)
        srv.close()


def test_enqueue_many_async_streams_a_generator_as_the_sync_one(pg_url: str,
                                                                migrated: Settings) -> None:
    schema = migrated.schema_name
    later = datetime.now(timezone.utc) + timedelta(hours=1)

    def jobs(bad: bool = False) -> Iterator[JobSpec]:
        yield from (JobSpec("a", {"i": i}) for i in range(600))
        yield JobSpec("b", 1, run_at=later)
        yield JobSpec("c", 2, dedup_key="k")
        yield JobSpec("c", 3, dedup_key="k", max_attempts=0 if bad else 1)

    async def run_async() -> EnqueueResult:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as aconn:
            with pytest.raises(ValueError, match="max_attempts"):
                await enqueue_many(aconn, jobs(bad=True), schema=schema)
            assert count_jobs(pg_url, schema) == 0
            return await enqueue_many(aconn, jobs(), schema=schema)

    assert asyncio.run(run_async()) == EnqueueResult(602, 1)
    async_payloads = payloads(pg_url, schema)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {schema}.jobs")
        assert enqueue_many(conn, jobs(), schema=schema) == EnqueueResult(602, 1)
    assert payloads(pg_url, schema) == async_payloads


def test_enqueue_many_of_payloads_async_writes_what_the_sync_one_writes(
        pg_url: str, migrated: Settings) -> None:
    schema = migrated.schema_name
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    batches: list[tuple[list[Any], dict[str, Any]]] = [
        ([{"i": i, "s": "a\\b"} for i in range(300)], {"priority": 2}),  # own COPY text
        ([1, 2], {"run_at": later}), ([3, 4], {"dedup_key": "k"}),      # JobSpec paths
    ]

    async def run_async(autocommit: bool) -> list[EnqueueResult]:
        async with await psycopg.AsyncConnection.connect(pg_url,
                                                         autocommit=autocommit) as aconn:
            with pytest.raises(TypeError, match="not JSON serializable"):
                await enqueue_many(aconn, [*range(600), {1}], queue="a", schema=schema)
            if not autocommit:
                await aconn.rollback()
            assert count_jobs(pg_url, schema) == 0
            got = [await enqueue_many(aconn, b, queue="a", schema=schema, **o)
                   for b, o in batches]
            await aconn.commit()
            return got

    for autocommit in (True, False):
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"TRUNCATE {schema}.jobs")
        got = asyncio.run(run_async(autocommit))
        assert got == [EnqueueResult(300, 0), EnqueueResult(2, 0), EnqueueResult(1, 1)]
        async_payloads = payloads(pg_url, schema)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"TRUNCATE {schema}.jobs")
            assert [enqueue_many(conn, b, queue="a", schema=schema, **o)
                    for b, o in batches] == got
        assert payloads(pg_url, schema) == async_payloads
