"""The harness's plumbing: databases and schemas, filling queues, timing child processes."""

from __future__ import annotations

import compileall
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from drainer.migrate import migrate

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def with_database(url: str, dbname: str) -> str:
    """``url`` pointing at another database."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


def ensure_database(server_url: str, dbname: str) -> str:
    """Create ``dbname`` on the server when missing; return its URL."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                              [dbname]).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    return with_database(server_url, dbname)


def ab_database(server_url: str, default: str) -> str:
    """The A/B tools' database (created when missing), ``$BENCH_AB_DATABASE`` or
    ``default``: a database of one's own lets two A/Bs run at once (their schemas would
    clash in the same one)."""
    return ensure_database(server_url, os.environ.get("BENCH_AB_DATABASE", default))


#: the longest settle() waits for autovacuum workers on the bench's databases to end
AUTOVACUUM_WAIT_S = 10.0


@dataclass
class SettleLog:
    """What settle() did over this invocation, for the method text under each table."""

    #: per settle: seconds it took, whether it waited for autovacuum, whether it gave up
    settles: list[tuple[float, bool, bool]] = field(default_factory=list)
    #: why the server refused CHECKPOINT (not a superuser nor pg_checkpoint), if it did
    checkpoint_refused: str | None = None

    def note(self, since: int = 0) -> str:
        """One sentence: what was done before each timed run from settle number ``since``
        on, and what it cost."""
        done = self.settles[since:]
        if not done:
            return ""
        wait = ("waited until no autovacuum worker ran on the bench's databases (at most "
                f"{AUTOVACUUM_WAIT_S:g} s)")
        what = (f"{wait}, then CHECKPOINT" if self.checkpoint_refused is None
                else f"{wait}; no CHECKPOINT ({self.checkpoint_refused})")
        waited = sum(1 for _s, w, _t in done if w)
        gave_up = sum(1 for _s, _w, t in done if t)
        waits = "no autovacuum worker met" if not waited else \
            f"waited for autovacuum {waited} times" + (f" ({gave_up} gave up)" if gave_up else "")
        secs = [s for s, _w, _t in done]
        return (f"Settled before each timed run, every contender alike: {what}, so that no "
                "run pays for the dirty buffers, the spread checkpoint or the vacuum that an "
                f"earlier run left behind ({len(secs)} settles, median "
                f"{statistics.median(secs) * 1000:.0f} ms, max {max(secs) * 1000:.0f} ms; "
                f"{waits}).")


SETTLED = SettleLog()


def settle(url: str, databases: Iterable[str] = ()) -> float:
    """Bring the server to one quiet state before a timed run, whoever ran before: wait
    (bounded) until no autovacuum worker runs on ``databases`` (names, or URLs on the server),
    then CHECKPOINT: the buffers the previous contender dirtied are written and synced, and
    the spread checkpoint its WAL may have started (by max_wal_size or checkpoint_timeout) is
    finished, with the next one a full checkpoint_timeout or max_wal_size away. Otherwise
    the run after a write-heavy contender (procrastinate, thousands of commits) competes
    with that checkpoint's writes and, for every page it touches first after its start,
    writes a full page image to the WAL. ``url``: any database on the server. Returns the
    seconds it took (also kept in SETTLED)."""
    started = time.perf_counter()
    names = sorted({urlsplit(d).path.lstrip("/") if "://" in d else d for d in databases})
    waited = gave_up = False
    with psycopg.connect(url, autocommit=True) as conn:
        while names:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = "
                               "'autovacuum worker' AND datname = ANY(%s)", [names]).fetchone()
            if not row or not row[0]:
                break
            waited = True
            if time.perf_counter() - started > AUTOVACUUM_WAIT_S:
                gave_up = True
                log(f"settle: autovacuum still running on {', '.join(names)} after "
                    f"{AUTOVACUUM_WAIT_S:g} s; going on")
                break
            time.sleep(0.05)
        if SETTLED.checkpoint_refused is None:
            try:
                conn.execute("CHECKPOINT")
            except psycopg.errors.InsufficientPrivilege as exc:
                SETTLED.checkpoint_refused = str(exc).strip().splitlines()[0]
                log(f"settle: no CHECKPOINT: {SETTLED.checkpoint_refused}")
    took = time.perf_counter() - started
    SETTLED.settles.append((took, waited, gave_up))
    return took


