"""The browser tier: ``drainer ui`` as users run it (the real command, as a subprocess), on
a database of its own holding the ~200-job demo, looked at in headless Chromium."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from tests._chromium import chromium, colour_counts, png_pixels
from tests.acceptance._proc import DrainerProcess
from tests.browser._cdp import Browser
from tests.browser._demo import Demo, build_demo
from tests.conftest import make_settings, missing_component

#: Where the screenshots are left for a person to look at.
SHOTS = Path(os.environ.get("DRAINER_UI_SCREENSHOTS", "/tmp/ui-shots"))
#: The UI token of the tier's servers.
TOKEN = "tier-token-" + uuid.uuid4().hex[:12]
SCHEMA = "drainer"
WIDTH, HEIGHT = 1280, 1000


@pytest.fixture(scope="module")
def demo_url(pg_url: str) -> Iterator[str]:
    """A database of the module's own (so that its session and transaction counters count
    the dashboard's connections only), with the demo in schema ``drainer``."""
    name = f"ui_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = urlunsplit(urlsplit(pg_url)._replace(path=f"/{name}"))
    yield url
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))


@pytest.fixture(scope="module")
def demo(demo_url: str) -> Demo:
    return build_demo(make_settings(demo_url, SCHEMA))


@pytest.fixture(scope="module")
def chromium_binary() -> str:
    found = chromium()
    if found is None:
        missing_component("Chromium", "apt-get install chromium")
    return found


def start_ui(url: str, *args: str, token: str | None = TOKEN) -> tuple[DrainerProcess, str]:
    """``drainer ui --port 0 ARGS`` on ``url``; the process and its base URL."""
    env = {"DRAINER_UI_TOKEN": token} if token else {}
    proc = DrainerProcess(["ui", "--port", "0", *args], pg_url=url, schema=SCHEMA, **env)
    rec = proc.wait_log("listening on", timeout=30)
    return proc, f"http://127.0.0.1:{rec['port']}"


def stop_ui(proc: DrainerProcess) -> None:
    """SIGTERM: it stops at once, exit 0."""
    try:
        code = proc.terminate()
    finally:
        proc.kill()
    assert code == 0, proc.stderr()


@pytest.fixture
def ui(demo: Demo, demo_url: str) -> Iterator[str]:
    """The base URL of a ``drainer ui`` with the tier's token."""
    proc, base = start_ui(demo_url)
    yield base
    stop_ui(proc)


@pytest.fixture
def browser(chromium_binary: str, tmp_path: Path) -> Iterator[Browser]:
    b = Browser(chromium_binary, tmp_path / "profile", width=WIDTH, height=HEIGHT)
    yield b
    b.close()


def shot(browser: Browser, name: str) -> Path:
    """Screenshot the tab into SHOTS/name.png and check it is a real render: the viewport's
    size, many colours, not all white."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    width, height, rows = png_pixels(browser.screenshot(path))
    assert (width, height) == (WIDTH, HEIGHT), (width, height)
    colours = colour_counts(rows)
    assert len(colours) > 30, f"{name}: blank screenshot ({len(colours)} colours)"
    assert colours.get(b"\xff\xff\xff", 0) < 0.97 * width * height, f"{name}: blank"
    assert colours.get(bytes.fromhex("1d2330"), 0) > 10_000, f"{name}: no header drawn"
    return path


def jobs_table(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql.SQL(query).format(sql.Identifier(SCHEMA, "jobs")),
                            params).fetchall()
