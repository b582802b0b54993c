"""``python -m bench.plots RESULT.json``: the performance page from one bench run.

    python3 dev.py bench --output /tmp/run          # writes /tmp/run.md and /tmp/run.json
    .venv/bin/python -m bench.plots /tmp/run.json   # the charts, the page and the README

From the JSON that ``python -m bench --output FILE`` writes, and nothing else, this writes:

- self-contained SVG charts (hand-written SVG, no plotting library, no script, no font or
  stylesheet fetched) into ``--out`` (default ``docs/performance/``): the drain rate of
  every contender, locally and through the delay proxy at each RTT, compute-seconds per
  1,000 jobs at each RTT, the empty queue across a link, the batch-size curve against the
  pgbench ceiling, and the I/O-bound handlers against Little's law;
- a copy of the JSON beside them (``bench.json``), the source of the figures;
- the generated region of ``--page`` (default ``docs/performance.md``): the run's command,
  date, machine and load average from the JSON's ``meta``, then each section's table (as
  the bench printed it, kept in the JSON's ``tables``) followed by its charts;
- the generated region of ``--readme`` (default ``README.md``): the headline ratios.

A generated region lies between the markers ``<!-- bench.plots:NAME begin ... -->`` and
``<!-- bench.plots:NAME end -->``; everything outside them is left as it is. Exit 2 with
one line on stderr for a file that is missing, not a bench JSON, or a page without the
markers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "performance"
DEFAULT_PAGE = ROOT / "docs" / "performance.md"
DEFAULT_README = ROOT / "README.md"

#: The section names of ``python -m bench`` whose JSON holds these keys.
_KEYS = {"link-drain": "link_drain", "link-empty": "link_empty"}

PALETTE = ("#3465a4", "#e07b00", "#4e9a06", "#a40000", "#75507b", "#c4a000", "#204a87",
           "#8f5902", "#5c8a8a", "#555753")
INK, GRID, MUTED = "#1d2330", "#dde1e8", "#5a6270"
FONT = "font-family=\"system-ui,-apple-system,'Segoe UI',Roboto,sans-serif\""


class BadInput(Exception):
    """A problem with the input, said in one line."""


# -- figures out of the JSON ---------------------------------------------------------------------


def _messages(n: float) -> str:
    """The statement messages a run sent (Query + Execute; one Query may hold several
    statements: drainer's empty run sends run_start and finish_run in one)."""
    return f"{n:.0f} statement message{'' if round(n) == 1 else 's'}"


def median(xs: Sequence[float] | None) -> float:
    return statistics.median(xs) if xs else math.nan


def fmt_rate(x: float) -> str:
    return "n/a" if x != x else f"{x:,.0f}"


def link_label(rtt: float | None) -> str:
    return "local (direct)" if rtt is None else f"proxy, RTT {rtt:g} ms"


def short_name(contender: str) -> str:
    """'drainer run-once --concurrency 50' -> 'drainer': the contender's program."""
    return contender.split()[0] if contender else contender


# -- SVG ------------------------------------------------------------------------------------------


def _x(text: object) -> str:
    return escape(str(text), quote=True)


def _clip(label: str, most: int = 48) -> str:
    """A row label that fits the label column (the whole one is in its <title>)."""
    return label if len(label) <= most else label[:most - 1].rstrip() + "\u2026"


def nice_ticks(hi: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``hi``."""
    if not hi > 0 or hi != hi:
        return [0.0, 1.0]
    raw = hi / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    n = math.ceil(hi / step - 1e-9)
    return [i * step for i in range(n + 1)]


def _tick_label(v: float) -> str:
    if v >= 1000:
        return f"{v / 1000:g}k"
    return f"{v:g}"


def _svg_head(width: int, height: int, title: str) -> list[str]:
    """The opening of a chart: the svg element, its title, a white ground, the heading."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" {FONT} font-size="12">',
            f"<title>{_x(title)}</title>",
            f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
            f'<text x="12" y="22" font-size="15" font-weight="600" fill="{INK}">'
            f"{_x(title)}</text>"]


def _legend(out: list[str], items: list[tuple[str, str]]) -> int:
    """A swatch and a name for each (name, colour), in a row under the heading; returns
    the x where the row ends."""
    lx = 12
    for name, colour in items:
        out.append(f'<rect x="{lx}" y="34" width="12" height="12" fill="{colour}"/>')
        out.append(f'<text x="{lx + 16}" y="44" fill="{INK}">{_x(name)}</text>')
        lx += 28 + 7 * len(name)
    return lx


@dataclass
class Bar:
    series: str
    value: float  # NaN: no valid run (drawn as a note, no bar)
    text: str


@dataclass
class Group:
    label: str
    bars: list[Bar]
    ref: tuple[float, str] | None = None  # a marker across the group: (value, label)


@dataclass
class Chart:
    """A horizontal bar chart: groups of bars, one colour a series, a legend on top."""

    title: str
    unit: str
    groups: list[Group]
    note: str = ""
    colours: dict[str, str] = field(default_factory=dict)

    def svg(self) -> str:
        width, label_w, right_w = 1000, 380, 250
        bar_h, gap, top = 16, 12, 70
        series = list(dict.fromkeys(b.series for g in self.groups for b in g.bars))
        colours = {s: self.colours.get(s) or PALETTE[i % len(PALETTE)]
                   for i, s in enumerate(series)}
        values = [b.value for g in self.groups for b in g.bars if b.value == b.value]
        values += [g.ref[0] for g in self.groups if g.ref and g.ref[0] == g.ref[0]]
        ticks = nice_ticks(max(values, default=0.0))
        plot_w = width - label_w - right_w
        scale = plot_w / ticks[-1]
        rows = sum(len(g.bars) for g in self.groups)
        plot_h = rows * bar_h + len(self.groups) * gap
        height = top + plot_h + 40 + (18 if self.note else 0)
        out = _svg_head(width, height, self.title)
        lx = _legend(out, [(s, colours[s]) for s in series])
        if any(g.ref for g in self.groups):
            out.append(f'<line x1="{lx}" y1="34" x2="{lx}" y2="46" stroke="{INK}" '
                       'stroke-width="2" stroke-dasharray="3,2"/>')
            out.append(f'<text x="{lx + 6}" y="44" fill="{INK}">'
                       f"{_x(next(g.ref[1] for g in self.groups if g.ref))}</text>")
        y0 = top
        for t in ticks:  # the grid and the axis
            x = label_w + t * scale
            out.append(f'<line x1="{x:.1f}" y1="{y0 - 6}" x2="{x:.1f}" y2="{y0 + plot_h}" '
                       f'stroke="{GRID}"/>')
            out.append(f'<text x="{x:.1f}" y="{y0 + plot_h + 16}" text-anchor="middle" '
                       f'fill="{MUTED}">{_tick_label(t)}</text>')
        out.append(f'<text x="{label_w + plot_w / 2:.0f}" y="{y0 + plot_h + 32}" '
                   f'text-anchor="middle" fill="{MUTED}">{_x(self.unit)}</text>')
        y = y0
        for g in self.groups:
            gy = y
            ref_w = g.ref[0] * scale if g.ref and g.ref[0] == g.ref[0] else 0.0
            if ref_w:  # the reference as a pale band under the bars: what is missing
                out.append(f'<rect x="{label_w}" y="{gy}" width="{ref_w:.1f}" '
                           f'height="{len(g.bars) * bar_h}" fill="{GRID}"/>')
            out.append(f'<text x="{label_w - 8}" y="{y + bar_h - 3}" text-anchor="end" '
                       f'font-weight="600" fill="{INK}">{_x(_clip(g.label))}'
                       f"<title>{_x(g.label)}</title></text>")
            for b in g.bars:
                if b.value == b.value:
                    w = max(b.value * scale, 1.0)
                    out.append(f'<rect x="{label_w}" y="{y + 1}" width="{w:.1f}" '
                               f'height="{bar_h - 2}" fill="{colours[b.series]}">'
                               f"<title>{_x(b.series)}: {_x(b.text)}</title></rect>")
                    out.append(f'<text x="{label_w + max(w, ref_w) + 6:.1f}" '
                               f'y="{y + bar_h - 4}" fill="{INK}">{_x(b.text)}</text>')
                else:
                    out.append(f'<text x="{label_w + 4}" y="{y + bar_h - 4}" fill="{MUTED}">'
                               f"{_x(b.series)}: {_x(b.text)}</text>")
                y += bar_h
            if g.ref and g.ref[0] == g.ref[0]:
                x = label_w + g.ref[0] * scale
                out.append(f'<line x1="{x:.1f}" y1="{gy - 2}" x2="{x:.1f}" y2="{y + 2}" '
                           f'stroke="{INK}" stroke-width="2" stroke-dasharray="3,2">'
                           f"<title>{_x(g.ref[1])}: {fmt_rate(g.ref[0])}</title></line>")
            y += gap
        if self.note:
            out.append(f'<text x="12" y="{height - 8}" fill="{MUTED}" font-size="11">'
                       f"{_x(self.note)}</text>")
        out.append("</svg>")
        return "\n".join(line for line in out if line) + "\n"


@dataclass
class Curve:
    """A line chart over categories (the batch sizes), one line a series."""

    title: str
    xlabel: str
    unit: str
    xs: list[str]
    series: dict[str, list[float]]
    below: list[str]  # a text under each x (the ratio)
    note: str = ""

    def svg(self) -> str:
        width, left, right, top, plot_h = 960, 80, 40, 70, 300
        plot_w = width - left - right
        height = top + plot_h + 78 + (18 if self.note else 0)
        values = [v for vs in self.series.values() for v in vs if v == v]
        ticks = nice_ticks(max(values, default=0.0))
        scale = plot_h / ticks[-1]
        step = plot_w / max(len(self.xs), 1)
        xpos = [left + step * (i + 0.5) for i in range(len(self.xs))]
        out = _svg_head(width, height, self.title)
        _legend(out, [(name, PALETTE[i % len(PALETTE)]) for i, name in enumerate(self.series)])
        base = top + plot_h
        for t in ticks:
            y = base - t * scale
            out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" '
                       f'stroke="{GRID}"/>')
            out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" '
                       f'fill="{MUTED}">{_tick_label(t)}</text>')
        out.append(f'<text x="16" y="{top + plot_h / 2:.0f}" fill="{MUTED}" '
                   f'transform="rotate(-90 16 {top + plot_h / 2:.0f})" text-anchor="middle">'
                   f"{_x(self.unit)}</text>")
        for x, label, text in zip(xpos, self.xs, self.below, strict=True):
            out.append(f'<text x="{x:.1f}" y="{base + 18}" text-anchor="middle" '
                       f'fill="{INK}">{_x(label)}</text>')
            out.append(f'<text x="{x:.1f}" y="{base + 36}" text-anchor="middle" '
                       f'fill="{MUTED}">{_x(text)}</text>')
        out.append(f'<text x="{left + plot_w / 2:.0f}" y="{base + 56}" text-anchor="middle" '
                   f'fill="{MUTED}">{_x(self.xlabel)}</text>')
        for i, (name, vs) in enumerate(self.series.items()):
            c = PALETTE[i % len(PALETTE)]
            pts = [(x, base - v * scale) for x, v in zip(xpos, vs, strict=True) if v == v]
            if len(pts) > 1:
                path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
                out.append(f'<polyline points="{path}" fill="none" stroke="{c}" '
                           'stroke-width="2.5"/>')
            for (x, y), v in zip(pts, [v for v in vs if v == v], strict=True):
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{c}">'
                           f"<title>{_x(name)}: {fmt_rate(v)}</title></circle>")
        if self.note:
            out.append(f'<text x="12" y="{height - 8}" fill="{MUTED}" font-size="11">'
                       f"{_x(self.note)}</text>")
        out.append("</svg>")
        return "\n".join(out) + "\n"