def fresh_schema(url: str, schema: str) -> None:
    """Drop and re-create ``schema`` with a migrated jobs table."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        migrate(conn, schema, "jobs")


def jobs_table(schema: str) -> sql.Composed:
    return sql.SQL("{}").format(sql.Identifier(schema, "jobs"))


def fill(url: str, schema: str, n: int, queues: list[str] | None = None, *,
         keep_queue: str | None = None) -> None:
    """Empty the jobs table (all but ``keep_queue``'s rows) and put ``n`` due no-op jobs in it,
    spread over ``queues`` in turn; then VACUUM ANALYZE so every repetition starts alike."""
    queues = queues or ["bench"]
    table = jobs_table(schema)
    with psycopg.connect(url, autocommit=True) as conn:
        if keep_queue is None:
            conn.execute(sql.SQL("TRUNCATE {}").format(table))
        else:
            conn.execute(sql.SQL("DELETE FROM {} WHERE queue <> %s").format(table), [keep_queue])
        conn.execute(sql.SQL(
            "INSERT INTO {} (queue, payload, run_at) "
            "SELECT (%s::text[])[1 + g %% %s], jsonb_build_object('n', g), now() - interval '1s' "
            "FROM generate_series(0, %s - 1) g").format(table), [queues, len(queues), n])
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(table))


def jobs_per_completion(url: str, schema: str) -> float | None:
    """The done jobs over the completion statements that wrote them: each statement stamps
    its rows with its own now() as finished_at, so the distinct stamps count the statements
    (a claim size, as the drain completes a claim's jobs together). None: nothing done."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql.SQL(
            "SELECT count(*)::float8 / nullif(count(DISTINCT finished_at), 0) FROM {} "
            "WHERE status = 'done'").format(jobs_table(schema))).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def count_status(url: str, schema: str, status: str, queue_not: str | None = None) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        q = sql.SQL("SELECT count(*) FROM {} WHERE status = %s").format(jobs_table(schema))
        params: list[Any] = [status]
        if queue_not is not None:
            q = q + sql.SQL(" AND queue <> %s")
            params.append(queue_not)
        row = conn.execute(q, params).fetchone()
        assert row is not None
        return int(row[0])


@dataclass
class Timed:
    """One child process: wall time from start to exit, its peak RSS, and its output."""

    wall: float
    peak_rss_mb: float
    returncode: int
    stdout: str
    stderr: str


def run_timed(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 900
              ) -> Timed:
    """Run ``cmd``; the wall time covers the whole process, start-up included."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    out_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-{os.getpid()}.out"
    err_path = out_path.with_suffix(".err")
    with out_path.open("w+") as out, err_path.open("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=full_env, cwd=ROOT)
        deadline = started + timeout
        hwm_kb = 0
        polls = 0
        while True:
            pid, status, _usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if polls % 10 == 0:
                hwm_kb = max(hwm_kb, _vm_hwm_kb(proc.pid))
            polls += 1
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, _usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.001)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    out_path.unlink(missing_ok=True)
    err_path.unlink(missing_ok=True)
    return Timed(wall, hwm_kb / 1024, proc.returncode, stdout, stderr)


def _vm_hwm_kb(pid: int) -> int:
    """Peak RSS so far of a running process (VmHWM of its own address space).

    Polled, not taken from wait4(): a child forked from this harness carries the harness's
    peak RSS in its ru_maxrss across exec, which would hide a smaller child's peak.
    """
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


@dataclass
class Series:
    """Repeated measurements of one contender."""

    name: str
    values: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: jobs/s over the run's own session (process start-up left out), where the contender
    #: says how long that was (Contender.session_seconds); one a valid run, else empty
    session: list[float] = field(default_factory=list)
    #: jobs per completion statement of each valid run (drainer's and the plain loop's)
    per_statement: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def lo(self) -> float:
        return min(self.values) if self.values else float("nan")

    @property
    def hi(self) -> float:
        return max(self.values) if self.values else float("nan")


def log(msg: str) -> None:
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def fmt_rate(x: float) -> str:
    if x != x:  # nan
        return "n/a"
    return f"{x:,.0f}"


def write_bytecode(folder: Path | str) -> None:
    """Write the bytecode of the modules under ``folder``, as ``pip install`` does for an
    installed package (and did for the peers' and psycopg's): run from a checkout with
    PYTHONDONTWRITEBYTECODE set (as on this machine), every timed drainer start would
    otherwise compile each of its modules again, about a quarter of an empty run-once's
    instructions. The peers' venv under bench/ has its own."""
    compileall.compile_dir(str(folder), quiet=1, workers=1, rx=re.compile(r"peers-venv"))


def prepare_tree(tree: str, url: str, schema: str) -> None:
    """A drainer source tree of an A/B (``git archive REV drainer | tar -x -C DIR``): its
    bytecode written, and ``schema`` migrated by the tree's own code (the two trees may be
    at different schema versions)."""
    write_bytecode(tree)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import psycopg; "
            "from drainer.migrate import migrate; "
            "migrate(psycopg.connect(sys.argv[2], autocommit=True), sys.argv[3], 'jobs')")
    subprocess.run([sys.executable, "-c", code, tree, url, schema], check=True, cwd="/")
