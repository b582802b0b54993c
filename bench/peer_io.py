"""The peers' side of the I/O benchmark (run by the peers venv): jobs that wait 50 ms.

    python -m bench.peer_io procrastinate|pgqueuer async|sync CONCURRENCY DSN

Their best settings as far as this harness knows them, the same for every run:

- procrastinate: ``run_worker_async(concurrency=C, wait=False)`` (one-shot), a psycopg pool of
  at most 10 connections (of 10, 20 and 50 tried at C=200 and 1,000 with 4,000 jobs, 10 was
  best or level); sync tasks run in procrastinate's threads, the loop's default executor
  sized to C threads.
- pgqueuer: drain mode, ``max_concurrent_tasks=C``, ``batch_size=min(100, C/2)`` (at least 10;
  of 10, 50 and 100 tried, 100 was best at sync C=200 and async C=1,000, 50 at async C=200
  by 15%); a sync handler runs in ``asyncio.to_thread`` with a default executor of C threads
  (pgqueuer entrypoints are async).

BENCH_PROC_POOL and BENCH_PGQ_BATCH override the pool size and the batch size.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from bench import io_stamps


def _threads(concurrency: int) -> None:
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(concurrency))


async def procrastinate_main(kind: str, concurrency: int, dsn: str) -> None:
    import procrastinate

    _threads(concurrency)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=dsn, min_size=1, max_size=int(os.environ.get("BENCH_PROC_POOL", "10"))))
    if kind == "async":
        @app.task(name="io", queue="io")
        async def io_async() -> None:
            io_stamps.began()
            await asyncio.sleep(io_stamps.SLEEP)
            io_stamps.ended()
    else:
        @app.task(name="io", queue="io")
        def io_sync() -> None:
            io_stamps.began()
            time.sleep(io_stamps.SLEEP)
            io_stamps.ended()
    async with app.open_async():
        await app.run_worker_async(queues=["io"], concurrency=concurrency, wait=False)


def pgqueuer_batch(concurrency: int) -> int:
    return int(os.environ.get("BENCH_PGQ_BATCH", 0)) or max(10, min(100, concurrency // 2))


async def pgqueuer_main(kind: str, concurrency: int, dsn: str) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, QueueManager
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    _threads(concurrency)
    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    if kind == "async":
        @qm.entrypoint("io")
        async def io_async(job: Job) -> None:
            io_stamps.began()
            await asyncio.sleep(io_stamps.SLEEP)
            io_stamps.ended()
    else:
        @qm.entrypoint("io")
        async def io_sync(job: Job) -> None:
            io_stamps.began()
            await asyncio.to_thread(time.sleep, io_stamps.SLEEP)
            io_stamps.ended()

    batch = pgqueuer_batch(concurrency)
    await qm.run(mode=QueueExecutionMode.drain, batch_size=batch,
                 max_concurrent_tasks=max(concurrency, 2 * batch))
    await conn.close()


if __name__ == "__main__":
    peer, kind, c, dsn = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    main = procrastinate_main if peer == "procrastinate" else pgqueuer_main
    asyncio.run(main(kind, c, dsn))