# -- the charts of one run ------------------------------------------------------------------------


def chart_drain(d: dict[str, Any]) -> Chart | None:
    drain = d.get("drain")
    if not isinstance(drain, dict) or not drain:
        return None
    ref = "drainer run-once (defaults)"
    base = median(drain.get(ref))
    bars = []
    for name, values in drain.items():
        m = median(values)
        text = f"{fmt_rate(m)} jobs/s"
        if base == base:
            text += f", {ratio(m, base):.2f}x drainer"
        bars.append(Group(name, [Bar("local", m, text if m == m else "no valid run")]))
    n = _size(d, "jobs")
    return Chart(f"Drain until empty{_of(n, 'no-op jobs')}, local database: jobs/s (median)",
                 "jobs/s, process start to exit", bars, note=_runs_note(d))


def _link_runs(d: dict[str, Any]) -> list[dict[str, Any]]:
    section = d.get("link_drain")
    runs = section.get("runs") if isinstance(section, dict) else None
    return [r for r in runs or [] if isinstance(r, dict) and "contender" in r]


def chart_link_drain(d: dict[str, Any]) -> Chart | None:
    runs = _link_runs(d)
    if not runs:
        return None
    local = {r["contender"]: median(r.get("jobs_per_s")) for r in runs if r.get("rtt_ms") is None}
    groups: dict[str, Group] = {}
    for r in runs:
        name = r["contender"]
        m = median(r.get("jobs_per_s"))
        text = f"{fmt_rate(m)} jobs/s"
        if r.get("rtt_ms") is not None and local.get(name, math.nan) == local.get(name):
            text += f", {ratio(m, local[name]):.2f}x local"
        groups.setdefault(name, Group(name, [])).bars.append(
            Bar(link_label(r.get("rtt_ms")), m, text if m == m else "no valid run"))
    n = d["link_drain"].get("jobs")
    return Chart(f"Drain across a link{_of(n, 'no-op jobs')}: jobs/s per contender, local and "
                 "through the delay proxy", "jobs/s, process start to exit",
                 list(groups.values()), note=_runs_note(d))


