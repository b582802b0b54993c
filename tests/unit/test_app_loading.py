"""--app names a module: one that fails to import says the file and line, a file path
given instead gets a hint to name the module."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize(("source", "line", "kind"), [
    ("import os\n\ndef f(:\n    pass\n", 3, "SyntaxError"),
    ("import os\nimport no_such_dependency_a\n", 2, "ModuleNotFoundError"),
    ("X = 1\n\n\nraise RuntimeError('refuses to load')\n", 4, "RuntimeError"),
])
def test_an_app_that_fails_to_import_shows_file_and_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, line: int,
        kind: str) -> None:
    from drainer.app import load_app
    from drainer.errors import ConfigError

    name = f"broken_app_{kind.lower()}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_app(name)
    text = str(err.value)
    assert text.startswith(f"cannot import app module {name!r}: {name}.py:{line}: {kind}: ")
    assert "\n" not in text


@pytest.mark.parametrize(("name", "source", "line"), [
    ("app_with_a_bad_task_cron",
     "from drainer import task\n\n\n@task('digest_61', cron='61 * * * *')\n"
     "def digest(job):\n    pass\n", 4),
    ("app_with_a_bad_recurring_cron",
     "import drainer\n\ndrainer.recurring('nightly_funday', '0 8 * * funday')\n", 3),
])
def test_a_bad_cron_points_at_the_app_line_that_declared_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str,
        line: int) -> None:
    """The check raises inside drainer (drainer/recurring.py): the mistake is the app's."""
    from drainer.app import load_app
    from drainer.errors import ConfigError

    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_app(name)
    assert str(err.value).startswith(
        f"cannot import app module {name!r}: {name}.py:{line}: ConfigError: recurring ")
    assert "invalid cron" in str(err.value)


@pytest.mark.parametrize(("given", "hint"), [
    ("tasks_module.py", "'tasks_module'"), ("./tasks_module.py", "'tasks_module'"),
    ("pkg_of_jobs/jobs_module.py", "'pkg_of_jobs.jobs_module'"),
])
def test_a_file_path_for_app_says_to_name_the_module(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str, hint: str) -> None:
    from drainer.app import load_app
    from drainer.errors import ConfigError

    (tmp_path / "tasks_module.py").write_text("")
    (tmp_path / "pkg_of_jobs").mkdir()
    (tmp_path / "pkg_of_jobs" / "jobs_module.py").write_text("")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_app(given)
    assert str(err.value).endswith(
        f"(--app takes a module name, as `python -m` does: {hint}, not a file path)")


def test_a_missing_dependency_of_the_app_gets_no_file_path_hint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from drainer.app import load_app
    from drainer.errors import ConfigError

    (tmp_path / "app_with_a_missing_dependency.py").write_text("import no_such_dependency_b\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as err:
        load_app("app_with_a_missing_dependency")
    assert "no_such_dependency_b" in str(err.value)
    assert "not a file path" not in str(err.value)
