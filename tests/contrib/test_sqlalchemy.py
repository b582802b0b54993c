"""drainer.contrib.sqlalchemy against the real PostgreSQL and SQLAlchemy 2 (psycopg driver)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

sqlalchemy = pytest.importorskip("sqlalchemy")

from sqlalchemy import Engine, create_engine, text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine  # noqa: E402
from sqlalchemy.orm import Session, sessionmaker  # noqa: E402

from drainer import trigger as drainer_trigger  # noqa: E402
from drainer.contrib import sqlalchemy as dsa  # noqa: E402
from drainer.producer import JobSpec  # noqa: E402
from drainer.settings import Settings  # noqa: E402
from tests.contrib._server import Counter  # noqa: E402
from tests.contrib.conftest import count_jobs  # noqa: E402


def sa_url(pg_url: str) -> str:
    return pg_url.replace("postgresql://", "postgresql+psycopg://", 1)


@pytest.fixture
def engine(pg_url: str, migrated: Settings) -> Iterator[Engine]:
    eng = create_engine(sa_url(pg_url), pool_size=8)
    with eng.begin() as c:
        c.execute(text(f"CREATE TABLE {migrated.schema_name}.orders (id int PRIMARY KEY)"))
    yield eng
    eng.dispose()


def test_session_commit_writes_one_job_with_the_data(engine: Engine, migrated: Settings,
                                                     pg_url: str) -> None:
    schema = migrated.schema_name
    with Session(engine) as session, session.begin():
        session.execute(text(f"INSERT INTO {schema}.orders VALUES (42)"))
        job_id = dsa.enqueue(session, "emails", {"order": 42}, schema=schema)
        assert isinstance(job_id, int)
        # The same transaction (the session sees its job), on the session's connection:
        # one connection checked out, no second pool.
        seen = session.execute(text(f"SELECT count(*) FROM {schema}.jobs")).scalar_one()
        assert seen == 1
        assert engine.pool.checkedout() == 1  # type: ignore[attr-defined]
        assert count_jobs(pg_url, schema) == 0
    assert count_jobs(pg_url, schema) == 1


def test_session_rollback_writes_nothing(engine: Engine, migrated: Settings,
                                         pg_url: str) -> None:
    schema = migrated.schema_name
    with Session(engine) as session:
        session.execute(text(f"INSERT INTO {schema}.orders VALUES (1)"))
        dsa.enqueue(session, "emails", {"order": 1}, schema=schema)
        dsa.enqueue_many(session, [JobSpec("emails", {"n": i}) for i in range(5)],
                         schema=schema)
        dsa.enqueue_many(session, [{"n": i} for i in range(5)], queue="emails", schema=schema)
        session.rollback()
    with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
        dsa.enqueue(session, "emails", {"order": 2}, schema=schema)
        raise RuntimeError("the request failed")
    assert count_jobs(pg_url, schema) == 0


def test_connection_in_a_begin_block(engine: Engine, migrated: Settings, pg_url: str) -> None:
    schema = migrated.schema_name
    with engine.begin() as conn:
        got = dsa.enqueue_many(conn, [{"queue": "emails", "payload": {"n": i}}
                                      for i in range(3)], schema=schema)
        assert got.enqueued == 3
        got = dsa.enqueue_many(conn, [{"n": 5}, {"n": 6}], queue="emails", priority=2,
                               schema=schema)
        assert got.enqueued == 2
    with engine.connect() as conn:  # autobegin: commit() commits the job
        dsa.enqueue(conn, "emails", {"n": 3}, schema=schema)
        conn.commit()
    with engine.connect() as conn:
        dsa.enqueue(conn, "emails", {"n": 4}, schema=schema)
        conn.rollback()
    assert count_jobs(pg_url, schema) == 6
    with engine.connect() as conn, pytest.raises(TypeError, match="Session"):
        dsa.enqueue(conn, "emails", {"n": 5}, schema=schema, trigger=migrated)
    assert count_jobs(pg_url, schema) == 6  # refused before anything was written


def test_trigger_fires_after_commit_only(engine: Engine, trig: Settings, counter: Counter,
                                         pg_url: str) -> None:
    schema = trig.schema_name
    with Session(engine) as session:
        dsa.enqueue(session, "emails", {"n": 1}, schema=schema, trigger=trig)
        dsa.enqueue_many(session, [JobSpec("emails", {"n": 2})], schema=schema, trigger=trig)
        session.flush()
        assert counter.posts == 0
        session.commit()
        assert counter.posts == 1  # one trigger for the transaction
        dsa.enqueue(session, "emails", {"n": 3}, schema=schema, trigger=trig)
        session.rollback()
        session.commit()  # an empty transaction after the rollback: nothing pending
        assert counter.posts == 1
    assert count_jobs(pg_url, schema) == 2


def test_many_threads_of_sessions(engine: Engine, migrated: Settings, pg_url: str) -> None:
    schema = migrated.schema_name
    make = sessionmaker(engine)
    errors: list[BaseException] = []

    def work(w: int) -> None:
        try:
            for i in range(50):
                with make.begin() as session:
                    dsa.enqueue(session, "emails", {"w": w, "i": i}, schema=schema)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert count_jobs(pg_url, schema) == 400


def test_async_session(pg_url: str, migrated: Settings, trig: Settings,
                       counter: Counter) -> None:
    schema = migrated.schema_name

    async def main() -> None:
        aengine = create_async_engine(sa_url(pg_url), pool_size=8)
        try:
            async with AsyncSession(aengine) as session, session.begin():
                job_id = await dsa.enqueue(session, "emails", {"n": 1}, schema=schema,
                                           trigger=trig)
                assert isinstance(job_id, int)
                got = await dsa.enqueue_many(session, [JobSpec("emails", {"n": 2})],
                                             schema=schema, trigger=trig)
                assert got.enqueued == 1
                seen = (await session.execute(
                    text(f"SELECT count(*) FROM {schema}.jobs"))).scalar_one()
                assert seen == 2
                assert count_jobs(pg_url, schema) == 0
                assert counter.posts == 0
            await drainer_trigger.wait_fired()
            assert counter.wait_for(1) == 1
            async with AsyncSession(aengine) as session:
                await dsa.enqueue_async(session, "emails", {"n": 3}, schema=schema,
                                        trigger=trig)
                await session.rollback()
            async with aengine.connect() as conn:  # an AsyncConnection
                await dsa.enqueue(conn, "emails", {"n": 4}, schema=schema)
                await conn.commit()
            await drainer_trigger.wait_fired()
            assert counter.posts == 1

            async def producer(w: int) -> None:
                for i in range(50):
                    async with AsyncSession(aengine) as s, s.begin():
                        await dsa.enqueue(s, "bulk", {"w": w, "i": i}, schema=schema)

            await asyncio.gather(*(producer(w) for w in range(8)))
        finally:
            await aengine.dispose()

    asyncio.run(main())
    assert count_jobs(pg_url, schema, "emails") == 3
    assert count_jobs(pg_url, schema, "bulk") == 400


def test_a_task_handler_stands_for_its_queue(engine: Engine, migrated: Settings,
                                             pg_url: str) -> None:
    from drainer.registry import Registry

    reg = Registry()

    @reg.task("invoices")
    def send_invoice(job: object) -> None:
        pass

    with Session(engine) as session, session.begin():
        dsa.enqueue(session, send_invoice, {"order": 1}, schema=migrated.schema_name)
    assert count_jobs(pg_url, migrated.schema_name, "invoices") == 1


#: Run with greenlet hidden (SQLAlchemy 2.1 no longer installs it): a synchronous Session
#: enqueues; an AsyncSession asks for greenlet in SQLAlchemy's own words.
_WITHOUT_GREENLET = r"""
import sys

class HideGreenlet:
    def find_spec(self, name, path=None, target=None):
        if name == "greenlet" or name.startswith("greenlet."):
            raise ModuleNotFoundError("No module named 'greenlet'", name="greenlet")
        return None

sys.meta_path.insert(0, HideGreenlet())
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from drainer.contrib.sqlalchemy import enqueue

url, schema = sys.argv[1:3]
engine = create_engine(url)
with Session(engine) as session, session.begin():
    print(enqueue(session, "emails", {"order": 7}, schema=schema))
assert "greenlet" not in sys.modules and "sqlalchemy.ext.asyncio" not in sys.modules
try:
    import sqlalchemy.ext.asyncio  # noqa: F401
except ImportError as exc:
    print("asyncio:", exc)
"""


def test_a_sync_session_enqueues_without_greenlet(migrated: Settings, pg_url: str) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    proc = subprocess.run([sys.executable, "-c", _WITHOUT_GREENLET, sa_url(pg_url),
                           migrated.schema_name], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    job_id, asyncio_line = proc.stdout.splitlines()
    assert int(job_id) > 0 and count_jobs(pg_url, migrated.schema_name) == 1
    assert "greenlet" in asyncio_line
