"""``drainer audit --html`` rendered in headless Chromium where it is installed (.ci/run
installs it), and the screenshot checked: not blank, awake and asleep bands drawn."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

from drainer.audit.html import write_html
from tests._audit_window import a_window
from tests.conftest import missing_component

#: Where the rendered page's screenshot is kept, to look at after the run.
SCREENSHOT = Path(os.environ.get("DRAINER_AUDIT_SCREENSHOT", "/tmp/drainer-audit-html.png"))
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the rows of an 8-bit RGB(A) PNG (enough for a screenshot)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride = zlib.decompress(idat), width * channels
    rows: list[bytes] = []
    prev = bytes(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 255
        prev = bytes(line)
        rows.append(b"".join(prev[j:j + 3] for j in range(0, stride, channels)))
    return width, height, rows


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def test_the_page_renders_in_headless_chromium(tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        missing_component("Chromium", "apt-get install chromium")
    page = write_html(tmp_path / "audit.html", [("nightly", a_window())])
    SCREENSHOT.unlink(missing_ok=True)
    proc = subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                           "--window-size=1200,900", f"--screenshot={SCREENSHOT}",
                           page.as_uri()], capture_output=True, text=True, timeout=120)
    assert SCREENSHOT.is_file(), proc.stderr[-2000:]
    width, height, rows = _png_pixels(SCREENSHOT.read_bytes())
    assert (width, height) == (1200, 900)
    colours: dict[bytes, int] = {}
    for line in rows:
        for j in range(0, len(line), 3):
            px = line[j:j + 3]
            colours[px] = colours.get(px, 0) + 1
    assert len(colours) > 20, "blank screenshot"
    white = colours.get(b"\xff\xff\xff", 0)
    assert white < 0.97 * width * height, "blank screenshot"
    assert colours.get(bytes.fromhex("e8615a"), 0) > 500, "no awake band drawn"
    assert colours.get(bytes.fromhex("8fd19e"), 0) > 500, "no asleep band drawn"
