"""``drainer audit --html`` rendered in headless Chromium where it is installed (.ci/run
installs it), and the screenshot checked: not blank, awake and asleep bands drawn."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from drainer.audit.html import write_html
from tests._audit_window import a_window
from tests._chromium import CHROMIUM_FLAGS, chromium, colour_counts, png_pixels
from tests.conftest import missing_component

#: Where the rendered page's screenshot is kept, to look at after the run.
SCREENSHOT = Path(os.environ.get("DRAINER_AUDIT_SCREENSHOT", "/tmp/drainer-audit-html.png"))


def test_the_page_renders_in_headless_chromium(tmp_path: Path) -> None:
    browser = chromium()
    if browser is None:
        missing_component("Chromium", "apt-get install chromium")
    page = write_html(tmp_path / "audit.html", [("nightly", a_window())])
    SCREENSHOT.unlink(missing_ok=True)
    proc = subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                           "--window-size=1200,900", f"--screenshot={SCREENSHOT}",
                           page.as_uri()], capture_output=True, text=True, timeout=120)
    assert SCREENSHOT.is_file(), proc.stderr[-2000:]
    width, height, rows = png_pixels(SCREENSHOT.read_bytes())
    assert (width, height) == (1200, 900)
    colours = colour_counts(rows)
    assert len(colours) > 20, "blank screenshot"
    white = colours.get(b"\xff\xff\xff", 0)
    assert white < 0.97 * width * height, "blank screenshot"
    assert colours.get(bytes.fromhex("e8615a"), 0) > 500, "no awake band drawn"
    assert colours.get(bytes.fromhex("8fd19e"), 0) > 500, "no asleep band drawn"
