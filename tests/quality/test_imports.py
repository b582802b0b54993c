"""The package's import structure: no circles, argparse only in drainer/cli/, and short
commands that do not load what they do not use."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "drainer"


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """The drainer modules ``path`` imports, at module level or inside functions (what
    runs only for type checkers, under ``if TYPE_CHECKING:``, does not count)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name in MODULES)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                for a in child.names:
                    sub = f"{child.module}.{a.name}"
                    if sub in MODULES:
                        found.add(sub)
                    elif child.module in MODULES:
                        found.add(child.module)
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def test_no_import_circles() -> None:
    graph = {name: _imports(path) for name, path in MODULES.items()}
    circles: list[list[str]] = []
    state: dict[str, int] = {}

    def walk(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                circles.append([*stack[stack.index(dep):], dep])
            elif dep not in state:
                walk(dep, stack)
        stack.pop()
        state[node] = 2

    for name in graph:
        if name not in state:
            walk(name, [])
    assert not circles, circles


def test_only_the_cli_and_the_adapters_import_the_package() -> None:
    """The package's names are for apps; drainer's own modules import what they need from
    the module that defines it, so importing one part never runs through all of them."""
    importers = [name for name, path in MODULES.items() if "drainer" in _imports(path)
                 and not name.startswith(("drainer.cli", "drainer.contrib",
                                          "drainer.serverless"))]
    assert not importers, importers


def test_argparse_only_in_the_cli_package() -> None:
    outside = [name for name, path in MODULES.items()
               if not name.startswith("drainer.cli")
               and "argparse" in {a.name for node in ast.walk(ast.parse(path.read_text()))
                                  if isinstance(node, ast.Import) for a in node.names}
               | {node.module for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.ImportFrom)}]
    assert not outside, outside


def _fresh(code: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, env=None if env is None else {**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_each_module_imports_on_its_own() -> None:
    """Every module, imported first in a clean state, loads (an import order that only
    works because another module came first would fail here). drainer.contrib.django's
    modules run inside a Django project: the test project's settings are named for them."""
    out = _fresh(
        "import importlib, sys\n"
        f"names = {sorted(set(MODULES) - {'drainer.__main__'})!r}\n"  # that one runs main()
        "failed = []\n"
        "for name in names:\n"
        "    for m in [m for m in sys.modules if m == 'drainer' or m.startswith('drainer.')]:\n"
        "        del sys.modules[m]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{name}: {type(exc).__name__}: {exc}')\n"
        "print(failed)\n",
        env={"DJANGO_SETTINGS_MODULE": "tests.contrib.django_project.settings"})
    assert out == "[]"


def test_the_parser_loads_neither_apscheduler_nor_http() -> None:
    out = _fresh(
        "import sys\n"
        "from drainer.cli import build_parser\n"
        "build_parser().parse_args(['schedule', '--interval', '1h'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('apscheduler', 'http', 'drainer') and m not in ('drainer', 'drainer.errors', "
        "'drainer._redact', 'drainer.job', 'drainer.registry', 'drainer.recurring', "
        "'drainer.settings', 'drainer._pyproject', 'drainer.maintenance', 'drainer.waking', "
        "'drainer.ops', 'drainer.queue_limits', 'drainer._text') "
        "and not m.startswith('drainer.cli')))\n")
    assert out == "[]"


def test_cron_and_the_wake_schedule_import_no_apscheduler() -> None:
    """--dry-run and the wake estimates need cron's fire times, not the scheduler."""
    out = _fresh(
        "import sys, datetime as d, drainer.cron as c, drainer.wake_schedule as w\n"
        "c.next_fire_times('0 3 * * 0', d.timezone.utc, d.datetime.now(d.timezone.utc), 3)\n"
        "w.WakeSchedule(cron='@daily', timezone=d.timezone.utc).min_gap()\n"
        "print(sorted(m for m in sys.modules if m.startswith('apscheduler')))\n")
    assert out == "[]"


#: What ``drainer run-once`` loads before it connects, beyond the drain itself: the CLI's
#: parser and its run command, the settings, the app, psycopg and pydantic(-settings).
RUN_ONCE_MODULES = ("drainer", "drainer._pyproject", "drainer._redact", "drainer._signals",
                    "drainer.app", "drainer.cli", "drainer.cli._base", "drainer.cli._output",
                    "drainer.cli._progress", "drainer.cli.run", "drainer.errors",
                    "drainer.job", "drainer.logs", "drainer.migrate", "drainer.otel",
                    "drainer.process", "drainer.queue_limits", "drainer.recurring",
                    "drainer.registry", "drainer.settings", "drainer.waking")
RUN_ONCE_PACKAGES = ("drainer.db", "drainer.drain", "drainer.maintenance")
#: Never before a run-once connects: the other commands' parts and optional extras.
NOT_FOR_RUN_ONCE = ("apscheduler", "opentelemetry", "prometheus_client", "psycopg_pool",
                    "http.server", "jinja2", "boto3")


def test_run_once_imports_only_what_it_runs_before_connecting(tmp_path: Path) -> None:
    """Every cold start (a cron run, a serverless invocation) pays its imports before the
    session opens: the other commands' modules (fleet, ui, audit, the scheduler, the HTTP
    server, ops, the producer) stay out. The real command line, stopped where it connects."""
    seen = tmp_path / "modules"
    _fresh(
        "import os, sys\n"
        "import drainer.db\n"
        "def connect(*args, **kwargs):\n"
        f"    open({str(seen)!r}, 'w').write(' '.join(sorted(sys.modules)))\n"
        "    os._exit(0)\n"
        "drainer.db.connect = connect\n"
        "from drainer.cli import main\n"
        "main(['run-once', '--app', 'sample_jobs'])\n",
        env={"DRAINER_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
             "PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'apps'}"})
    loaded = seen.read_text().split()
    assert "drainer.drain" in loaded and "sample_jobs" in loaded  # it got as far as connect
    extra = [m for m in loaded if m.split(".")[0] == "drainer" and m not in RUN_ONCE_MODULES
             and not m.startswith(tuple(f"{p}." for p in RUN_ONCE_PACKAGES))
             and m not in RUN_ONCE_PACKAGES]
    assert not extra, extra
    heavy = [m for m in loaded if m in NOT_FOR_RUN_ONCE or m.startswith(
        tuple(f"{p}." for p in NOT_FOR_RUN_ONCE))]
    assert not heavy, heavy
