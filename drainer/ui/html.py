"""The dashboard's HTML: escaping, the page frame (navigation, when the database was read,
auto-refresh), tables and times. Inline CSS, no script, nothing fetched from anywhere.

Everything a page shows that came from the database or the request (payloads, errors,
queue names, run ids) goes through :func:`h`, which escapes it; only :class:`Safe` strings,
built here from escaped parts, pass as they are.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timezone
from html import escape
from typing import TYPE_CHECKING, Any, Protocol

from drainer.audit.html import TIMELINE_CSS

if TYPE_CHECKING:
    from drainer.ui.data import JobFilter, Read

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;
color:#1d2330;background:#fff}
header{background:#1d2330;color:#fff;padding:10px 24px;display:flex;gap:18px;
align-items:baseline;flex-wrap:wrap}
header b{font-size:17px;margin-right:8px}header a{color:#cfd8ea;text-decoration:none}
header a.here{color:#fff;font-weight:700;border-bottom:2px solid #8fd19e}
main{padding:12px 24px 40px}h1{font-size:21px;margin:10px 0 6px}h2{font-size:17px;margin:22px 0 6px}
.read{color:#5b6475;font-size:12.5px;margin:0 0 10px}
table{border-collapse:collapse;margin-top:6px;font-size:13px}
th,td{border-bottom:1px solid #dde1e8;padding:4px 9px;text-align:left;vertical-align:top}
th{background:#f3f5f8}td.n{text-align:right;font-variant-numeric:tabular-nums}
.pill{display:inline-block;padding:0 7px;border-radius:9px;font-size:12px;font-weight:600}
.queued{background:#e4ecfb;color:#234a8a}.running{background:#fff1d6;color:#7a4d00}
.done{background:#e0f0e3;color:#17612a}.failed{background:#fde2e1;color:#8a1c17}
.paused{background:#ece4fb;color:#4b2a8a}.cancelled{background:#eceef1;color:#4a5260}
pre{background:#f6f8fa;border:1px solid #dde1e8;padding:8px 10px;overflow:auto;
max-height:420px;font-size:12.5px;white-space:pre-wrap;word-break:break-word}
dl{display:grid;grid-template-columns:max-content 1fr;gap:3px 16px;margin:6px 0}
dt{color:#5b6475}dd{margin:0}
form.inline{display:inline}button{font:inherit;padding:2px 10px;cursor:pointer}
.note{background:#fff8e1;border:1px solid #f0d58c;padding:6px 10px;border-radius:5px;
margin:8px 0}.bad{background:#fde2e1;border-color:#f1a9a5}
.filters input{width:10em}.muted{color:#5b6475}a{color:#1f5fbf}
""" + TIMELINE_CSS


class Safe(str):
    """HTML built from escaped parts: :func:`h` passes it as it is."""


def h(value: Any) -> Safe:
    """``value`` as HTML text: escaped (quotes too), unless it is :class:`Safe`; None: -."""
    if isinstance(value, Safe):
        return value
    return Safe(escape("-" if value is None else str(value), quote=True))


def join(parts: Iterable[Any], sep: str = "") -> Safe:
    """The parts, each escaped unless Safe, the empty ones left out."""
    return Safe(sep.join(h(p) for p in parts if p is not None and p != ""))


def tag(name: str, content: Any, **attrs: Any) -> Safe:
    """``<name attr="...">content</name>``; attribute values escaped, ``class_`` -> class."""
    attr = "".join(f' {k.rstrip("_").replace("_", "-")}="{h(v)}"' for k, v in attrs.items()
                   if v is not None)
    return Safe(f"<{name}{attr}>{h(content)}</{name}>")


def link(href: str | None, text: Any) -> Safe:
    """A link, or the text alone where the page does not exist (a static site)."""
    return h(text) if href is None else tag("a", text, href=href)


def pill(status: str) -> Safe:
    return tag("span", status, class_=f"pill {status}")


def pre_json(value: Any) -> Safe:
    return tag("pre", json.dumps(value, indent=2, ensure_ascii=False, default=str))


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *,
          numeric: Iterable[int] = ()) -> Safe:
    nums = set(numeric)
    head = "".join(f"<th>{h(x)}</th>" for x in headers)
    body = "".join("<tr>" + "".join(
        f'<td{" class=n" if i in nums else ""}>{h(c)}</td>' for i, c in enumerate(r))
        + "</tr>" for r in rows)
    if not body:
        body = f'<tr><td colspan="{len(headers)}" class="muted">(none)</td></tr>'
    return Safe(f"<table><tr>{head}</tr>{body}</table>")


def dl(items: Iterable[tuple[str, Any]]) -> Safe:
    return Safe("<dl>" + "".join(f"<dt>{h(k)}</dt><dd>{h(v)}</dd>" for k, v in items)
                + "</dl>")


#: Whether times are shown with how long ago they were: not on a static page, which is
#: read long after it was written.
relative_times: ContextVar[bool] = ContextVar("relative_times", default=True)


