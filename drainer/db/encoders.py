"""Parameters in the text form drainer's statements cast, and psycopg's ``%(name)s`` in libpq's
``$n`` form, for statements sent below psycopg's cursors."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

#: a psycopg ``%(name)s`` placeholder, or ``%%`` (a literal %)
PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


def positional(query: str) -> tuple[str, list[str]]:
    """A psycopg ``%(name)s`` query in libpq's ``$n`` form, and the names in ``$n`` order."""
    names: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(0) == "%%":
            return "%"
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    return PLACEHOLDER.sub(number, query), names


def ints_text(values: Sequence[int]) -> str:
    """An int[] parameter in PostgreSQL's text form (the statement casts it): a join, where
    psycopg's list dumper calls a dumper for every element (a completion of 1,000 jobs
    sends two of these and a results array)."""
    return "{" + ",".join(map(str, map(int, values))) + "}"


def texts_text(values: Sequence[str | None]) -> str:
    """A text (or jsonb) array parameter in PostgreSQL's text form."""
    def one(v: str | None) -> str:
        if v is None:
            return "NULL"
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "{" + ",".join(one(v) for v in values) + "}"


def results_text(results: Sequence[str | None] | None) -> str:
    """The results array of a completion in text form; empty when every result is None
    (unnest pads the shorter arrays with NULLs: the common case of handlers that return
    nothing sends two bytes, not a NULL a job)."""
    if results is None or all(r is None for r in results):
        return "{}"
    return texts_text(results)


def completion_params(ids: Sequence[int], fences: Sequence[int],
                       results: Sequence[str | None] | None, followups: str | None
                       ) -> dict[str, str]:
    """The parameters every completion statement takes (complete_many and the statements
    built on it): ids, fences and results as array text, the follow-ups as a JSON array."""
    return {"ids": ints_text(ids), "fences": ints_text(fences),
            "results": results_text(results), "followups": followups or "[]"}


def counts(value: Any) -> dict[str, int]:
    """A jsonb {queue: count} (NULL: none), in queue order."""
    return {str(k): int(v) for k, v in sorted((value or {}).items())}
