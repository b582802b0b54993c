"""The documentation site builds with `mkdocs build --strict`: a broken link, a missing
anchor or a page left out of the navigation fails the suite."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.conftest import ROOT

DOCS = ROOT / "docs"


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in _nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in _nav_pages(value)]
    return []


def _config() -> dict[str, object]:
    # mkdocs.yml holds no custom tags: the safe loader reads it
    loaded = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_the_site_is_strict_and_every_page_is_in_the_navigation() -> None:
    config = _config()
    assert config["strict"] is True
    pages = _nav_pages(config["nav"])
    assert sorted(pages) == sorted(p.name for p in DOCS.glob("*.md"))
    for page in ("tutorial.md", "handlers.md", "producers.md", "waiting.md", "waking.md",
                 "operations.md", "configuration.md", "deploy.md", "guarantees.md",
                 "performance.md", "faq.md", "sources.md"):
        assert page in pages, page


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not re.search(r"^WARNING", proc.stderr, flags=re.M), proc.stderr
    for page in _nav_pages(_config()["nav"]):
        name = page.removesuffix(".md")
        built = site / ("index.html" if name == "index" else f"{name}/index.html")
        assert built.is_file(), built
    assert not list(site.rglob("*.py")), "docs/*.py are tools, not pages"
    print(f"mkdocs build --strict: {took:.1f} s")
