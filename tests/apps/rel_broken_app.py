"""An app module that fails while it is imported (the bad-input tests use it)."""

from __future__ import annotations

raise RuntimeError("rel_broken_app refuses to load")
