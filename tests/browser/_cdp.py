"""A headless Chromium driven through the DevTools protocol over a pipe
(``--remote-debugging-pipe``: JSON messages ended by NUL on file descriptors 3 and 4), so
the tests load pages, click and type as a person does, with no WebDriver and no package.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import subprocess
import time
from pathlib import Path
from typing import Any

from tests._chromium import CHROMIUM_FLAGS

#: Seconds a page load or a command may take.
TIMEOUT_S = 60.0


class BrowserError(AssertionError):
    pass


class Browser:
    """One Chromium process and one tab (a page target attached in flat mode)."""

    def __init__(self, binary: str, profile: Path, *, width: int = 1280,
                 height: int = 1000) -> None:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def on_fds_3_and_4() -> None:  # what --remote-debugging-pipe reads and writes
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, "--remote-debugging-pipe", f"--user-data-dir={profile}",
             f"--window-size={width},{height}", "--hide-scrollbars", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=on_fds_3_and_4, pass_fds=(3, 4))
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget",
                                 {"targetId": target, "flatten": True})["sessionId"]
        self.send("Page.enable")
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    # -- the protocol -------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_child], [], [], left)[0]:
                raise BrowserError("Chromium did not answer in time")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr \
                    else ""
                raise BrowserError(f"Chromium closed its pipe: {err[-2000:]}")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        message: dict[str, Any] = json.loads(raw)
        return message

    def call(self, method: str, params: dict[str, Any] | None = None, *,
             session: str | None = None) -> dict[str, Any]:
        """Send a command and wait for its answer (events that come first are kept)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method,
                                   "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            got = self._read_message(deadline)
            if got.get("id") == self._next_id:
                if "error" in got:
                    raise BrowserError(f"{method}: {got['error']}")
                result: dict[str, Any] = got.get("result", {})
                return result
            self.events.append(got)

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """A command to the tab."""
        return self.call(method, params, session=self.session)

    def wait_for(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    del self.events[:i + 1]
                    return event
            try:
                self.events.append(self._read_message(deadline))
            except BrowserError as exc:
                seen = [e.get("method") for e in self.events[-8:]]
                raise BrowserError(f"waiting for {method}: {exc}; last events {seen}"
                                   ) from None

    # -- what a person does -------------------------------------------------------------------
    def open(self, url: str) -> None:
        """Load ``url`` and wait until it has loaded."""
        self.events.clear()
        self.send("Page.navigate", {"url": url})
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        got = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in got:
            raise BrowserError(f"{expression}: {got['exceptionDetails']}")
        return got["result"].get("value")

    def text(self) -> str:
        """The page's visible text."""
        return str(self.evaluate("document.body.innerText"))

    def html(self) -> str:
        return str(self.evaluate("document.documentElement.outerHTML"))

    def url(self) -> str:
        return str(self.evaluate("location.href"))

    def _centre(self, selector: str) -> tuple[float, float]:
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            # the first box: a link wrapped over two lines has nothing at its centre
            " const r = e.getClientRects()[0] || e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        if box is None:
            raise BrowserError(f"no element {selector!r} on {self.url()}")
        return float(box[0]), float(box[1])

    def click(self, selector: str, *, navigates: bool = True) -> None:
        """Press and release the mouse on the element (a real click: the browser submits
        the form or follows the link); wait for the next page when it ``navigates``."""
        x, y = self._centre(selector)
        self.events.clear()
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y,
                                                   "button": "left", "clickCount": 1})
        if navigates:
            self.wait_for("Page.loadEventFired")

    def type_into(self, selector: str, text: str) -> None:
        """Click into a field and type ``text`` (as the keyboard would insert it)."""
        self.click(selector, navigates=False)
        self.send("Input.insertText", {"text": text})

    def screenshot(self, path: Path) -> bytes:
        data = base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"])
        path.write_bytes(data)
        return data

    def close(self) -> None:
        with contextlib.suppress(BrowserError, OSError):
            self.call("Browser.close")
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.proc.stderr:
            self.proc.stderr.close()
