"""The contenders of the drain-until-empty race: each resets its queue, runs once, checks."""

from __future__ import annotations

import json
import math
import re
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

from bench.core import ROOT, VENV_BIN, Timed, count_status, fill, fresh_schema, run_timed
from drainer.db import Queries


@dataclass
class Contender:
    """Something that drains ``n`` no-op jobs from its own schema or database."""

    name: str
    url: str
    schema: str
    queues: list[str] = field(default_factory=lambda: ["bench"])
    via: str | None = None  # the URL its runs connect to (a delay proxy), when not ``url``

    @property
    def run_url(self) -> str:
        return self.via or self.url

    def setup(self) -> None:
        fresh_schema(self.url, self.schema)

    def reset(self, n: int) -> None:
        fill(self.url, self.schema, n, self.queues)

    def run(self, n: int) -> Timed:
        raise NotImplementedError

    def session_seconds(self, timed: Timed) -> float | None:
        """Seconds of the run once its process was up: from opening its connection to its
        end (None: the contender does not say)."""
        return None

    def check(self, n: int, timed: Timed) -> str | None:
        """None when every job was done, else what went wrong."""
        if timed.returncode != 0:
            return f"exit {timed.returncode}: {timed.stderr.strip()[-300:]}"
        done = count_status(self.url, self.schema, "done")
        return None if done == n else f"{done} of {n} jobs done"


def pgbench_script(url: str, schema: str, queue: str, batch: int) -> str:
    """A pgbench script running drainer's own claim and batch completion, one round trip each."""
    with psycopg.connect(url) as conn:
        q = Queries(conn, schema, "jobs")
        claim, complete = q.text("claim_batch"), q.text("complete_many")
        literal = sql.Literal(queue).as_string(conn)
    # the claim as the drain sends it in step (every job starts at once, one run id), the
    # completion as it sends it for handlers that return nothing and enqueue nothing
    # (drainer.db.encoders.completion_params: an empty results array, no follow-ups)
    claim = (claim.replace("%(queue)s", literal).replace("%(batch_size)s", ":batch")
             .replace("%(lease)s", ":lease").replace("%(start_now)s", ":batch")
             .replace("%(run_id)s", "'run-0123456789abcdef'"))
    complete = (complete.replace("%(ids)s", ":ids").replace("%(fences)s", ":fences")
                .replace("%(results)s", "'{}'").replace("%(followups)s", "'[]'"))
    return (
        f"\\set batch {batch}\n"
        "\\set lease 300\n"
        f"WITH c AS (\n{claim}\n)\n"
        "SELECT coalesce(array_agg(id), '{}') AS ids, "
        "coalesce(array_agg(fence), '{}') AS fences FROM c\n"
        "\\gset\n"
        f"{complete};\n"
    )


@dataclass
class Pgbench(Contender):
    clients: int = 1
    batch: int = 10

    def run(self, n: int) -> Timed:
        parts = urlsplit(self.url)
        script = pgbench_script(self.url, self.schema, self.queues[0], self.batch)
        per_client = math.ceil(n / (self.batch * self.clients))
        with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
            f.write(script)
        try:
            return run_timed([
                "pgbench", "-n", "-M", "prepared", "-c", str(self.clients),
                "-j", str(self.clients), "-t", str(per_client), "-f", f.name,
                "-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 5432),
                "-U", parts.username or "postgres", (parts.path or "/postgres").lstrip("/"),
            ])
        finally:
            Path(f.name).unlink()

    def session_seconds(self, timed: Timed) -> float | None:
        """pgbench's own figures: its initial connection time, plus its transactions at the
        tps it reports "without initial connection time"."""
        done = re.search(r"number of transactions actually processed: (\d+)", timed.stdout)
        tps = re.search(r"tps = ([\d.]+)", timed.stdout)
        conn = re.search(r"initial connection time = ([\d.]+) ms", timed.stdout)
        if not (done and tps and conn) or not float(tps.group(1)):
            return None
        return int(done.group(1)) / float(tps.group(1)) + float(conn.group(1)) / 1000