def chart_link_compute(d: dict[str, Any]) -> Chart | None:
    runs = [r for r in _link_runs(d) if r.get("rtt_ms") is not None]
    if not runs:
        return None
    groups: dict[float, Group] = {}
    for r in runs:
        m = median(r.get("compute_s_per_1000"))
        rtt = float(r["rtt_ms"])
        groups.setdefault(rtt, Group(f"RTT {rtt:g} ms", [])).bars.append(
            Bar(r["contender"], m, f"{m:.3f} s" if m == m else "no valid run"))
    return Chart("Compute-seconds per 1,000 jobs at each RTT (server sessions held; lower is "
                 "better)", "seconds a server session was open, per 1,000 jobs",
                 [groups[k] for k in sorted(groups)], note=_runs_note(d))


def chart_link_empty(d: dict[str, Any]) -> Chart | None:
    rows = [r for r in d.get("link_empty") or [] if isinstance(r, dict) and "command" in r]
    if not rows:
        return None
    groups: dict[float, Group] = {}
    for r in rows:
        m = median(r.get("held_s"))
        rtt = float(r.get("rtt_ms") or 0.0)
        st = median(r.get("statements"))
        text = f"{m:.3f} s" + (f", {_messages(st)}" if st == st else "")
        groups.setdefault(rtt, Group(f"RTT {rtt:g} ms", [])).bars.append(
            Bar(r["command"], m, text if m == m else "failed"))
    return Chart("Empty queue across a link: how long the server session is held",
                 "seconds held (median)", [groups[k] for k in sorted(groups)],
                 note=_runs_note(d))


