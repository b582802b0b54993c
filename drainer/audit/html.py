"""``drainer audit --html FILE``: the audit window's timeline as one self-contained page.

One HTML file with inline CSS and inline SVG: no CDN, no script, nothing fetched. It
shows, along the sampled window, when the compute would be awake (activity plus the idle
timeout) and asleep, where it would suspend, each session's connected span and activity,
and which sessions or clients kept it awake, and why. ``bench/awake.py --html`` writes one
section per contender into the same kind of page.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from html import escape
from pathlib import Path

from drainer.audit.findings import AuditResult
from drainer.waking import fmt_seconds

#: Geometry of the SVG timeline (pixels).
WIDTH, LABEL_W, ROW_H, AXIS_H, BAND_H = 1100, 300, 22, 28, 30
#: Sessions drawn at most (those keeping the compute awake first).
MAX_ROWS = 60

#: The rules of a timeline section (:func:`render_section`), also on drainer ui's pages.
TIMELINE_CSS = """
.verdict{padding:8px 12px;border-radius:6px;margin:10px 0;font-weight:600}
.awake{background:#fde2e1;color:#8a1c17}.asleep{background:#e0f0e3;color:#17612a}
td.yes{color:#b3261e;font-weight:700}
.legend span{display:inline-block;margin-right:16px}
.sw{display:inline-block;width:12px;height:12px;vertical-align:-1px;margin-right:4px}
svg{border:1px solid #dde1e8;background:#fbfcfd;max-width:100%;height:auto}
code{font-size:12px}
"""

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;
color:#1d2330;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 6px}
table{border-collapse:collapse;margin-top:8px;font-size:13px}
th,td{border-bottom:1px solid #dde1e8;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f8}
""" + TIMELINE_CSS


def _t(iso: str | None) -> float | None:
    return None if iso is None else datetime.fromisoformat(iso).timestamp()


def awake_bands(result: AuditResult) -> list[tuple[float, float]]:
    """The window's awake spans (epoch seconds): each activity instant plus the idle
    timeout, merged and clipped to the window (all of it when the compute never sleeps)."""
    start, end = _t(result.started_at), _t(result.ended_at)
    assert start is not None and end is not None
    idle = result.idle_timeout_s
    if idle <= 0:
        return [(start, end)]
    bands: list[tuple[float, float]] = []
    for t in sorted(x for x in (_t(a) for a in result.activity_times) if x is not None):
        lo, hi = max(t, start), min(t + idle, end)
        if hi <= lo:
            continue
        if bands and lo <= bands[-1][1]:
            bands[-1] = (bands[-1][0], max(bands[-1][1], hi))
        else:
            bands.append((lo, hi))
    return bands


def suspensions(result: AuditResult) -> list[float]:
    """When the compute would suspend inside the window: the end of each awake band that
    ends before the window does (the idle timeout ran out with nothing new)."""
    end = _t(result.ended_at)
    assert end is not None
    if result.idle_timeout_s <= 0:
        return []
    return [hi for _lo, hi in awake_bands(result) if hi < end - 1e-6]


def _svg(result: AuditResult) -> str:
    start, end = _t(result.started_at), _t(result.ended_at)
    assert start is not None and end is not None
    span = max(end - start, 1e-6)
    plot_w = WIDTH - LABEL_W - 20

    def x(t: float) -> float:
        return LABEL_W + (min(max(t, start), end) - start) / span * plot_w

    sessions = sorted(result.sessions, key=lambda s: (not s.keeps_awake, s.first_seen))
    shown = sessions[:MAX_ROWS]
    unseen = result.unseen_connections
    rows = len(shown) + len(unseen)
    height = AXIS_H + BAND_H + 14 + rows * ROW_H + 16
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="awake timeline">']
    # the time axis: ten ticks, seconds from the start of the window
    for i in range(11):
        t = start + span * i / 10
        out.append(f'<line x1="{x(t):.1f}" y1="{AXIS_H - 6}" x2="{x(t):.1f}" y2="{height}" '
                   'stroke="#e6e9ef"/>')
        out.append(f'<text x="{x(t):.1f}" y="{AXIS_H - 10}" font-size="11" '
                   f'text-anchor="middle" fill="#5b6475">{fmt_seconds(t - start)}</text>')
    # the compute: asleep under everything, awake bands on top, suspensions marked
    y0 = AXIS_H
    out.append(f'<text x="8" y="{y0 + 20}" font-size="13" font-weight="600">compute '
               f'({fmt_seconds(result.idle_timeout_s)} idle timeout)</text>')
    out.append(f'<rect class="asleep-band" x="{LABEL_W}" y="{y0}" width="{plot_w}" '
               f'height="{BAND_H}" fill="#8fd19e"><title>asleep</title></rect>')
    for lo, hi in awake_bands(result):
        out.append(f'<rect class="awake-band" x="{x(lo):.1f}" y="{y0}" '
                   f'width="{max(x(hi) - x(lo), 1):.1f}" height="{BAND_H}" fill="#e8615a">'
                   f'<title>awake {fmt_seconds(hi - lo)}</title></rect>')
    for t in suspensions(result):
        out.append(f'<path class="suspension" d="M{x(t):.1f},{y0 + BAND_H + 12} '
                   f'l-6,-10 h12 z" fill="#1d2330"><title>would suspend at +'
                   f'{fmt_seconds(t - start)}</title></path>')
    # one row per session: its connected span, its activity instants
    y = y0 + BAND_H + 14
    for s in shown:
        colour = "#b3261e" if s.keeps_awake else "#4a6fa5"
        label = f"{s.pid} {s.application_name or s.backend_type}"[:40]
        out.append(f'<text x="8" y="{y + 15}" font-size="12" fill="{colour}">'
                   f'{escape(label)}</text>')
        first = _t(s.first_seen) or start
        last = _t(s.last_seen) or end
        out.append(f'<line x1="{x(first):.1f}" y1="{y + 11}" x2="{x(last):.1f}" '
                   f'y2="{y + 11}" stroke="{colour}" stroke-width="3" opacity="0.35">'
                   f'<title>{escape(s.reason)}</title></line>')
        for a in s.activity_times:
            ta = _t(a)
            if ta is not None and start <= ta <= end:
                out.append(f'<circle cx="{x(ta):.1f}" cy="{y + 11}" r="3.5" '
                           f'fill="{colour}"/>')
        y += ROW_H
    for u in unseen:
        colour = "#b3261e" if u.keeps_awake else "#7a7f8c"
        out.append(f'<text x="8" y="{y + 15}" font-size="12" fill="{colour}">'
                   f'{escape(u.database)}: short connections</text>')
        for a in u.counted_at:
            ta = _t(a)
            if ta is not None:
                out.append(f'<rect x="{x(ta) - 3:.1f}" y="{y + 7}" width="6" height="8" '
                           f'fill="{colour}"/>')
        y += ROW_H
    out.append("</svg>")
    return "\n".join(out)


def render_section(title: str, result: AuditResult) -> str:
    """One audit's section: its verdict, the timeline (inline SVG), who kept the compute
    awake and why, and the table of sessions."""
    bands = awake_bands(result)
    awake_s = sum(hi - lo for lo, hi in bands)
    start = _t(result.started_at) or 0.0
    sus = suspensions(result)
    keeping = [s for s in result.sessions if s.keeps_awake]
    rows = []
    for s in sorted(result.sessions, key=lambda s: (not s.keeps_awake, s.pid)):
        rows.append(
            f"<tr><td>{s.pid}</td><td>{escape(s.application_name or '')}</td>"
            f"<td>{escape(s.user or '')}</td><td>{escape(s.database or '')}</td>"
            f"<td>{escape(s.backend_type)}</td><td>{escape(s.state or '')}</td>"
            f"<td class=\"{'yes' if s.keeps_awake else 'no'}\">"
            f"{'YES' if s.keeps_awake else 'no'}</td><td>{escape(s.reason)}</td>"
            f"<td>{len(s.activity_times)}</td><td><code>{escape(s.query or '')}</code></td></tr>")
    for c in result.reconnecting_clients:
        rows.append(
            f"<tr><td>{len(c.pids)} pids</td><td>{escape(c.application_name or '')}</td>"
            f"<td>{escape(c.user or '')}</td><td>{escape(c.database or '')}</td>"
            f"<td>reconnecting client</td><td></td>"
            f"<td class=\"{'yes' if c.keeps_awake else 'no'}\">"
            f"{'YES' if c.keeps_awake else 'no'}</td><td>{escape(c.reason)}</td>"
            f"<td>{c.new_connections}</td><td></td></tr>")
    for u in result.unseen_connections:
        rows.append(
            f"<tr><td>-</td><td>(unseen)</td><td></td><td>{escape(u.database)}</td>"
            f"<td>short connections</td><td></td>"
            f"<td class=\"{'yes' if u.keeps_awake else 'no'}\">"
            f"{'YES' if u.keeps_awake else 'no'}</td><td>{escape(u.reason)}</td>"
            f"<td>{u.connections}</td><td></td></tr>")
    who = ("<ul>" + "".join(f"<li><b>{s.pid} {escape(s.application_name or s.backend_type)}"
                            f"</b> ({escape(s.user or '')}@{escape(s.database or '')}): "
                            f"{escape(s.reason)}</li>" for s in keeping)
           + "".join(f"<li><b>{escape(c.application_name or '?')}</b> reconnecting: "
                     f"{escape(c.reason)}</li>" for c in result.reconnecting_clients
                     if c.keeps_awake)
           + "".join(f"<li><b>short connections to {escape(u.database)}</b>: "
                     f"{escape(u.reason)}</li>" for u in result.unseen_connections
                     if u.keeps_awake)
           + "</ul>") if result.keeping_awake else "<p>Nothing kept the compute awake.</p>"
    sus_text = (", ".join(f"+{fmt_seconds(t - start)}" for t in sus) if sus else "none in "
                "the window")
    return f"""<section>
<h2>{escape(title)}</h2>
<p>{result.samples} samples of pg_stat_activity over {fmt_seconds(result.duration_s)}
({escape(result.started_at)} .. {escape(result.ended_at)}); idle timeout
{fmt_seconds(result.idle_timeout_s)} ({escape(result.idle_timeout_source)}).</p>
<div class="verdict {'asleep' if result.could_suspend else 'awake'}">{escape(result.verdict)}
</div>
<p>Awake {fmt_seconds(awake_s)} of {fmt_seconds(result.duration_s)}
({awake_s / max(result.duration_s, 1e-9) * 100:.0f}%); would suspend at: {sus_text}.</p>
<p class="legend"><span><i class="sw" style="background:#e8615a"></i>awake</span>
<span><i class="sw" style="background:#8fd19e"></i>asleep</span>
<span>&#9660; would suspend</span>
<span><i class="sw" style="background:#b3261e"></i>keeps it awake</span>
<span><i class="sw" style="background:#4a6fa5"></i>does not</span>
<span>dots: activity (a query ending, a new connection)</span></p>
{_svg(result)}
<h3>Who kept the compute awake, and why</h3>
{who}
<table><tr><th>PID</th><th>application</th><th>user</th><th>database</th><th>type</th>
<th>state</th><th>awake</th><th>why</th><th>activity</th><th>query</th></tr>
{''.join(rows)}
</table>
</section>"""


def render_html(sections: Sequence[tuple[str, AuditResult]], *,
                title: str = "drainer audit") -> str:
    """One self-contained page (inline CSS and SVG, no script) with a section per audit."""
    body = "\n".join(render_section(t, r) for t, r in sections)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>{_CSS}</style></head>
<body>
<h1>{escape(title)}</h1>
<p>What kept the database compute awake: the rules of a serverless compute's activity
monitor, applied to samples of pg_stat_activity (see "Postgres as a job queue: using FOR
UPDATE SKIP LOCKED correctly").</p>
{body}
</body></html>
"""


def write_html(path: str | Path, sections: Sequence[tuple[str, AuditResult]], *,
               title: str = "drainer audit") -> Path:
    """Write :func:`render_html` to ``path`` (UTF-8); return the path."""
    out = Path(path)
    out.write_text(render_html(sections, title=title), encoding="utf-8")
    return out
