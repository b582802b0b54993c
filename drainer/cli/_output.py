"""What the commands print (JSON, or text tables on a terminal), and the flag values they
parse themselves (durations, ids)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Container, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO, TypeVar, overload

from drainer.errors import ConfigError

T = TypeVar("T")

#: Where reports go while :func:`stdout_for_reports_only` holds stdout (None: sys.stdout).
_reports: TextIO | None = None

#: --json's help on the commands that print a table on a terminal.
JSON_HELP = ("Print one JSON object on stdout (the default when stdout is not a terminal; "
             "on a terminal the output is a readable table).")


def print_json(obj: Any) -> None:
    """One JSON object on one line of stdout (values JSON lacks as their str())."""
    out = _reports or sys.stdout
    out.write(json.dumps(obj, default=str) + "\n")
    out.flush()


@contextmanager
def stdout_for_reports_only() -> Iterator[None]:
    """While handlers run: stdout carries the reports only (:func:`print_json`), so that
    ``drainer run-once | jq`` reads JSON, and whatever else is written to stdout goes to
    stderr: a handler's ``print()`` (``sys.stdout`` is ``sys.stderr`` meanwhile), and what C
    code and child processes write to file descriptor 1 (a copy of descriptor 2 meanwhile;
    the reports go to a copy of the original when ``sys.stdout`` writes to it)."""
    global _reports
    original = sys.stdout
    original.flush()
    try:
        saved: int | None = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no descriptor 1 or 2: only the Python level
        saved = None
    kept: TextIO | None = None
    if saved is not None and _fileno(original) == 1:
        kept = open(saved, "w", encoding=original.encoding,  # noqa: SIM115
                    errors=original.errors, closefd=False)
    _reports = kept or original
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout = original
        _reports = None
        sys.stderr.flush()
        if kept is not None:
            kept.close()  # flushes; the descriptor is closed below
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def _fileno(stream: Any) -> int | None:
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture)
        return None


def wants_json(flag: bool) -> bool:
    """JSON with --json or when stdout is no terminal; a readable table on a terminal."""
    if flag:
        return True
    try:
        return not sys.stdout.isatty()
    except (AttributeError, ValueError):
        return True


def emit(obj: T, render: Callable[[T], str], *, as_json: bool) -> None:
    """``obj`` as JSON (see :func:`wants_json`), else as ``render(obj)`` text."""
    if wants_json(as_json):
        print_json(obj)
    else:
        sys.stdout.write(render(obj) + "\n")
        sys.stdout.flush()


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


@overload
def seconds_arg(flag: str, value: str) -> float: ...
@overload
def seconds_arg(flag: str, value: None) -> None: ...
@overload
def seconds_arg(flag: str, value: str | None) -> float | None: ...


def seconds_arg(flag: str, value: str | None) -> float | None:
    """A duration flag (``90``, ``30s``, ``15m``, ``12h``, ``7d``) in seconds; None stays.

    A value that is no duration is a ConfigError (exit 2) that names the flag; each
    command checks the range it accepts.
    """
    if value is None:
        return None
    from drainer.settings import parse_duration

    try:
        return float(parse_duration(value))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def positive_int(text: str) -> int:
    """argparse ``type=`` of ids and limits: a whole number, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


#: The largest job id (the id column is a bigint).
MAX_JOB_ID = 2**63 - 1


def job_id(text: str) -> int:
    """argparse ``type=`` of job ids: a whole number from 1 to 2^63-1 (a bigint)."""
    value = positive_int(text)
    if value > MAX_JOB_ID:
        raise argparse.ArgumentTypeError(f"out of range for a job id (at most {MAX_JOB_ID}): "
                                         f"{text}")
    return value


def queue_list(values: list[str] | None) -> list[str] | None:
    """Repeated and comma-separated --queue values as one list (None when none given)."""
    if not values:
        return None
    return [q.strip() for v in values for q in v.split(",") if q.strip()] or None