@dataclass
class Drainer(Contender):
    flags: list[str] = field(default_factory=list)
    app: str = "bench.noop_app"

    def env(self) -> dict[str, str]:
        return {
            "DRAINER_DATABASE_URL": self.run_url, "DRAINER_SCHEMA": self.schema,
            "DRAINER_APP": self.app, "DRAINER_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT), "DRAINER_CONNECT_RETRIES": "0",
        }

    def run(self, n: int) -> Timed:
        return run_timed([str(VENV_BIN / "drainer"), "run-once", *self.flags], self.env())

    def session_seconds(self, timed: Timed) -> float | None:
        """The run report's connected_s: connection opened to closed (the drain and the
        maintenance, VACUUM included; the interpreter, imports, settings and app left out)."""
        try:
            return float(json.loads(timed.stdout.strip().splitlines()[-1])["connected_s"])
        except (ValueError, IndexError, KeyError, TypeError):
            return None

    def check(self, n: int, timed: Timed) -> str | None:
        problem = super().check(n, timed)
        if problem:
            return problem
        try:
            report = json.loads(timed.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return f"no run report: {timed.stdout[-200:]!r}"
        if report.get("succeeded") != n:
            return f"report says {report.get('succeeded')} succeeded of {n}"
        return None


@dataclass
class PlainLoop(Contender):
    batch: int = 10

    def run(self, n: int) -> Timed:
        return run_timed([str(VENV_BIN / "python"), "-m", "bench.plain_loop", self.url,
                          self.schema, str(self.batch)], {"PYTHONPATH": str(ROOT)})


PEERS_VENV = ROOT / "bench" / ".peers-venv"
PEERS_BIN = PEERS_VENV / "bin"
#: the peers' packages, from PyPI (unpinned) when the venv is made; one added here is
#: installed on the next use; ``peer_versions()`` says which versions ran
PEER_PACKAGES = ["procrastinate", "pgqueuer", "asyncpg", "chancy", "dbos"]


def ensure_peers() -> str | None:
    """Install the peers into their own venv on first use (and when PEER_PACKAGES gains
    one); None when ready, else why not."""
    stamp = PEERS_VENV / ".bench-installed"
    with _INSTALLING:  # bench.awake --parallel starts its peers from threads at once
        if stamp.exists() and stamp.read_text().split() == PEER_PACKAGES:
            return None
        return _install_peers(stamp)


_INSTALLING = threading.Lock()


def _install_peers(stamp: Path) -> str | None:
    import subprocess
    import venv

    try:
        if not (PEERS_BIN / "python").exists():
            venv.EnvBuilder(with_pip=True).create(PEERS_VENV)
        subprocess.run([str(PEERS_BIN / "python"), "-m", "pip", "install", "-q",
                        *PEER_PACKAGES], check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"cannot install the peers ({' '.join(PEER_PACKAGES)}): {exc}"
    stamp.write_text(" ".join(PEER_PACKAGES))
    return None


def peer_versions() -> str:
    import subprocess

    out = subprocess.run([str(PEERS_BIN / "python"), "-m", "pip", "list", "--format=freeze"],
                         capture_output=True, text=True).stdout
    wanted = {p.lower() for p in PEER_PACKAGES}
    return ", ".join(line for line in out.split() if line.split("==")[0].lower() in wanted)


def _sql(url: str, *statements: str) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        for s in statements:
            cur = conn.execute(s.encode())
            if cur.description:
                rows = cur.fetchall()
    return rows


@dataclass
class Procrastinate(Contender):
    concurrency: int = 1

    def setup(self) -> None:
        if not _sql(self.url, "SELECT to_regclass('procrastinate_jobs') IS NOT NULL")[0][0]:
            run_timed([str(PEERS_BIN / "procrastinate"), "--app=bench.peer_procrastinate.app",
                       "schema", "--apply"], {"BENCH_DSN": self.url, "PYTHONPATH": str(ROOT)})

    def env(self) -> dict[str, str]:
        return {"BENCH_DSN": self.run_url, "PYTHONPATH": str(ROOT)}

    def reset(self, n: int) -> None:
        _sql(self.url,
             "TRUNCATE procrastinate_events, procrastinate_periodic_defers, procrastinate_jobs, "
             "procrastinate_workers CASCADE",
             "INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
             f"SELECT 'bench', 'noop', '{{}}' FROM generate_series(1, {int(n)})",
             "VACUUM (ANALYZE) procrastinate_jobs")

    def run(self, n: int) -> Timed:
        return run_timed([str(PEERS_BIN / "procrastinate"), "--app=bench.peer_procrastinate.app",
                          "worker", "--one-shot", "-c", str(self.concurrency), "-q", "bench"],
                         self.env())

    def check(self, n: int, timed: Timed) -> str | None:
        if timed.returncode != 0:
            return f"exit {timed.returncode}: {timed.stderr.strip()[-300:]}"
        done = _sql(self.url, "SELECT count(*) FROM procrastinate_jobs "
                              "WHERE status = 'succeeded'")[0][0]
        return None if done == n else f"{done} of {n} jobs succeeded"


@dataclass
class Pgqueuer(Contender):
    def setup(self) -> None:
        if not _sql(self.url, "SELECT to_regclass('pgqueuer') IS NOT NULL")[0][0]:
            run_timed([str(PEERS_BIN / "python"), "-m", "bench.peer_pgqueuer", self.url,
                       "install"], {"PYTHONPATH": str(ROOT)})

    def reset(self, n: int) -> None:
        _sql(self.url,
             "TRUNCATE pgqueuer, pgqueuer_log",
             "INSERT INTO pgqueuer (priority, entrypoint, status, payload) "
             f"SELECT 0, 'noop', 'queued', NULL FROM generate_series(1, {int(n)})",
             "VACUUM (ANALYZE) pgqueuer")

    def run(self, n: int) -> Timed:
        return run_timed([str(PEERS_BIN / "python"), "-m", "bench.peer_pgqueuer", self.run_url],
                         {"PYTHONPATH": str(ROOT)})

    def check(self, n: int, timed: Timed) -> str | None:
        if timed.returncode != 0:
            return f"exit {timed.returncode}: {timed.stderr.strip()[-300:]}"
        left = _sql(self.url, "SELECT count(*) FROM pgqueuer")[0][0]
        return None if left == 0 else f"{left} of {n} jobs left in the queue"


#: the peers with no drain mode, as the tables name them: their worker runs until the harness
#: sees the queue empty in their own table (bench/peer_done.py), then stops
CHANCY = "chancy worker until empty (AsyncExecutor, concurrency 50, eager polling)"
DBOS = "dbos queue worker until empty (workflows, default polling 1 s)"


@dataclass
class Chancy(Contender):
    """chancy's worker run until its queue is empty (bench/peer_chancy.py: it has no drain
    mode), jobs inserted into ``chancy_jobs`` beforehand, as procrastinate's."""

    concurrency: int = 50

    def setup(self) -> None:
        # the queue's settings live in the database: declare them on every setup (upsert)
        done = run_timed([str(PEERS_BIN / "python"), "-m", "bench.peer_chancy", self.url,
                          "install", str(self.concurrency)], {"PYTHONPATH": str(ROOT)})
        if done.returncode:
            raise RuntimeError(f"chancy install: {done.stderr.strip()[-300:]}")

    def reset(self, n: int) -> None:
        _sql(self.url,
             "TRUNCATE chancy_jobs",
             "INSERT INTO chancy_jobs (id, queue, func) "
             f"SELECT gen_random_uuid(), 'bench', 'bench.peer_chancy.noop' "
             f"FROM generate_series(1, {int(n)})",
             "VACUUM (ANALYZE) chancy_jobs")

    def run(self, n: int) -> Timed:
        # the harness's own poll goes to the database directly: it is not chancy's work
        return run_timed([str(PEERS_BIN / "python"), "-m", "bench.peer_chancy", self.run_url,
                          str(n), self.url], {"PYTHONPATH": str(ROOT)})

    def check(self, n: int, timed: Timed) -> str | None:
        if timed.returncode != 0:
            return f"exit {timed.returncode}: {timed.stderr.strip()[-300:]}"
        done = _sql(self.url, "SELECT count(*) FROM chancy_jobs "
                              "WHERE state = 'succeeded'")[0][0]
        return None if done == n else f"{done} of {n} jobs succeeded"


@dataclass
class Dbos(Contender):
    """DBOS's queue worker run until the queue is empty (bench/peer_dbos.py: it has no drain
    mode), workflows enqueued beforehand by DBOS's own SQL ``dbos.enqueue_workflow``."""

    def setup(self) -> None:
        if not _sql(self.url, "SELECT to_regclass('dbos.workflow_status') IS NOT NULL")[0][0]:
            # DBOS creates its system tables when it launches: a drain of nothing
            done = run_timed([str(PEERS_BIN / "python"), "-m", "bench.peer_dbos", self.url,
                              "0"], {"PYTHONPATH": str(ROOT)})
            if done.returncode:
                raise RuntimeError(f"DBOS launch: {done.stderr.strip()[-300:]}")

    def reset(self, n: int) -> None:
        _sql(self.url,
             "TRUNCATE dbos.workflow_status, dbos.workflow_input, dbos.workflow_output, "
             "dbos.operation_outputs CASCADE",
             f"SELECT count(dbos.enqueue_workflow('noop', 'bench')) "
             f"FROM generate_series(1, {int(n)})",
             "VACUUM (ANALYZE) dbos.workflow_status, dbos.workflow_input")

    def run(self, n: int) -> Timed:
        return run_timed([str(PEERS_BIN / "python"), "-m", "bench.peer_dbos", self.run_url,
                          str(n), self.url], {"PYTHONPATH": str(ROOT)})

    def check(self, n: int, timed: Timed) -> str | None:
        if timed.returncode != 0:
            return f"exit {timed.returncode}: {timed.stderr.strip()[-300:]}"
        done = _sql(self.url, "SELECT count(*) FROM dbos.workflow_status "
                              "WHERE status = 'SUCCESS'")[0][0]
        return None if done == n else f"{done} of {n} workflows succeeded"
