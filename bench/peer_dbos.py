"""DBOS's side of the race (run by the peers venv): its queue worker, run until the queue is empty.

    python -m bench.peer_dbos DSN EXPECTED [WATCH_DSN]   # drain, then exit

A job is a DBOS workflow (``noop``, no step) enqueued on the queue ``bench``. DBOS has no
drain or one-shot mode: this launches DBOS (its system database is DSN's database, schema
``dbos``), which dequeues from ``bench`` every ``polling_interval_sec`` (1 s, the default)
as many workflows as its limits let it (none set: DBOS's default; a ``worker_concurrency``
of 50 or 200 caps each poll's claim, so 50 or 200 a second) and runs each on its executor
threads; it polls ``dbos.workflow_status`` from a connection of its own (to WATCH_DSN, by
default DSN) until none of the queue's workflows is unfinished (bench/peer_done.py), then
destroys DBOS and exits. The benchmark enqueues the workflows beforehand with DBOS's own SQL
function ``dbos.enqueue_workflow('noop', 'bench')`` (its enqueue for other languages: a
status row and its inputs, as DBOS writes them).
"""

from __future__ import annotations

import logging
import sys

import psycopg
from dbos import DBOS, DBOSConfig

from bench.peer_done import wait_drained

QUEUE = "bench"
#: the application version (DBOS otherwise derives one from the workflows' source); the
#: workflows enqueued by SQL have none and are claimed by any
VERSION = "bench"


@DBOS.workflow(name="noop")
def noop() -> None:
    pass


def launch(dsn: str, listen: list[str]) -> None:
    url = dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    config: DBOSConfig = {"name": "bench", "system_database_url": url,
                          "application_version": VERSION, "log_level": "WARNING"}
    DBOS(config=config)
    DBOS.listen_queues(listen)
    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.WARNING)


def drain(dsn: str, expected: int, watch: str) -> None:
    launch(dsn, [QUEUE])
    DBOS.register_queue(QUEUE, on_conflict="always_update")
    with psycopg.connect(watch, autocommit=True) as conn:
        wait_drained(conn, "dbos", QUEUE, expected)
    DBOS.destroy()


if __name__ == "__main__":
    drain(sys.argv[1], int(sys.argv[2]), sys.argv[3] if sys.argv[3:] else sys.argv[1])
