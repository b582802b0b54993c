"""Headless Chromium for the tests that render drainer's pages (tests/unit/test_audit_html.py,
tests/browser/): where it is, its flags, and reading the PNG screenshots it takes."""

from __future__ import annotations

import shutil
import struct
import zlib

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]


def chromium() -> str | None:
    """The browser binary (Debian's /usr/bin/chromium; .ci/run installs it), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
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


def colour_counts(rows: list[bytes]) -> dict[bytes, int]:
    """How many pixels of each RGB colour."""
    counts: dict[bytes, int] = {}
    for line in rows:
        for j in range(0, len(line), 3):
            px = line[j:j + 3]
            counts[px] = counts.get(px, 0) + 1
    return counts
