"""The README and the docs stay in step with the code: every setting (flag, variable,
default), command and run report key is documented, every documented command line parses,
the README's links resolve and it stays a front door to docs/."""

from __future__ import annotations

import re
import shlex

import pytest

from drainer.cli import _SCOPES
from drainer.settings import Settings, env_of, flag_of, parse_duration
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
CONFIGURATION = (DOCS / "configuration.md").read_text()
OPERATIONS = (DOCS / "operations.md").read_text()


def _config_rows() -> dict[str, list[str]]:
    """The configuration table's rows by variable: [flag, variables, default, meaning]."""
    rows: dict[str, list[str]] = {}
    for line in CONFIGURATION.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[1].startswith("`DRAINER_"):
            continue
        for env in re.findall(r"`(\w+)`", cells[1]):
            rows[env] = cells
    return rows


def _documented_default(cell: str) -> object:
    """A default as the table writes it (`drainer`, 10 s, 7 d, 10,000, on, –) as a value."""
    text = cell.strip("`")
    if text in {"–", "-"}:
        return None
    if text in {"on", "off"}:
        return text == "on"
    if re.fullmatch(r"[\d,]+", text):
        return int(text.replace(",", ""))
    if re.fullmatch(r"\d+(\.\d+)? ?(s|min|h|d)", text):
        return parse_duration(text.replace(" ", ""))
    return text


def test_every_setting_is_in_the_configuration_table() -> None:
    missing = [env_of(name) for name in Settings.model_fields
               if f"`{env_of(name)}`" not in CONFIGURATION]
    assert not missing, missing


def test_every_setting_has_its_flag_default_and_description_in_the_table() -> None:
    rows = _config_rows()
    cli_scopes = {s for scopes in _SCOPES.values() for s in scopes}
    for name, field in Settings.model_fields.items():
        flag, _, default, meaning = rows[env_of(name)]
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        scopes = extra.get("scopes")
        assert isinstance(scopes, list)
        if cli_scopes.isdisjoint(scopes):
            assert flag == "(environment only)", name
        else:
            assert flag.replace("[no-]", "") == f"`{flag_of(name)}`", name
        assert _documented_default(default) == field.default, (name, default, field.default)
        assert field.description is not None
        assert meaning.startswith(field.description.replace("<", "&lt;")), name


def test_the_configuration_table_is_generated_from_settings() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("settings_table", DOCS / "settings_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.current() == module.table(), "stale: run python docs/settings_table.py"


def test_database_url_falls_back_to_DATABASE_URL_in_the_table() -> None:
    assert "`DATABASE_URL`" in _config_rows()["DRAINER_DATABASE_URL"][1]


def test_every_command_is_documented() -> None:
    missing = [name for name in _SCOPES if f"`drainer {name}" not in OPERATIONS]
    assert not missing, missing


def test_the_readme_stays_a_front_door() -> None:
    """Details live in docs/ (every page linked from the README, checked below)."""
    assert len(README.splitlines()) <= 300


def test_the_quick_start_commands_are_kept_exactly() -> None:
    # CI and tests/acceptance rely on these two lines
    assert "python3 dev.py demo     # the whole flow on a throwaway embedded PostgreSQL" in README
    assert "python3 dev.py test     # the test suite" in README


def test_the_readme_names_every_extra() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for extra in extras:
        assert f"| `{extra}` |" in README, extra
        assert f"| `{extra}` |" in (DOCS / "install.md").read_text(), extra


def test_links_from_the_readme_resolve() -> None:
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README)
    assert len(links) >= 10
    for link in links:
        assert (ROOT / link).exists(), link


def test_every_docs_page_is_linked_from_the_readme() -> None:
    for page in DOCS.glob("*.md"):
        if page.name != "index.md":
            assert f"(docs/{page.name})" in README, page.name


#: "the article", "that article's", "the Japanese article", "the articles'": a source
#: named by no title ("the two articles" of the sources page is fine)
_VAGUE = re.compile(r"\b(?:the|that)\s+(?:japanese\s+|korean\s+)?articles?\b"
                    r"|japanese source article", re.IGNORECASE)


@pytest.mark.parametrize("path", ["README.md", *sorted(
    p.relative_to(ROOT).as_posix() for p in DOCS.glob("*.md"))])
def test_the_sources_are_cited_by_title(path: str) -> None:
    text = (ROOT / path).read_text()
    vague = [m.group(0) for m in _VAGUE.finditer(text)]
    assert not vague, f"{path}: cite {vague} by title (docs/sources.md)"


