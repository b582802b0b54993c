"""Plain-text helpers of the library's renderers: ISO times and aligned tables."""

from __future__ import annotations

from collections.abc import Container, Sequence
from datetime import date, datetime
from typing import Any


def iso(value: Any) -> Any:
    """A datetime (or date) as ISO 8601 text; anything else (None included) unchanged."""
    return value.isoformat() if isinstance(value, datetime | date) else value


def text_table(rows: Sequence[Sequence[str]], *, right: Container[int] = (),
               caps: Sequence[int] | None = None) -> list[str]:
    """``rows`` (the first is the header) as lines of columns two spaces apart.

    Columns are left-aligned, those whose index is in ``right`` right-aligned; with
    ``caps``, a cell longer than its column's cap is cut and ends with an ellipsis.
    """
    if not rows:
        return []
    cells = [list(r) for r in rows]
    if caps is not None:
        cells = [[c if len(c) <= cap else c[: cap - 1] + "…"
                  for c, cap in zip(r, caps, strict=True)] for r in cells]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w)
                      for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
            for r in cells]