def batch_points(d: dict[str, Any]) -> list[tuple[int, float, float]]:
    """(batch size, drainer jobs/s, pgbench 1-client jobs/s), by batch size."""
    batch = d.get("batch")
    if not isinstance(batch, dict):
        return []
    sizes = sorted({int(m.group(1)) for k in batch
                    if (m := re.fullmatch(r"drainer, batch (\d+)", k))})
    return [(b, median(batch.get(f"drainer, batch {b}")),
             median(batch.get(f"pgbench 1 client, batch {b}"))) for b in sizes]


def chart_batch(d: dict[str, Any]) -> Curve | None:
    points = batch_points(d)
    if not points:
        return None
    n = _size(d, "batch_jobs")
    return Curve(f"Batch size curve{_of(n, 'jobs')}: drainer against the 1-client pgbench "
                 "ceiling", "--batch-size (drainer) = jobs claimed per statement (pgbench)",
                 "jobs/s (median)", [str(b) for b, _, _ in points],
                 {"drainer run-once --batch-size B": [x for _, x, _ in points],
                  "pgbench ceiling, 1 client, batch B": [c for _, _, c in points]},
                 [f"{ratio(x, c):.2f}x ceiling" if c == c and c else "" for _, x, c in points],
                 note=_runs_note(d))


