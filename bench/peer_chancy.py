"""chancy's side of the race (run by the peers venv): its worker, run until the queue is empty.

    python -m bench.peer_chancy DSN EXPECTED [WATCH_DSN]   # drain, then exit
    python -m bench.peer_chancy DSN install [CONCURRENCY]  # migrate, declare the queue

chancy has no drain or one-shot mode: this starts its ``Worker`` (with the default plugins),
polls ``chancy_jobs`` from a connection of its own (to WATCH_DSN, by default DSN: across
the delay proxy the poll is the harness's, not chancy's, traffic) until none of the queue's jobs is
unfinished (bench/peer_done.py), stops the worker (which writes the last outcomes) and
exits. The queue ``bench`` is declared as chancy recommends for many small async jobs: the
``AsyncExecutor`` (tasks on the worker's event loop; the default, a process pool, would
start a process per job slot), ``eager_polling`` (fetch again as soon as a job completes,
not after ``polling_interval``), and CONCURRENCY jobs at once (50 by default). The jobs are
inserted into ``chancy_jobs`` beforehand by the benchmark (bench/contenders.py).
"""

from __future__ import annotations

import asyncio
import logging
import sys

import psycopg
from chancy import Chancy, Queue, Worker

from bench.peer_done import wait_drained

QUEUE = "bench"
FUNC = "bench.peer_chancy.noop"
CONCURRENCY = 50


async def noop() -> None:
    pass


def app(dsn: str) -> Chancy:
    log = logging.getLogger("bench.chancy")
    log.setLevel(logging.WARNING)  # chancy logs every job pulled at INFO
    return Chancy(dsn, log=log)


def queue(concurrency: int) -> Queue:
    return Queue(QUEUE, concurrency=concurrency, executor=Chancy.Executor.Async,
                 eager_polling=True, polling_interval=1)


async def install(dsn: str, concurrency: int) -> None:
    async with app(dsn) as chancy:
        await chancy.migrate()
        await chancy.declare(queue(concurrency), upsert=True)


async def drain(dsn: str, expected: int, watch: str) -> None:
    async with app(dsn) as chancy:
        worker = Worker(chancy, register_signal_handlers=False)
        await worker.start()
        conn = await asyncio.to_thread(psycopg.connect, watch, autocommit=True)
        try:
            await asyncio.to_thread(wait_drained, conn, "chancy", QUEUE, expected)
        finally:
            conn.close()
            await worker.stop()


if __name__ == "__main__":
    dsn, what = sys.argv[1], sys.argv[2]
    if what == "install":
        asyncio.run(install(dsn, int(sys.argv[3]) if sys.argv[3:] else CONCURRENCY))
    else:
        asyncio.run(drain(dsn, int(what), sys.argv[3] if sys.argv[3:] else dsn))
