"""Fixtures of the deploy tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _no_ambient_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Manifests' arguments are read as in the container: no DRAINER_* from this shell."""
    for name in list(os.environ):
        if name.startswith("DRAINER_") or name == "DATABASE_URL":
            monkeypatch.delenv(name)
    monkeypatch.setenv("DRAINER_PYPROJECT", str(tmp_path / "none.toml"))