def chart_io(d: dict[str, Any]) -> Chart | None:
    io = _dict(d, "io")
    runs = [r for r in io.get("runs") or [] if isinstance(r, dict) and "contender" in r]
    if not runs:
        return None
    groups: dict[tuple[str, int], Group] = {}
    for r in runs:
        key = (str(r.get("handlers")), int(r.get("concurrency") or 0))
        ideal = float(r.get("ideal_jobs_per_s") or math.nan)
        g = groups.setdefault(key, Group(f"{key[0]} handlers, concurrency {key[1]}", [],
                                         (ideal, "Little's law")))
        m = median(r.get("jobs_per_s"))
        text = f"{fmt_rate(m)} jobs/s, {ratio(m, ideal):.2f}x Little's law" if m == m else \
            "no valid run"
        g.bars.append(Bar(short_name(r["contender"]), m, text))
    n, sleep = io.get("jobs"), io.get("sleep_s")
    what = f"{n:,} jobs of {sleep * 1000:g} ms" if isinstance(n, int) and sleep else "jobs"
    return Chart(f"Handlers that wait on I/O ({what}): jobs/s against Little's law",
                 "jobs/s in the handlers' window (median)", list(groups.values()),
                 note=_runs_note(d))


#: File name -> chart builder, in the order they appear on the page.
CHARTS = {
    "drain.svg": ("drain", chart_drain, "Drain rate per contender, local database"),
    "batch.svg": ("batch", chart_batch, "Batch size curve against the 1-client ceiling"),
    "link-drain.svg": ("link-drain", chart_link_drain,
                       "Drain rate per contender, local and at each RTT"),
    "link-compute.svg": ("link-drain", chart_link_compute,
                         "Compute-seconds per 1,000 jobs at each RTT"),
    "link-empty.svg": ("link-empty", chart_link_empty, "Empty queue across a link"),
    "io.svg": ("io", chart_io, "I/O-bound handlers against Little's law"),
}


def _size(d: dict[str, Any], key: str) -> int | None:
    sizes = d.get("meta", {}).get("sizes")
    value = sizes.get(key) if isinstance(sizes, dict) else None
    return value if isinstance(value, int) else None


def _of(n: object, what: str) -> str:
    return f": {n:,} {what}" if isinstance(n, int) else ""


def _runs_note(d: dict[str, Any]) -> str:
    meta = d.get("meta", {})
    return f"{meta.get('command', '?')}, {meta.get('date', '?')}; medians of interleaved runs"


def write_charts(d: dict[str, Any], out: Path) -> dict[str, list[tuple[str, str]]]:
    """Write every chart the run has data for; section -> [(file name, alt text)]."""
    out.mkdir(parents=True, exist_ok=True)
    for name in CHARTS:  # a chart whose section the run left out must not linger
        (out / name).unlink(missing_ok=True)
    written: dict[str, list[tuple[str, str]]] = {}
    for name, (section, build, alt) in CHARTS.items():
        chart = build(d)
        if chart is None:
            continue
        (out / name).write_text(chart.svg())
        written.setdefault(section, []).append((name, alt))
    return written


# -- the page and the README ----------------------------------------------------------------------


def meta_lines(d: dict[str, Any]) -> list[str]:
    meta = d["meta"]
    load = _load(meta.get("load_average_start")), _load(meta.get("load_average_end"))
    machine = ", ".join(x for x in [
        meta.get("machine"), f"{meta['cpus']} CPUs" if meta.get("cpus") else None,
        f"Python {meta['python']}" if meta.get("python") else None,
        f"PostgreSQL {meta['postgresql']}" if meta.get("postgresql") else None,
        f"psycopg {meta['psycopg']}" if meta.get("psycopg") else None] if x)
    lines = [f"- command: `{meta['command']}`", f"- date: {meta['date']}"]
    if machine:
        lines.append(f"- machine: {machine}")
    lines.append(f"- load average (1, 5, 15 min): {load[0]} at the start, {load[1]} at the end")
    if meta.get("peers"):
        lines.append(f"- peers: {meta['peers']}")
    return lines


def _load(values: object) -> str:
    if isinstance(values, list) and values:
        return ", ".join(f"{float(v):.2f}" for v in values)
    return "not recorded"


