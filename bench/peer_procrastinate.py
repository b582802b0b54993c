"""procrastinate's side of the race (imported by the peers venv): one no-op task on ``bench``.

    procrastinate --app=bench.peer_procrastinate.app worker --one-shot -c 1 -q bench
"""

from __future__ import annotations

import os

import procrastinate

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ["BENCH_DSN"]))


@app.task(name="noop", queue="bench")
async def noop() -> None:
    pass
