"""bench.plots: the charts, the performance page and the README summary from one bench JSON."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from bench import plots

ROOT = Path(__file__).resolve().parent.parent.parent
FIXTURE = Path(__file__).parent / "fixtures" / "bench-smoke.json"
SVG = "{http://www.w3.org/2000/svg}"


def _tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A copy of the page and of the README, and where the charts go."""
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "performance.md"
    readme = tmp_path / "README.md"
    shutil.copyfile(ROOT / "docs" / "performance.md", page)
    shutil.copyfile(ROOT / "README.md", readme)
    return page, readme, tmp_path / "docs" / "performance"


def _run(result: Path, page: Path, readme: Path, out: Path) -> int:
    return plots.main([str(result), "--out", str(out), "--page", str(page), "--readme",
                       str(readme)])


def svg_texts(path: Path) -> str:
    """Every text of the chart (labels, values, tooltips), joined: the file must be XML."""
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    assert root.find(f"{SVG}title") is not None
    return "\n".join(t for t in root.itertext())


def check_charts(result: dict[str, Any], out: Path) -> None:
    """The charts of a bench JSON parse and show every contender the JSON has."""
    expected = {
        "drain.svg": list(result.get("drain", {})),
        "link-drain.svg": [r["contender"] for r in result.get("link_drain", {}).get("runs", [])],
        "link-compute.svg": [r["contender"] for r in result.get("link_drain", {}).get("runs", [])
                             if r["rtt_ms"] is not None],
        "link-empty.svg": [r["command"] for r in result.get("link_empty", [])],
        "io.svg": [plots.short_name(r["contender"]) for r in result.get("io", {}).get("runs", [])],
        "batch.svg": ["drainer run-once --batch-size B", "pgbench ceiling, 1 client, batch B"]
        if result.get("batch") else [],
    }
    for name, contenders in expected.items():
        if not contenders:
            continue
        text = svg_texts(out / name)
        for c in contenders:
            assert c in text, (name, c)


def test_charts_page_and_readme_from_a_smoke_json(tmp_path: Path) -> None:
    page, readme, out = _tree(tmp_path)
    before_page, before_readme = page.read_text(), readme.read_text()
    assert _run(FIXTURE, page, readme, out) == 0
    result = json.loads(FIXTURE.read_text())
    assert sorted(p.name for p in out.glob("*.svg")) == sorted(plots.CHARTS)
    check_charts(result, out)
    assert "Little's law" in svg_texts(out / "io.svg")
    assert "x ceiling" in svg_texts(out / "batch.svg")
    assert json.loads((out / "bench.json").read_text()) == result

    text = page.read_text()
    meta = result["meta"]
    assert f"- command: `{meta['command']}`" in text and f"- date: {meta['date']}" in text
    for section, table in result["tables"].items():
        assert table.strip() in text, section
    for name in plots.CHARTS:
        assert f"](performance/{name})" in text
    # outside the generated region the page is as it was
    head = before_page.split("<!-- bench.plots:results begin")[0]
    tail = before_page.split("<!-- bench.plots:results end -->")[1]
    assert text.startswith(head) and text.endswith(tail)

    summary = readme.read_text()
    assert f"`{meta['command']}` on {meta['date']}" in summary
    assert "](docs/performance.md)" in summary and "](docs/performance/link-drain.svg)" in summary
    assert "| `enqueue_many` against one raw COPY |" in summary
    assert summary.split("<!-- bench.plots:summary begin")[0] == \
        before_readme.split("<!-- bench.plots:summary begin")[0]

    # run again: the same files
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert _run(FIXTURE, page, readme, out) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first
    assert page.read_text() == text and readme.read_text() == summary


def test_a_run_with_peers_and_fewer_sections(tmp_path: Path) -> None:
    result = json.loads(FIXTURE.read_text())
    result["drain"]["pgqueuer drain mode (asyncpg, batch 10)"] = [100.0]
    result["link_drain"]["runs"].append(
        {"contender": "pgqueuer drain mode (asyncpg, batch 10)", "rtt_ms": 2.0,
         "jobs_per_s": [50.0], "compute_s_per_1000": [4.0], "statements": [900],
         "connections": [1], "notes": []})
    for key in ("batch", "io", "link_empty"):
        del result[key]
    del result["tables"]["io"]
    source = tmp_path / "run.json"
    source.write_text(json.dumps(result))
    page, readme, out = _tree(tmp_path)
    assert _run(source, page, readme, out) == 0
    assert not (out / "io.svg").exists() and not (out / "batch.svg").exists()
    check_charts(result, out)
    summary = readme.read_text()
    assert "x pgqueuer drain mode (asyncpg, batch 10)" in summary
    assert "Little's law" not in summary


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", "not a bench JSON"),
    ('{"drain": {}}', "no meta with the command and the date"),
    ('{"meta": {"command": "c", "date": "d"}}', "no tables in it"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          content: str | None, message: str) -> None:
    source = tmp_path / "run.json"
    if content is not None:
        source.write_text(content)
    page, readme, out = _tree(tmp_path)
    assert _run(source, page, readme, out) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bench.plots: ") and message in err
    assert not out.exists()


def test_a_page_without_the_markers_is_refused_before_writing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page, readme, out = _tree(tmp_path)
    readme.write_text("# no markers here\n")
    assert _run(FIXTURE, page, readme, out) == 2
    assert "no generated region" in capsys.readouterr().err
    assert not out.exists() and page.read_text() == (ROOT / "docs/performance.md").read_text()


def test_the_committed_page_is_what_its_json_gives(tmp_path: Path) -> None:
    # docs/performance/ holds the JSON the page was generated from: regenerating gives the
    # committed charts, page region and README summary (no hand edits, nothing stale)
    committed = ROOT / "docs" / "performance"
    page, readme, out = _tree(tmp_path)
    source = tmp_path / "bench.json"
    shutil.copyfile(committed / "bench.json", source)
    assert _run(source, page, readme, out) == 0
    assert page.read_text() == (ROOT / "docs" / "performance.md").read_text()
    assert readme.read_text() == (ROOT / "README.md").read_text()
    assert sorted(p.name for p in committed.iterdir()) == sorted(p.name for p in out.iterdir())
    for chart in committed.glob("*.svg"):
        assert chart.read_text() == (out / chart.name).read_text(), chart.name