def page_region(d: dict[str, Any], charts: dict[str, list[tuple[str, str]]],
                image_dir: str) -> str:
    tables = d["tables"]
    lines = [f"Generated by `python -m bench.plots` from [one run's JSON]({image_dir}/bench.json):",
             "", *meta_lines(d), ""]
    small = _small(d)
    if small:
        lines += [f"!!! note \"Placeholder figures: a `{small[0]}` run\"",
                  f"    These come from `python3 dev.py bench {small[0]} ...` (smaller sizes, "
                  "fewer repetitions), not from a full run; regenerate from a full "
                  "`python3 dev.py bench` before quoting them.", ""]
    order = list(tables) + [s for s in charts if s not in tables]
    for section in order:
        if section in tables:
            lines += [str(tables[section]).rstrip(), ""]
        for name, alt in charts.get(section, []):
            lines += [f"![{alt}]({image_dir}/{name})", ""]
    return "\n".join(lines).rstrip() + "\n"


def headline(d: dict[str, Any]) -> list[tuple[str, str]]:
    """(measure, figure) rows of the README: the ratios the issues set targets for."""
    rows: list[tuple[str, str]] = []
    drain = _dict(d, "drain")
    own = median(drain.get("drainer run-once (defaults)"))
    sizes = _dict(d, "drain_jobs_per_completion")
    if own == own:
        parts = [f"{fmt_rate(own)} jobs/s"]
        size = median(sizes.get("drainer run-once (defaults)"))
        if size == size:
            parts[0] += f" (claims of {size:,.0f} jobs on average)"
        best = _dict(_dict(d, "capacity"), "best").get("article")
        if isinstance(best, list) and len(best) == 3 and best[0]:
            parts.append(f"{ratio(own, best[0]):.2f}x the server's capacity "
                         f"({fmt_rate(best[0])} jobs/s: *Postgres as a job queue*'s SQL "
                         f"under pgbench, {_clients(best[1])}, LIMIT {best[2]}, same run)")
        parts += [f"{ratio(own, median(v)):.1f}x {name}" for name, v in drain.items()
                  if name.startswith(("pgqueuer", "procrastinate"))]
        rows.append(("no-op drain, local database, defaults", "; ".join(parts)))
    cap = _dict(d, "capacity")
    pairs = [p for p in cap.get("same_round_ratio") or [] if isinstance(p, dict)]
    best = _dict(cap, "best").get("article")
    if pairs and isinstance(best, list) and len(best) == 3:
        at = [p for p in pairs if (p.get("clients"), p.get("limit")) == (best[1], best[2])]
        by_limit: dict[int, list[str]] = {}
        for p in sorted(pairs, key=lambda p: (p.get("limit") or 0, p.get("clients") or 0)):
            if p.get("ratios"):
                by_limit.setdefault(int(p.get("limit") or 0), []).append(
                    f"{median(p['ratios']):.2f}x at {p.get('clients')}")
        if at and at[0].get("ratios"):
            rows.append(("drainer's claim + complete SQL / *Postgres as a job queue*'s, pgbench",
                         f"{median(at[0]['ratios']):.2f}x at {_clients(best[1])}, LIMIT "
                         f"{best[2]} (that SQL's best setting; same-round ratio); "
                         + "; ".join(f"LIMIT {limit}: " + ", ".join(cells) + " clients"
                                     for limit, cells in by_limit.items())))
    runs = _link_runs(d)
    n_jobs = _size(d, "jobs")
    size = median(sizes.get("drainer run-once (defaults)"))
    local_size = f", claims of {size:,.0f} on average" if size == size else ""
    local = {r["contender"]: median(r.get("jobs_per_s")) for r in runs if r.get("rtt_ms") is None}
    for r in runs:
        rtt = r.get("rtt_ms")
        if rtt is None or not r["contender"].startswith("drainer"):
            continue
        m = median(r.get("jobs_per_s"))
        sent = median(r.get("statements"))
        parses = median(r.get("parses"))
        own_local = local.get(r["contender"], math.nan)
        parts = [f"{fmt_rate(m)} jobs/s"
                 + (f" ({n_jobs / sent:,.0f} jobs per statement sent)" if sent == sent and sent
                    and n_jobs else ""),
                 f"{ratio(m, own_local):.2f}x its local rate ({fmt_rate(own_local)} jobs/s"
                 f"{local_size})",
                 f"{median(r.get('compute_s_per_1000')):.3f} compute-s per 1,000 jobs"]
        if parses == parses and sent == sent and sent:
            parts.append(f"Parse messages {parses / sent:.0%} of statements")
        parts += [f"{ratio(m, median(q.get('jobs_per_s'))):.1f}x {q['contender']}"
                  for q in runs if q.get("rtt_ms") == rtt
                  and not q["contender"].startswith("drainer")]
        rows.append((f"drain through a {rtt:g} ms RTT link", "; ".join(parts)))
    empty = [r for r in d.get("link_empty") or [] if isinstance(r, dict) and "command" in r]
    top = max((float(r.get("rtt_ms") or 0) for r in empty), default=None)
    bare = [median(r.get("held_s")) for r in empty if r.get("rtt_ms") == top
            and str(r["command"]).startswith("connect + close only")]
    for r in empty:
        if str(r["command"]).startswith("drainer") and r.get("rtt_ms") == top:
            held = median(r.get("held_s"))
            beyond = (f" ({(held - bare[0]) / (top / 1000):.1f} RTT beyond connect-only)"
                      if bare and top else "")
            rows.append((f"empty queue at {top:g} ms RTT, {r['command'].split(', ')[-1]}",
                         f"session held {held:.3f} s{beyond}, "
                         f"{_messages(median(r.get('statements')))}"))
    io = _dict(d, "io")
    sleep = io.get("sleep_s")
    waiting = f" waiting {sleep * 1000:g} ms" if isinstance(sleep, (int, float)) else ""
    io_runs = [r for r in io.get("runs") or [] if isinstance(r, dict)]
    for r in io_runs:
        if str(r.get("contender", "")).startswith("drainer"):
            m = median(r.get("jobs_per_s"))
            bare_io = [q for q in io_runs if str(q.get("contender", "")).startswith("no queue")
                       and (q.get("handlers"), q.get("concurrency"))
                       == (r.get("handlers"), r.get("concurrency"))]
            floor = (f"; {ratio(m, median(bare_io[0].get('jobs_per_s'))):.2f}x the same "
                     "handlers with no queue, same rounds") if bare_io else ""
            rows.append((f"{r.get('handlers')} handlers{waiting}, concurrency "
                         f"{r.get('concurrency')}", f"{ratio(m, r.get('ideal_jobs_per_s')):.2f}x "
                         f"Little's law ({fmt_rate(m)} jobs/s over the handlers' window: first "
                         "handler start to last handler end, process start and exit left out"
                         f"{floor}; process start to exit: "
                         f"{fmt_rate(median(r.get('wall_jobs_per_s')))} jobs/s)"))
    points = batch_points(d)
    if points:
        rows.append(("batch-size curve, drainer / its own SQL under 1 pgbench client at "
                     "the same claim size",
                     ", ".join(f"{ratio(x, c):.2f}x at {b}" for b, x, c in points)))
        default = median(_dict(d, "batch").get("drainer, defaults"))
        top_b, top_x, _c = max(points, key=lambda p: p[1])
        if default == default:
            rows.append(("default drain / the best `--batch-size` of the curve",
                         f"{ratio(default, top_x):.2f}x ({fmt_rate(default)} jobs/s against "
                         f"{fmt_rate(top_x)} at --batch-size {top_b}, same run)"))
    enq = _dict(d, "enqueue")
    raw = median(enq.get("one raw COPY"))
    if raw == raw:
        parts = [f"{ratio(median(v), raw):.2f}x "
                 f"({k.replace('enqueue_many', '').strip(' ()') or 'a list of JobSpec'})"
                 for k, v in enq.items() if k.startswith("enqueue_many")]
        rows.append(("`enqueue_many` against one raw COPY", ", ".join(parts)))
    return rows


