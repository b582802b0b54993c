"""Logs on stderr: JSON lines when piped, readable text on a terminal."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from typing import Any, TextIO

from drainer._redact import redact

#: LogRecord attributes that are not extra fields.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts, level, logger, msg, and every ``extra=`` field."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """``HH:MM:SS level message key=value ...`` for people."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        # an extra the message already says (the error of "job 9 failed: ...") is not
        # repeated: text logs print the error once
        extras = " ".join(
            f"{k}={v}" for k, v in vars(record).items()
            if k not in _STANDARD and not k.startswith("_")
            and not (len(str(v)) >= 8 and str(v) in message)
        )
        line = (
            f"{time.strftime('%H:%M:%S', time.localtime(record.created))} "
            f"{record.levelname.lower():7s} {message}"
        )
        if extras:
            line += f"  {extras}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return redact(line)


class _TerminalHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Clears the live progress line (drainer/cli/_progress.py) before writing a log line."""

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.write("\r\x1b[K")
        super().emit(record)


def setup_logging(level: str = "INFO", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Send drainer's logs to stderr in the chosen format (auto: text on a TTY)."""
    stream = stream or sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not stream.isatty())
    handler = (logging.StreamHandler(stream) if use_json or not is_tty(stream)
               else _TerminalHandler(stream))
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    root = logging.getLogger("drainer")
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False


def is_tty(stream: TextIO | None = None) -> bool:
    stream = stream or sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
