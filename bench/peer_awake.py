"""The awake benchmark's peers (run by the peers venv): a worker of each, always on.

    python -m bench.peer_awake procrastinate|pgqueuer|chancy|dbos DSN [install]

One task ``work`` on the queue ``bench``, as bench/hard_app.py: a payload with ``fail``
fails its first attempt and is retried by the peer's own retry (``BENCH_RETRY_WAIT``
seconds, 5 by default), ``sleep`` waits. Every call appends ``started ended attempt ok
key due`` to ``$BENCH_ATTEMPT_LOG``, where the benchmark reads jobs done and latency (the
peers' tables keep no common finished time). The workers are the peers' long-running
modes (procrastinate's worker: LISTEN/NOTIFY, polling every 5 s; pgqueuer's QueueManager:
LISTEN/NOTIFY, dequeue timeout 30 s; chancy's Worker with its default plugins and the retry
plugin: LISTEN/NOTIFY, the queue polled every 5 s (its default), the AsyncExecutor, 50 at
once, eager polling, outcomes written every second; DBOS: a workflow ``work`` running one
step whose own retry (``max_attempts=2``, ``interval_seconds``) is the retry, its queue
polled every second (its default)): none has a drain-and-exit mode that a trigger or a
schedule starts, beside procrastinate's --one-shot, which knows no delayed job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Any

WAIT_S = float(os.environ.get("BENCH_RETRY_WAIT", "5"))
_LOG = os.environ.get("BENCH_ATTEMPT_LOG", "")


def record(started: float, attempt: int, ok: bool, payload: dict[str, Any]) -> None:
    if not _LOG:
        return
    line = (f"{started:.6f} {time.time():.6f} {attempt} {int(ok)} "
            f"{payload.get('burst')}-{payload.get('n')} {float(payload.get('due', 0)):.6f}\n")
    fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def work(payload: dict[str, Any], attempt: int) -> None:
    """The handler: True when it succeeded (a failure raises after recording)."""
    started = time.time()
    if payload.get("sleep"):
        await asyncio.sleep(float(payload["sleep"]))
    if payload.get("fail") and attempt == 1:
        record(started, attempt, False, payload)
        raise RuntimeError("failing the first attempt (bench hard workload)")
    record(started, attempt, True, payload)


async def procrastinate_main(dsn: str, install: bool) -> None:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=dsn, kwargs={"application_name": "procrastinate"}))

    @app.task(name="work", queue="bench", pass_context=True,
              retry=procrastinate.RetryStrategy(max_attempts=2, wait=max(1, round(WAIT_S))))
    async def task(context: Any, **payload: Any) -> None:
        await work(payload, context.job.attempts + 1)

    async with app.open_async():
        if install:
            await app.schema_manager.apply_schema_async()
            return
        await app.run_worker_async(queues=["bench"], install_signal_handlers=True)


async def pgqueuer_main(dsn: str, install: bool) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, QueueManager
    from pgqueuer.domain.errors import RetryRequested
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(dsn, server_settings={"application_name": "pgqueuer"})
    try:
        if install:
            await Queries(AsyncpgDriver(conn)).install()
            return
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint("work")
        async def entry(job: Job) -> None:
            payload = json.loads(job.payload or b"{}")
            try:
                await work(payload, job.attempts + 1)
            except RuntimeError as exc:
                raise RetryRequested(delay=timedelta(seconds=WAIT_S), reason=str(exc)) from exc

        await qm.run()
    finally:
        await conn.close()


async def chancy_work(*, payload: dict[str, Any], job: Any) -> None:
    """chancy's job (``func`` of the rows bench/awake_peers.py inserts, which chancy's
    worker imports: this module again, not ``__main__``)."""
    await work(payload, job.attempts + 1)


if "chancy" in sys.modules:  # imported by chancy's worker to run chancy_work
    from chancy import QueuedJob

    # chancy passes the job to a keyword-only parameter annotated QueuedJob, and reads the
    # annotation as it is: a string here (from __future__ import annotations)
    chancy_work.__annotations__["job"] = QueuedJob


async def chancy_main(dsn: str, install: bool) -> None:
    from chancy import Chancy, Queue, Worker
    from chancy.plugins.retry import RetryPlugin

    dsn += ("&" if "?" in dsn else "?") + "application_name=chancy"
    log = logging.getLogger("bench.chancy")
    log.setLevel(logging.WARNING)  # chancy logs every job pulled at INFO
    async with Chancy(dsn, plugins=[RetryPlugin()], log=log) as chancy:
        if install:
            await chancy.migrate()
            await chancy.declare(Queue("bench", concurrency=50, executor=Chancy.Executor.Async,
                                       eager_polling=True), upsert=True)
            return
        async with Worker(chancy) as worker:
            await worker.wait_for_shutdown()


def dbos_main(dsn: str, install: bool) -> None:
    from dbos import DBOS, DBOSConfig

    @DBOS.step(retries_allowed=True, max_attempts=2, interval_seconds=WAIT_S)
    async def step(payload: dict[str, Any]) -> None:
        status = DBOS.step_status
        await work(payload, (status.current_attempt or 0) + 1 if status else 1)

    @DBOS.workflow(name="work")
    async def workflow(payload: dict[str, Any]) -> None:
        await step(payload)

    url = dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    url += ("&" if "?" in url else "?") + "application_name=dbos"
    config: DBOSConfig = {"name": "bench", "system_database_url": url,
                          "application_version": "bench", "log_level": "WARNING"}
    DBOS(config=config)
    DBOS.launch()
    DBOS.register_queue("bench", on_conflict="always_update")
    if not install:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_a: stop.set())
        stop.wait()
    DBOS.destroy()


if __name__ == "__main__":
    kind, dsn = sys.argv[1], sys.argv[2]
    install = sys.argv[3:4] == ["install"]
    if kind == "dbos":
        dbos_main(dsn, install)
        raise SystemExit(0)
    main = {"procrastinate": procrastinate_main, "pgqueuer": pgqueuer_main,
            "chancy": chancy_main}[kind]
    asyncio.run(main(dsn, install))