def _clients(n: object) -> str:
    return f"{n} client" + ("" if n == 1 else "s")


def ratio(a: float, b: object) -> float:
    """a / b, NaN when b is missing, zero or NaN."""
    return a / b if isinstance(b, (int, float)) and b and b == b else math.nan


def _dict(d: dict[str, Any], key: str) -> dict[str, Any]:
    value = d.get(key)
    return value if isinstance(value, dict) else {}


def _small(d: dict[str, Any]) -> list[str]:
    """The size flags (--smoke, --quick) of the run's command: placeholder figures."""
    return [f for f in ("--smoke", "--quick") if f in str(d["meta"]["command"]).split()]


def readme_region(d: dict[str, Any], page_link: str, image_link: str) -> str:
    meta = d["meta"]
    small = _small(d)
    lines = [f"From one run of `{meta['command']}` on {meta['date']} (load average "
             f"{_load(meta.get('load_average_start'))} at the start); figures are medians "
             "of contenders run interleaved, ratios of contenders in the same run"
             + (f" (a `{small[0]}` run: smaller sizes, placeholder figures)" if small else "")
             + f". All tables, charts and how it measures: [Performance]({page_link}).", "",
             "| measure | figure |", "|---|---|"]
    lines += [f"| {a} | {b} |" for a, b in headline(d)]
    if chart_link_drain(d) is not None:
        lines += ["", f"![Drain rate per contender, local and at each RTT]({image_link})"]
    return "\n".join(lines) + "\n"