def when(value: datetime | str | None, now: datetime | None = None) -> Safe:
    """``2026-11-30 12:00:03Z`` with how long ago or ahead (``-`` for None)."""
    if value is None:
        return h(None)
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    text = value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    if not relative_times.get():
        return h(text)
    delta = (value - (now or datetime.now(timezone.utc))).total_seconds()
    return join([text, Safe(f' <span class="muted">({h(ago(delta))})</span>')])


def ago(delta_s: float) -> str:
    """-90 -> '2 min ago', 30 -> 'in 30 s'."""
    n = abs(delta_s)
    amount = (f"{n:.0f} s" if n < 90 else f"{n / 60:.0f} min" if n < 5400
              else f"{n / 3600:.1f} h" if n < 172800 else f"{n / 86400:.0f} d")
    return f"in {amount}" if delta_s > 0 else f"{amount} ago"


def size(n: int | None) -> str:
    """Bytes as kB, MB, GB."""
    if n is None:
        return "-"
    value, unit = float(n), "B"
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            break
        value /= 1024
    return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f} s" if value < 90 else f"{value / 60:.0f} min" if value < 5400 \
        else f"{value / 3600:.1f} h"


class Links(Protocol):
    """Where each page is: paths of the server, or file names of a static site (None: the
    static site has no such page)."""

    def queues(self) -> str: ...
    def jobs(self, f: JobFilter) -> str | None: ...
    def job(self, job_id: int) -> str | None: ...
    def runs(self, page: int = 1) -> str | None: ...
    def run(self, run_id: str) -> str | None: ...
    def recurring(self) -> str: ...
    def awake(self) -> str: ...


@dataclass
class Frame:
    """What every page around its body needs: links, who looks, the refresh state."""

    links: Links
    static: bool = False
    #: actions: "on" (signed in), "sign-in" (a token is set: sign in first), or why not
    actions: str = "off"
    csrf: str | None = None
    refresh_s: float | None = None
    refresh_note: str | None = None
    #: (label, href) of the auto-refresh choices (the first turns it off)
    refresh_choices: list[tuple[str, str]] = field(default_factory=list)
    #: (title, href) of pages added beside the built-in ones (the fleet view)
    extra_nav: list[tuple[str, str]] = field(default_factory=list)
    signed_in: bool = False
    view_needs_token: bool = False


NAV = (("Queues", "queues"), ("Jobs", "jobs"), ("Runs", "runs"), ("Recurring", "recurring"),
       ("Awake", "awake"))


def _nav(frame: Frame, here: str) -> Safe:
    from drainer.ui.data import JobFilter

    targets = {"queues": frame.links.queues(), "jobs": frame.links.jobs(JobFilter()),
               "runs": frame.links.runs(), "recurring": frame.links.recurring(),
               "awake": frame.links.awake()}
    items = [tag("a", title, href=targets[key], class_="here" if key == here else None)
             for title, key in NAV if targets[key] is not None]
    items += [tag("a", title, href=href) for title, href in frame.extra_nav]
    if not frame.static and frame.signed_in:
        items.append(Safe('<form class="inline" method="post" action="/logout">'
                          f'<input type="hidden" name="csrf" value="{h(frame.csrf)}">'
                          '<button>sign out</button></form>'))
    elif not frame.static and frame.actions == "sign-in":
        items.append(tag("a", "sign in", href="/login"))
    return Safe("<header><b>drainer</b>" + "".join(items) + "</header>")


def read_line(read: Read, frame: Frame) -> Safe:
    """When the page read the database, and the auto-refresh state and choices."""
    if read.at is None:
        text = h("This page did not read the database.")
    else:
        text = h(f"Read the database at {read.at:%Y-%m-%d %H:%M:%S}Z: one connection, open "
                 f"{read.held_s * 1000:.0f} ms, closed before this page was "
                 f"{'written' if frame.static else 'sent'}.")
    if frame.static:
        return Safe(f'<p class="read">{text} A static page: it reads nothing when '
                    "opened.</p>")
    state = ("Auto-refresh off (no reads while nobody looks)." if frame.refresh_s is None
             else f"Auto-refresh every {seconds(frame.refresh_s)}.")
    choices = join((link(href, label) for label, href in frame.refresh_choices), " · ")
    note = f' <span class="note">{h(frame.refresh_note)}</span>' if frame.refresh_note else ""
    return Safe(f'<p class="read">{text} {h(state)} {choices}{note}</p>')


def page(frame: Frame, here: str, title: str, body: Safe, read: Read) -> str:
    """The whole document of one page."""
    refresh = ("" if frame.static or frame.refresh_s is None
               else f'<meta http-equiv="refresh" content="{frame.refresh_s:.0f}">')
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="same-origin">{refresh}
<title>{h(title)} · drainer</title>
<style>{CSS}</style></head>
<body>
{_nav(frame, here)}
<main>
<h1>{h(title)}</h1>
{read_line(read, frame)}
{body}
</main>
</body></html>
"""
