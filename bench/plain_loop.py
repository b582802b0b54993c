"""The no-framework reference: claim 10 with drainer's SQL, complete the batch in one statement.

Run as ``python -m bench.plain_loop DSN SCHEMA [BATCH]``; drains the queue ``bench`` and exits.
"""

from __future__ import annotations

import sys

import psycopg

from drainer.db import Queries


def main(dsn: str, schema: str, batch: int = 10) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        q = Queries(conn, schema, "jobs")
        claim, complete = q.text("claim_batch"), q.text("complete_many")
        done = 0
        while True:
            rows = conn.execute(claim, {"queue": "bench", "batch_size": batch,
                                        "lease": 300.0, "start_now": batch,
                                        "run_id": "plain"}).fetchall()
            if not rows:
                break
            conn.execute(complete, {"ids": [r[0] for r in rows],
                                    "fences": [r[8] for r in rows],
                                    "results": [None] * len(rows), "followups": "[]"})
            done += len(rows)
    print(done)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:4])))
