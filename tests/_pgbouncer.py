"""A real PgBouncer in transaction mode, started by the suite in front of the test server.

``pgbouncer_url`` (session-scoped) runs its own ``pgbouncer`` process: config in a temporary
directory, a free port, ``pool_mode = transaction``, ``auth_type = trust``, every database
forwarded to the test server. PgBouncer refuses to run as root, so as root it runs as the
``postgres`` user. ``.ci/run`` installs the OS package; a missing binary fails under CI=true.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests.conftest import missing_component

#: default_pool_size of the suite's PgBouncer: the server sessions one (database, user) gets.
POOL_SIZE = 4

PGBOUNCER = shutil.which("pgbouncer") or next(
    (p for p in ("/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer") if os.path.exists(p)), None)


@dataclass(frozen=True)
class Bouncer:
    url: str
    version: tuple[int, int]
    log: Path

    @property
    def supports_prepared_statements(self) -> bool:
        """PgBouncer >= 1.21 with max_prepared_statements > 0 (set below when supported)."""
        return self.version >= (1, 21)

    @property
    def parses_options(self) -> bool:
        """PgBouncer >= 1.20 parses 'options' (and rejects settings it does not track)."""
        return self.version >= (1, 20)

    def drainer_env(self) -> dict[str, str]:
        """The DRAINER_* settings the README documents for this PgBouncer."""
        return {
            "DRAINER_SESSION_OPTIONS": "false",
            "DRAINER_PREPARED_STATEMENTS": "true" if self.supports_prepared_statements
            else "false",
        }


def pgbouncer_version() -> tuple[int, int]:
    assert PGBOUNCER is not None
    out = subprocess.run([PGBOUNCER, "--version"], capture_output=True, text=True,
                         check=True).stdout
    m = re.search(r"PgBouncer (\d+)\.(\d+)", out)
    assert m, out
    return int(m.group(1)), int(m.group(2))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@pytest.fixture(scope="session")
def pgbouncer(pg_url: str) -> Iterator[Bouncer]:
    if PGBOUNCER is None:
        missing_component("pgbouncer", "apt-get install pgbouncer")
    version = pgbouncer_version()
    target = psycopg.conninfo.conninfo_to_dict(pg_url)
    host = str(target.get("host") or "127.0.0.1")
    server = [f"host={host}", f"port={target.get('port') or 5432}"]
    if target.get("password"):
        server.append(f"password={_quote(str(target['password']))}")
    user = str(target.get("user") or "postgres")
    dbname = str(target.get("dbname") or user)
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="drainer-pgbouncer-"))
    extra = "max_prepared_statements = 100\n" if version >= (1, 21) else ""
    (workdir / "users.txt").write_text(f'"{user}" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = {' '.join(server)}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {workdir / 'users.txt'}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {POOL_SIZE}\n"
        "max_client_conn = 200\n"
        "server_reset_query =\n"
        f"{extra}"
        f"logfile = {workdir / 'pgbouncer.log'}\n"
        f"pidfile = {workdir / 'pgbouncer.pid'}\n"
    )
    command = [PGBOUNCER, str(workdir / "pgbouncer.ini")]
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(workdir, pw.pw_uid, pw.pw_gid)
        for f in workdir.iterdir():
            os.chown(f, pw.pw_uid, pw.pw_gid)
        command = ["runuser", "-u", "postgres", "--", *command]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"postgresql://{user}@127.0.0.1:{port}/{dbname}"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                psycopg.connect(url, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                pass
            assert proc.poll() is None, (proc.stderr.read() if proc.stderr else b"").decode()
            assert time.monotonic() < deadline, "pgbouncer did not accept connections"
            time.sleep(0.05)
        yield Bouncer(url, version, workdir / "pgbouncer.log")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
        shutil.rmtree(workdir, ignore_errors=True)
