"""enqueue_many's own COPY text for jobs due now: the bytes psycopg's ``write_row`` sends.

It is kept for the producer's CPU: one JSON encoder serves the batch and no per-field
dumper is called. ``python -m bench.copy_text`` puts it beside ``write_row`` with Jsonb on
the same rows and exits 1 when it no longer saves a third of write_row's client CPU on small
payloads. A row it cannot format exactly so (a queue that is not a plain str, a priority
that is not an int, ...), and a connection with its own JSON dumps or another encoding, go
through ``write_row``, with psycopg's own checks and errors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, islice
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any

from psycopg.pq import Format
from psycopg.types.json import Jsonb

if TYPE_CHECKING:
    import psycopg

    from drainer.producer._spec import JobSpec

#: The columns of the COPY of jobs due now (run_at and dedup_key take their defaults).
NOW_TYPES = ("text", "jsonb", "int4", "int4")

# COPY's text format: the characters psycopg escapes in a field, and how.
_COPY_SPECIAL = re.compile(r"[\b\t\n\v\f\r\\]")
_COPY_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v", "\f": "\\f",
                 "\r": "\\r", "\\": "\\\\"}

#: Rows joined into one copy.write(): bounds the text held at once.
CHUNK_ROWS = 256

_PSYCOPG_MODULES = ("psycopg.", "psycopg_c.", "psycopg_binary.")


def stock_text_copy(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether psycopg would write the rows as this module does.

    True with psycopg's own dumpers for text and int4, ``json.dumps`` for jsonb (not a
    function set with ``set_json_dumps``) and a UTF-8 connection; otherwise the rows go
    through ``write_row``.
    """
    if cur.connection.info.encoding != "utf-8":
        return False
    adapters = cur.adapters
    for name in ("text", "int4", "jsonb"):
        info = adapters.types.get(name)
        if info is None:
            return False
        dumper = adapters.get_dumper_by_oid(info.oid, Format.TEXT)
        if not dumper.__module__.startswith(_PSYCOPG_MODULES):
            return False
        if name == "jsonb" and getattr(dumper(object, cur), "dumps", None) is not json.dumps:
            return False
    return True


def json_encoder() -> Callable[[Any], str]:
    """``json.dumps(obj)`` (every option at its default), with one encoder per batch.

    ``json.dumps`` builds the C encoder again for every call, most of its time on a small
    payload: this builds it once, with the arguments ``JSONEncoder().encode`` gives it.
    The circular-reference markers start empty for each batch.
    """
    encoder = json.JSONEncoder()
    try:
        from _json import make_encoder
    except ImportError:  # no C accelerator
        return encoder.encode
    encode = make_encoder({}, encoder.default, encode_basestring_ascii, None,
                          encoder.key_separator, encoder.item_separator, False, False, True)
    return lambda obj: "".join(encode(obj, 0))


class NowText:
    """The (queue, payload, priority, max_attempts) rows of jobs due now, for one COPY.

    Iterating yields the COPY text ``write_row`` would send for them, in chunks of
    ``CHUNK_ROWS`` rows, up to the first row this module cannot format exactly so (all of
    them with ``text=False``); :meth:`rows` then gives that row and the rest, for
    ``write_row``. ``written`` counts the rows of both.
    """

    __slots__ = ("specs", "stopped", "text", "written")

    def __init__(self, specs: Iterable[JobSpec], text: bool) -> None:
        self.specs = iter(specs)  # one iterator: each chunk goes on where the last stopped
        self.text = text
        self.written = 0
        self.stopped: JobSpec | None = None

    def __iter__(self) -> Iterator[str]:
        if not self.text:
            return
        dumps = json_encoder()
        fields: dict[str, str | None] = {}  # queue -> queue_field(queue)
        specs = self.specs
        while True:
            lines: list[str] = []
            append = lines.append
            for s in islice(specs, CHUNK_ROWS):
                queue, priority, max_attempts = s.queue, s.priority, s.max_attempts
                field = None
                if type(queue) is str:
                    field = fields.get(queue)
                    if field is None:
                        field = fields[queue] = queue_field(queue)
                if (field is None or type(priority) is not int
                        or type(max_attempts) is not int):
                    self.stopped = s
                    if lines:
                        self.written += len(lines)
                        yield "".join(lines)
                    return
                payload = dumps(s.payload)
                if "\\" in payload:  # json.dumps writes ASCII, no control characters: only \
                    payload = payload.replace("\\", "\\\\")
                append(f"{field}{payload}\t{priority}\t{max_attempts}\n")
            if not lines:
                return
            self.written += len(lines)
            yield "".join(lines)

    def rows(self) -> Iterator[tuple[Any, ...]]:
        """The rows the text did not take, for ``write_row`` (read once the text is sent)."""
        rest = self.specs if self.stopped is None else chain((self.stopped,), self.specs)
        for s in rest:
            self.written += 1
            yield (s.queue, Jsonb(s.payload), s.priority, s.max_attempts)


class Payloads:
    """The COPY text of payloads on one queue, due now: the bytes :class:`NowText` (and so
    ``write_row``) would send for ``JobSpec(queue, p, priority=..., max_attempts=...)``, in
    chunks of ``CHUNK_ROWS``, with no JobSpec built. ``head`` (the queue's field, see
    :func:`queue_field`) and ``tail`` (the priority and max_attempts fields) are the same on
    every row: only the payload is formatted. ``written`` counts the rows yielded so far.
    """

    __slots__ = ("head", "payloads", "tail", "written")

    def __init__(self, head: str, tail: str, payloads: Iterator[Any]) -> None:
        self.head = head
        self.tail = tail
        self.payloads = payloads
        self.written = 0

    def __iter__(self) -> Iterator[str]:
        dumps = json_encoder()
        head, tail = self.head, self.tail
        sep = tail + head
        payloads = self.payloads
        while True:
            texts: list[str] = []
            append = texts.append
            for p in islice(payloads, CHUNK_ROWS):
                text = dumps(p)
                if "\\" in text:  # json.dumps writes ASCII, no control characters: only \
                    text = text.replace("\\", "\\\\")
                append(text)
            if not texts:
                return
            self.written += len(texts)
            yield head + sep.join(texts) + tail


def queue_field(queue: str) -> str | None:
    """The queue's COPY text field and a tab; None when psycopg must format it."""
    if "\x00" in queue:
        return None  # psycopg raises its own error
    try:
        queue.encode()
    except UnicodeEncodeError:  # a lone surrogate: let psycopg raise its error
        return None
    return _COPY_SPECIAL.sub(lambda m: _COPY_ESCAPES[m.group()], queue) + "\t"
