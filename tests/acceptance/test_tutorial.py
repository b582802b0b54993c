"""The tutorial runs exactly as written: docs/tutorial.md and the README's copy of it, and
every Python snippet of the docs marked runnable.

Each run gets a database of its own (created and dropped here), so the tutorial's default
schema `drainer` is really used; only the connection string of its `export` line is
replaced by the test server's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo, sql

from tests.conftest import ROOT
from tests.deploy._paths import psql_binary
from tests.docs_snippets import blocks, section, tutorial_script

DOCS = ROOT / "docs"
TUTORIAL_HEADING = "## Five-minute tutorial"


@pytest.fixture
def database(pg_url: str) -> Iterator[str]:
    """The URL of a fresh database on the test server, dropped afterwards."""
    name = f"t_doc_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield conninfo.make_conninfo(pg_url, dbname=name)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                         .format(sql.Identifier(name)))


def _env(url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DRAINER_") and k not in {"DATABASE_URL", "PYTHONPATH"}}
    bindirs = [str(Path(sys.executable).parent), str(Path(psql_binary()).parent)]
    env["PATH"] = os.pathsep.join([*bindirs, env.get("PATH", "")])
    if url is not None:
        env["DRAINER_DATABASE_URL"] = url
    return env


def _run_tutorial(markdown: str, url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tutorial_script(markdown)
    exports = re.findall(r"^export DRAINER_DATABASE_URL=.*$", script, flags=re.M)
    assert len(exports) == 1, "the tutorial sets DRAINER_DATABASE_URL once"
    script = script.replace(exports[0], f"export DRAINER_DATABASE_URL='{url}'")
    return subprocess.run(["bash", "-c", script], cwd=tmp_path, env=_env(None),
                          capture_output=True, text=True, timeout=180)


def _check_tutorial_ran(proc: subprocess.CompletedProcess[str], tmp_path: Path) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reports = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith('{"run_id"')]
    assert len(reports) == 1, proc.stdout
    report = reports[0]
    assert report["queues"] == ["emails"]
    assert report["claimed"] == report["succeeded"] == 2, report
    assert report["failed"] == report["retried"] == 0, report
    outbox = sorted((tmp_path / "drainer-tutorial" / "outbox").glob("*.txt"))
    assert [p.read_text() for p in outbox] == ["Welcome, ada@example.com!\n",
                                              "Welcome, grace@example.com!\n"]
    assert "Welcome, grace@example.com!" in proc.stdout  # `cat outbox/*.txt`
    shows = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith('{"id": ')]
    assert len(shows) == 1, proc.stdout  # `drainer show 1`
    shown = shows[0]
    assert shown["id"] == 1 and shown["payload"] == {"to": "ada@example.com"}, shown
    assert shown["status"] == "done" and shown["run_id"] == report["run_id"], shown
    assert '"level": "warning"' not in proc.stderr, proc.stderr
    assert "never been seen" not in proc.stderr, proc.stderr  # enqueue --app: no warning
    assert "Traceback" not in proc.stderr


def test_the_docs_tutorial_runs_as_written(database: str, tmp_path: Path) -> None:
    proc = _run_tutorial((DOCS / "tutorial.md").read_text(), database, tmp_path)
    _check_tutorial_ran(proc, tmp_path)


def test_the_readme_tutorial_runs_as_written(database: str, tmp_path: Path) -> None:
    text = section((ROOT / "README.md").read_text(), TUTORIAL_HEADING)
    proc = _run_tutorial(text, database, tmp_path)
    _check_tutorial_ran(proc, tmp_path)


def test_the_readme_tutorial_is_the_docs_tutorial() -> None:
    """Same files, same commands: the two copies cannot drift apart."""
    readme = section((ROOT / "README.md").read_text(), TUTORIAL_HEADING)
    docs = (DOCS / "tutorial.md").read_text()
    strip = re.compile(r"^# line \d+$", re.M)
    assert strip.sub("", tutorial_script(readme)) == strip.sub("", tutorial_script(docs))



@pytest.mark.parametrize("page", ["README.md", "docs/tutorial.md"])
def test_each_file_is_named_in_the_text(page: str) -> None:
    """GitHub does not show a block's title: the sentence before it names the file."""
    text = (ROOT / page).read_text()
    lines = text.split("\n")
    titled = [b for b in blocks(text) if b.title]
    assert titled
    for b in titled:
        before = next(ln for ln in reversed(lines[:b.line - 1]) if ln.strip())
        assert f"`{b.title}`" in before, (page, b.line, before)

def _runnable() -> list[tuple[str, int, str]]:
    found = []
    for page in sorted(DOCS.glob("*.md")):
        for b in blocks(page.read_text()):
            if b.runnable:
                assert b.lang == "python", f"{page.name}:{b.line}: only Python runs"
                found.append((page.name, b.line, b.code))
    return found


def test_some_snippets_are_marked_runnable() -> None:
    assert len(_runnable()) >= 4


@pytest.mark.parametrize(("page", "line", "code"), _runnable(),
                         ids=[f"{p}:{n}" for p, n, _ in _runnable()])
def test_runnable_snippet(page: str, line: int, code: str, database: str,
                          tmp_path: Path) -> None:
    migrate = subprocess.run([sys.executable, "-m", "drainer", "migrate"], env=_env(database),
                             capture_output=True, text=True, timeout=120)
    assert migrate.returncode == 0, migrate.stderr
    (tmp_path / "snippet.py").write_text(code)
    proc = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, env=_env(database),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{page}:{line}\n{proc.stdout}{proc.stderr}"


def test_psql_is_found() -> None:
    assert shutil.which(psql_binary()) or Path(psql_binary()).exists()
