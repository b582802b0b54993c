"""Loading the app module that registers the handlers, with a hint on what went wrong."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import traceback

from drainer.errors import ConfigError

logger = logging.getLogger(__name__)


def load_app(module: str) -> None:
    """Import the app module that registers handlers; ConfigError (exit 2) on failure."""
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: the current directory is importable
    try:
        importlib.import_module(module)
    except Exception as exc:
        logger.debug("cannot import app module %r", module, exc_info=exc)
        detail = " ".join(str(exc).split()) or type(exc).__name__
        where = _where_it_failed(exc)
        raise ConfigError(
            f"cannot import app module {module!r}: {where}{type(exc).__name__}: {detail}"
            f"{_module_hint(module, exc)}"
        ) from None


def _module_hint(module: str, exc: Exception) -> str:
    """A file path given where a module name goes (``--app tasks.py``): say so."""
    if not (module.endswith(".py") or "/" in module or "\\" in module):
        return ""
    if isinstance(exc, ModuleNotFoundError) and exc.name and not module.startswith(exc.name):
        return ""  # a dependency of the app is missing, not the app itself
    parts = module.removesuffix(".py").replace("\\", "/").split("/")
    name = ".".join(p for p in parts if p not in ("", ".", ".."))
    return f" (--app takes a module name, as `python -m` does: {name!r}, not a file path)"


#: drainer's own source: a check that raises in it (a bad cron in ``@task(cron=...)``) is
#: about the app's line that called it, the last frame outside.
_DRAINER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _where_it_failed(exc: BaseException) -> str:
    """``file:line: `` of the app's line that raised (importlib's frames and drainer's own
    skipped: ``@task(cron=...)`` raises in drainer, the mistake is on the app's line), or
    ''."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        path, line = exc.filename, exc.lineno
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if not f.filename.startswith("<") and "importlib" not in f.filename
                  and f.filename != __file__]
        outside = [f for f in frames if not os.path.abspath(f.filename).startswith(_DRAINER_DIR)]
        frames = outside or frames
        if not frames or frames[-1].lineno is None:
            return ""
        path, line = frames[-1].filename, frames[-1].lineno
    try:
        rel = os.path.relpath(path)
        path = rel if not rel.startswith("..") else path
    except ValueError:  # another drive (Windows)
        pass
    return f"{path}:{line}: "
