"""Loaders that never fail a whole result for one row the client cannot represent.

A plain-SQL insert may store what PostgreSQL accepts and Python cannot load: a jsonb
payload nested deeper than ``json.loads`` recurses, a timestamptz of ``'-infinity'`` or
past the year 9999. psycopg raises while decoding the row, which would fail the claim of
the whole batch (and every later drain of the queue) and the ops commands that list it.
These loaders turn such a value into something the caller can act on: the drain fails that
one job with a clear error, ``drainer show`` prints it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import psycopg
from psycopg.abc import AdaptContext
from psycopg.adapt import AdaptersMap, Buffer, Loader
from psycopg.pq import Format
from psycopg.types.datetime import TimestamptzBinaryLoader, TimestamptzLoader
from psycopg.types.json import JsonbBinaryLoader, JsonbLoader

#: Where a timestamptz before year 1 ('-infinity', BC dates) or after 9999 ('infinity')
#: lands: the earliest and latest instants Python can hold, so order is kept.
TIME_MIN = datetime.min.replace(tzinfo=timezone.utc)
TIME_MAX = datetime.max.replace(tzinfo=timezone.utc)


class UndecodablePayload(str):
    """A payload PostgreSQL stored that the client could not decode.

    A ``str`` (so JSON output shows it) reading ``<undecodable payload: ...>``; ``error``
    is the decoder's one-line error.
    """

    error: str

    def __new__(cls, error: str) -> UndecodablePayload:
        self = super().__new__(cls, f"<undecodable payload: {error}>")
        self.error = error
        return self


_decode = json.JSONDecoder().decode


def _undecodable(exc: BaseException) -> UndecodablePayload:
    message = str(exc).splitlines()[0] if str(exc) else ""
    return UndecodablePayload(f"{type(exc).__name__}: {message}"[:500])


class SafeJsonbLoader(JsonbLoader):
    def load(self, data: Buffer) -> Any:
        try:
            if self.loads is json.loads:  # psycopg's default: the text is UTF-8, no BOM
                return _decode(str(data, "utf-8"))  # half the cost of json.loads(bytes)
            return super().load(data)
        except (ValueError, RecursionError, MemoryError) as exc:
            return _undecodable(exc)


class SafeJsonbBinaryLoader(JsonbBinaryLoader):
    def load(self, data: Buffer) -> Any:
        try:
            return super().load(data)
        except (ValueError, RecursionError, MemoryError) as exc:
            return _undecodable(exc)



def _fast(cls: type[Loader], fmt: Format, oid: int, context: AdaptContext | None
          ) -> Callable[[Buffer], Any]:
    """The ``load`` of psycopg's own loader for ``oid`` (its C one where psycopg has its C
    implementation: about ten times faster than the Python one a subclass inherits, and a
    claim decodes two timestamptz a row), ``cls``'s own where it has none."""
    fast = psycopg.adapters.get_loader(oid, fmt)
    return (fast or cls)(oid, context).load


class SafeTimestamptzLoader(TimestamptzLoader):
    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        self._load = _fast(TimestamptzLoader, Format.TEXT, oid, context)

    def load(self, data: Buffer) -> datetime:
        try:
            return self._load(data)  # type: ignore[no-any-return]
        except psycopg.DataError:
            text = bytes(data)
            return TIME_MIN if text.startswith(b"-") or text.endswith(b"BC") else TIME_MAX


class SafeTimestamptzBinaryLoader(TimestamptzBinaryLoader):
    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        self._load = _fast(TimestamptzBinaryLoader, Format.BINARY, oid, context)

    def load(self, data: Buffer) -> datetime:
        try:
            return self._load(data)  # type: ignore[no-any-return]
        except psycopg.DataError:
            # binary: microseconds since 2000-01-01 as a signed 64-bit integer
            return TIME_MIN if bytes(data)[:1] >= b"\x80" else TIME_MAX


def register_safe_loaders(adapters: AdaptersMap) -> None:
    """Use the loaders above for jsonb and timestamptz on a connection (or its context)."""
    adapters.register_loader("jsonb", SafeJsonbLoader)
    adapters.register_loader("jsonb", SafeJsonbBinaryLoader)
    adapters.register_loader("timestamptz", SafeTimestamptzLoader)
    adapters.register_loader("timestamptz", SafeTimestamptzBinaryLoader)
