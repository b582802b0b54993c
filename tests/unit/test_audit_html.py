"""``drainer audit --html``: one self-contained page with the window's timeline. Parsed
everywhere (html.parser); rendered in headless Chromium where it is installed (.ci/run
installs it), and the screenshot checked: not blank, awake and asleep bands drawn."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path

from drainer.audit import Activity, AuditResult, Sample, SessionFilter, SessionRow, judge
from drainer.audit.html import awake_bands, render_html, suspensions, write_html
from drainer.waking import IdleTimeout
from tests._chromium import CHROMIUM_FLAGS, chromium, colour_counts, png_pixels
from tests.conftest import missing_component

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
IDLE = IdleTimeout(10.0, "--idle-timeout")
#: Where the rendered page's screenshot is kept (the issue's closing note shows it).
SCREENSHOT = Path(os.environ.get("DRAINER_AUDIT_SCREENSHOT", "/tmp/drainer-audit-html.png"))


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def _row(pid: int, changed: float, *, app: str = "app", state: str = "idle",
         started: float = -7200.0) -> SessionRow:
    return SessionRow(pid, at(started), "client backend", "db", "alice", app, "10.0.0.5",
                      state, at(changed), at(changed - 0.01), None, "SELECT 1")


def a_window() -> AuditResult:
    """60 s, idle timeout 10 s: a query at 5 s, a poller every second from 20 s to 30 s,
    an idle pool connection throughout: awake 5-15 s and 20-40 s, asleep otherwise."""
    samples = []
    for i in range(121):
        t = i * 0.5
        last = 5.0 if t >= 5 else -3600.0
        rows = [_row(1, last, app="report <cron>"), _row(2, -3600.0, app="pool")]
        if 20 <= t <= 30:
            rows.append(_row(3, float(int(t)) + 0.01, app="poller", started=19.9))
        samples.append(Sample(at(t), tuple(rows)))
    return judge(Activity(samples, samples[0].at, samples[-1].at, 0.5, SessionFilter()),
                 IDLE)


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_bands_and_suspensions() -> None:
    r = a_window()
    bands = [(round(lo - T0.timestamp(), 1), round(hi - T0.timestamp(), 1))
             for lo, hi in awake_bands(r)]
    assert bands == [(5.0, 15.0), (19.9, 40.0)], bands
    assert [round(t - T0.timestamp(), 1) for t in suspensions(r)] == [15.0, 40.0]


def test_the_page_is_self_contained_and_has_the_timeline() -> None:
    page = render_html([("nightly", a_window())])
    p = _Collect()
    p.feed(page)
    p.close()
    tags = [t for t, _ in p.tags]
    assert tags.count("svg") == 1 and "script" not in tags
    for _tag, attrs in p.tags:  # nothing fetched from anywhere
        for key in ("src", "href"):
            assert not (attrs.get(key) or "").startswith(("http", "//")), attrs
    assert "link" not in tags and "@import" not in page
    classes = [a.get("class") for _t, a in p.tags]
    assert classes.count("awake-band") == 2 and classes.count("asleep-band") == 1
    assert classes.count("suspension") == 2
    text = " ".join("".join(p.text).split())
    assert "Who kept the compute awake, and why" in text
    assert "poller" in text and "report <cron>" in text  # escaped, shown as text
    # the headline is the 60 s window's, not the pool's hour of quiet before it
    assert "could suspend: quiet for 30 s of the 60 s window (12:00:30 .. 12:01:00)" in text
    assert "60.1 min" not in text
    assert "Postgres as a job queue: using FOR UPDATE SKIP LOCKED correctly" in text


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