def replace_region(text: str, name: str, body: str, where: Path) -> str:
    begin = re.compile(rf"<!-- bench\.plots:{re.escape(name)} begin[^>]*-->\n")
    end = f"<!-- bench.plots:{name} end -->"
    m = begin.search(text)
    if not m or end not in text[m.end():]:
        raise BadInput(f"{where}: no generated region: add the lines "
                       f"'<!-- bench.plots:{name} begin -->' and '{end}'")
    stop = text.index(end, m.end())
    return text[:m.end()] + body + text[stop:]


def load(path: Path) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path}: not a bench JSON ({exc})") from None
    if not isinstance(d, dict) or not isinstance(d.get("meta"), dict) or \
            "command" not in d["meta"] or "date" not in d["meta"]:
        raise BadInput(f"{path}: not a bench JSON (no meta with the command and the date); "
                       "write one with python -m bench --output FILE")
    if not isinstance(d.get("tables"), dict):
        raise BadInput(f"{path}: no tables in it (written before bench.plots existed): run "
                       "the bench again with --output FILE")
    return d


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.plots", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("result", type=Path, help="The .json that python -m bench --output wrote.")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help="Directory of the charts and of bench.json [docs/performance].")
    p.add_argument("--page", type=Path, default=DEFAULT_PAGE,
                   help="Page whose generated region gets the tables [docs/performance.md].")
    p.add_argument("--readme", type=Path, default=DEFAULT_README,
                   help="File whose generated region gets the headline ratios [README.md].")
    p.add_argument("--charts-only", action="store_true",
                   help="Write the charts and bench.json only, no page, no README.")
    return p


def main(argv: Iterable[str] | None = None) -> int:
    args = build_parser().parse_args(None if argv is None else list(argv))
    try:
        d = load(args.result)
        page = readme = None
        if not args.charts_only:  # read both before writing anything
            page = args.page.read_text() if args.page.is_file() else None
            readme = args.readme.read_text() if args.readme.is_file() else None
            if page is None or readme is None:
                raise BadInput(f"{args.page if page is None else args.readme}: no such file")
            image_dir = _rel(args.out, args.page.parent)
            page = replace_region(page, "results", page_region(d, {}, image_dir), args.page)
            readme = replace_region(readme, "summary", readme_region(
                d, _rel(args.page, args.readme.parent),
                f"{_rel(args.out, args.readme.parent)}/link-drain.svg"), args.readme)
    except BadInput as exc:
        sys.stderr.write(f"bench.plots: {exc}\n")
        return 2
    charts = write_charts(d, args.out)
    if args.result.resolve() != (args.out / "bench.json").resolve():
        shutil.copyfile(args.result, args.out / "bench.json")
    done = [f"{sum(len(v) for v in charts.values())} charts in {args.out}"]
    if page is not None and readme is not None:
        image_dir = _rel(args.out, args.page.parent)
        page = replace_region(args.page.read_text(), "results",
                              page_region(d, charts, image_dir), args.page)
        args.page.write_text(page)
        args.readme.write_text(readme)
        done.append(f"{args.page} and {args.readme} regenerated")
    sys.stderr.write(f"bench.plots: {'; '.join(done)}\n")
    return 0


def _rel(target: Path, start: Path) -> str:
    """``target`` relative to the directory ``start``, with forward slashes."""
    return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()


if __name__ == "__main__":
    sys.exit(main())
