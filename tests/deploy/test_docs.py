"""docs/deploy.md and the READMEs under deploy/: every path and link resolves, every target
is listed with its command, every target says what keeps the database awake; and the
crontab line the docs give runs a real drain."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.deploy._paths import DEPLOY, ROOT

README = ROOT / "README.md"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"


def _deploy_section() -> str:
    return DEPLOY_DOC.read_text()


TARGET_DIRS = ["kubernetes", "cron", "serverless/aws", "serverless/gcp"]


def test_readme_has_a_deploy_section() -> None:
    assert _deploy_section().startswith("# Deploy\n")
    assert "](docs/deploy.md)" in README.read_text()


def test_every_link_in_the_deploy_doc_resolves() -> None:
    # repository files are named as code paths relative to the root (the site has no copy
    # of them); links between pages are relative to docs/ (mkdocs --strict checks them too)
    text = _deploy_section()
    paths = re.findall(r"`((?:deploy/|\.)[\w./-]*)`", text)
    assert paths
    for path in paths:
        assert (ROOT / path).exists(), path
    for link in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (DEPLOY_DOC.parent / link).exists(), link


@pytest.mark.parametrize("command", [
    "kubectl apply -k deploy/kubernetes",
    "kubectl apply -k deploy/kubernetes-cronjob-only",
    "kubectl create -f deploy/kubernetes/job-scale-out.yaml",
    "systemctl enable --now drainer.timer",
    "deploy/cron/crontab",
    "sam deploy --template-file deploy/serverless/aws/template.yaml",
    "gcloud run jobs replace deploy/serverless/gcp/cloud-run-job.yaml",
    "--source deploy/serverless/gcp/cloud-functions --entry-point gcf_handler",
    "psql \"$OWNER_DATABASE_URL\" -f deploy/sql/roles.sql",
    "docker build -f deploy/Dockerfile",
])
def test_each_target_is_listed_with_its_command(command: str) -> None:
    assert command in _deploy_section()
    assert command in (DEPLOY / "README.md").read_text()


def test_every_deploy_file_is_mentioned_in_the_doc() -> None:
    text = _deploy_section()
    skip = {"README.md", "kustomization.yaml", "serviceaccount.yaml", "cronjob.yaml",
            "serve.yaml", "drainer.env.example", "main.py", "requirements.txt"}
    for path in DEPLOY.rglob("*"):
        if "__pycache__" in path.parts:  # bytecode of the handlers some tests import
            continue
        if path.is_file() and path.name not in skip:
            assert path.relative_to(ROOT).as_posix() in text, path


@pytest.mark.parametrize("folder", TARGET_DIRS)
def test_target_readme_says_what_keeps_the_database_awake(folder: str) -> None:
    text = (DEPLOY / folder / "README.md").read_text()
    assert "## What keeps the database awake\n" in text
    assert "## What does not\n" in text
    awake, _, asleep = text.partition("## What does not\n")
    assert awake.count("\n- ") >= 2 and asleep.count("\n- ") >= 2


def test_paths_named_in_readmes_exist() -> None:
    for readme in DEPLOY.rglob("README.md"):
        for path in re.findall(r"`(deploy/[\w./-]+)`", readme.read_text()):
            assert (ROOT / path).exists(), f"{readme}: {path}"


# -- the crontab line of the docs: it runs as written -------------------------------------------

CRON_LINE = re.compile(r"^\*/15 \* \* \* \*  (cd /srv/myapp && .*)$", re.M)


@pytest.mark.parametrize("page", ["README.md", "docs/waiting.md"])
def test_the_documented_crontab_line_drains(page: str, pg_url: str, schema: str,
                                            tmp_path: Path) -> None:
    found = CRON_LINE.findall((ROOT / page).read_text())
    assert len(found) == 1, f"{page}: one crontab line"
    command = found[0]
    assert "--app tasks" in command
    project = tmp_path / "myapp"
    project.mkdir()
    tutorial = (ROOT / "docs" / "tutorial.md").read_text()
    tasks = tutorial.split('```python title="tasks.py"\n', 1)[1].split("```", 1)[0]
    (project / "tasks.py").write_text(tasks)
    (project / "drainer.env").write_text(
        f"DRAINER_DATABASE_URL={shlex.quote(pg_url)}\nDRAINER_SCHEMA={schema}\n")
    (project / ".venv").symlink_to(Path(sys.executable).parent.parent)
    assert (project / ".venv" / "bin" / "drainer").exists()
    assert run_cli(["migrate"], pg_url=pg_url, schema=schema).returncode == 0
    enq = run_cli(["enqueue", "emails", '{"to": "cron@example.com"}'], pg_url=pg_url,
                  schema=schema)
    assert enq.returncode == 0, enq.stderr
    # what cron gives a job: sh, a bare PATH, the home directory, nothing else
    cron_env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SHELL": "/bin/sh",
                "LOGNAME": os.environ.get("USER", "drainer")}
    proc = subprocess.run(["/bin/sh", "-c", command.replace("/srv/myapp", str(project))],
                          cwd=tmp_path, env=cron_env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["succeeded"] == 1, report
    assert (project / "outbox").is_dir()
