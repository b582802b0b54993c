"""Times as the text the library's reports carry (ISO 8601), so they print as JSON."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any


def iso(value: Any) -> Any:
    """A datetime (or date) as ISO 8601 text; anything else (None included) unchanged."""
    return value.isoformat() if isinstance(value, datetime | date) else value
