"""pgqueuer's side of the race (run by the peers venv): drain mode over asyncpg.

    python -m bench.peer_pgqueuer DSN [install]

pgqueuer's ``pgq run --mode drain`` CLI may crash with recent typer releases, so this calls
its Python API with ``QueueExecutionMode.drain``, which is what that CLI does.
"""

from __future__ import annotations

import asyncio
import sys

import asyncpg
from pgqueuer import AsyncpgDriver, QueueManager
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode


async def drain(dsn: str, batch_size: int = 10) -> None:
    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        pass

    await qm.run(mode=QueueExecutionMode.drain, batch_size=batch_size)
    await conn.close()


async def install(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


if __name__ == "__main__":
    if sys.argv[2:3] == ["install"]:
        asyncio.run(install(sys.argv[1]))
    else:
        asyncio.run(drain(sys.argv[1]))
