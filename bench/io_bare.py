"""The I/O benchmark's floor: the same handlers with no queue at all, in this process.

    python -m bench.io_bare async|sync CONCURRENCY N

``async``: N calls of an ``asyncio.sleep`` handler on one event loop, one task a call,
CONCURRENCY tasks in flight (a finished task's slot starts the next call at once), as
drainer runs async handlers; ``sync``: N calls of a ``time.sleep`` handler on CONCURRENCY
threads fed from a queue. No database, no claims, no outcomes: what is left between this and
Little's law is the interpreter and the machine (its load) at that moment, so a queue's row
divided by this one is the queue's own cost. The handlers write the same stamps
(bench/io_stamps.py) as the queues' do.
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import time

from bench import io_stamps


async def _handler() -> None:
    io_stamps.began()
    await asyncio.sleep(io_stamps.SLEEP)
    io_stamps.ended()


async def run_async(concurrency: int, n: int) -> None:
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    started = finished = 0
    tasks: set[asyncio.Task[None]] = set()  # strong references while they run

    def start() -> None:
        nonlocal started
        started += 1
        t = loop.create_task(_handler())
        tasks.add(t)
        t.add_done_callback(ended)

    def ended(t: asyncio.Task[None]) -> None:
        nonlocal finished
        tasks.discard(t)
        finished += 1
        if started < n:
            start()
        elif finished == n:
            done.set_result(None)

    for _ in range(min(concurrency, n)):
        start()
    await done


def run_sync(concurrency: int, n: int) -> None:
    work: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    for i in range(n):
        work.put(i)

    def worker() -> None:
        while work.get() is not None:
            io_stamps.began()
            time.sleep(io_stamps.SLEEP)
            io_stamps.ended()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for _ in threads:
        work.put(None)
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    kind, c, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if kind == "async":
        asyncio.run(run_async(c, count))
    else:
        run_sync(c, count)
