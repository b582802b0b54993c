"""drainer's handlers of the I/O benchmark: each job waits BENCH_IO_SLEEP seconds (0.05).

``io_async`` awaits ``asyncio.sleep`` (an async HTTP call, say), ``io_sync`` calls
``time.sleep`` (a blocking one).
"""

from __future__ import annotations

import asyncio
import time

from bench import io_stamps
from drainer import Job, task


@task("io_async")
async def wait_async(job: Job) -> None:
    io_stamps.began()
    await asyncio.sleep(io_stamps.SLEEP)
    io_stamps.ended()


@task("io_sync")
def wait_sync(job: Job) -> None:
    io_stamps.began()
    time.sleep(io_stamps.SLEEP)
    io_stamps.ended()
