"""``drainer audit --html``: one self-contained page with the window's timeline, parsed
with html.parser (tests/browser/ renders it in headless Chromium)."""

from __future__ import annotations

from html.parser import HTMLParser

from drainer.audit.html import awake_bands, render_html, suspensions
from tests._audit_window import T0, a_window


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