def test_the_package_and_deploy_files_cite_the_sources_by_title() -> None:
    """Help texts, messages, docstrings and comments of what users install and deploy."""
    files = [p for pattern in ("drainer/**/*.py", "drainer/**/*.sql", "deploy/**/*",
                               "bench/*.py")
             for p in ROOT.glob(pattern) if p.is_file() and p.suffix not in (".png", ".pyc")]
    assert len(files) > 50
    vague = [f"{p.relative_to(ROOT)}: {m.group(0)!r}" for p in files
             for m in _VAGUE.finditer(p.read_text(errors="replace"))]
    assert not vague, vague


def test_no_command_help_cites_a_source_without_its_title() -> None:
    from drainer.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    vague = {name: m.group(0) for name, sub in commands.items()
             for m in _VAGUE.finditer(" ".join(sub.format_help().split()))}
    assert not vague, vague


def test_the_sources_page_gives_both_titles() -> None:
    sources = (DOCS / "sources.md").read_text()
    assert "## Postgres as a job queue: using FOR UPDATE SKIP LOCKED correctly" in sources
    assert "## The SKIP LOCKED work queue" in sources


def test_the_using_it_example_imports_what_it_uses() -> None:
    # JobSpec is not exported from drainer: the docs import it from drainer.producer
    for page in [ROOT / "README.md", *DOCS.glob("*.md")]:
        text = page.read_text()
        assert not re.search(r"from drainer import [^\n]*\bJobSpec\b", text), page.name


def test_every_run_report_key_is_documented() -> None:
    import dataclasses

    from drainer.drain import RunReport

    text = (DOCS / "how-it-works.md").read_text()
    section = text[text.index("## The run report"):text.index("## The jobs table")]
    missing = [f.name for f in dataclasses.fields(RunReport) if f"`{f.name}`" not in section]
    assert not missing, missing


_CITED_TEST = re.compile(r"\b((?:tests/[\w/]+/)?(test_\w+\.py))(?:::(test_\w+))?")


def test_every_test_the_docs_cite_exists() -> None:
    """The guarantees table and the other pages name the tests that show each claim: a
    test renamed, moved or merged leaves no citation of nothing behind."""
    defined: dict[str, set[str]] = {}
    for f in (ROOT / "tests").rglob("test_*.py"):
        names = re.findall(r"^(?:async )?def (test_\w+)", f.read_text(), flags=re.M)
        defined.setdefault(f.name, set()).update(names)
    cited = 0
    missing = []
    for page in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted(DOCS.glob("*.md"))]:
        for m in _CITED_TEST.finditer(page.read_text()):
            path, name, test = m.groups()
            cited += 1
            if name not in defined or (path.startswith("tests/")
                                       and not (ROOT / path).is_file()):
                missing.append(f"{page.name}: {path}")
            elif test is not None and test not in defined[name]:
                missing.append(f"{page.name}: {name}::{test}")
    assert cited >= 30
    assert not missing, missing


def _documented_command_lines() -> list[tuple[str, int, list[str]]]:
    """Every `drainer ...` line of the shell blocks of the README and the docs, as words."""
    from tests.docs_snippets import blocks

    found = []
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for b in blocks(page.read_text()):
            if b.lang not in {"sh", ""}:
                continue
            for line in b.code.replace("\\\n", " ").splitlines():
                m = re.search(r"(?:^|&& |exec |\$ )(?:[A-Z_]+=\S+ )*\S*\bdrainer (.*)$",
                              line.strip())
                if m is None or line.lstrip().startswith("#"):
                    continue
                words = shlex.split(m.group(1), comments=True)
                if "..." in words:
                    continue  # an elided example, not a command line
                for op in ("<", ">", ">>", "|", "&&", "2>&1"):
                    if op in words:
                        words = words[:words.index(op)]
                found.append((f"{page.name}:{b.line}", len(found), words))
    return found


def test_every_documented_command_line_parses(capsys: pytest.CaptureFixture[str]) -> None:
    from drainer.cli import build_parser

    lines = _documented_command_lines()
    assert len(lines) >= 30
    bad = []
    for where, _, words in lines:
        try:
            build_parser().parse_args(words)
        except SystemExit as exc:
            if not (exc.code == 0 and "--help" in words):
                bad.append((where, " ".join(words)))
    capsys.readouterr()
    assert not bad, bad
