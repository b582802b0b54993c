"""CI installs the real components the suite runs against, and never passes by skipping them."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT, missing_component


def test_a_missing_component_skips_locally_and_fails_under_ci(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="pgbouncer is not installed"):
        missing_component("pgbouncer", "apt-get install pgbouncer")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="under CI=true this is a failure"):
        missing_component("pgbouncer", "apt-get install pgbouncer")


def test_ci_run_installs_the_components_once_and_quietly() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    for package in ("pgbouncer", "prometheus-pushgateway"):
        assert package in script
    assert script.count("apt-get update") == 1
    assert "apt-get install -y" in script and "--no-install-recommends" in script
    assert "</dev/null" in script  # no stdin in CI
