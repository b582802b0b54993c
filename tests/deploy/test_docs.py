"""README's Deploy section and the READMEs under deploy/: every link resolves, every target
is listed with its command, every target says what keeps the database awake."""

from __future__ import annotations

import re

import pytest

from tests.deploy._paths import DEPLOY, ROOT

README = ROOT / "README.md"


def _deploy_section() -> str:
    text = README.read_text()
    start = text.index("\n## Deploy\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]
TARGET_DIRS = ["kubernetes", "cron", "serverless/aws", "serverless/gcp"]


def test_readme_has_a_deploy_section() -> None:
    assert "\n## Deploy\n" in README.read_text()


def test_every_link_in_the_deploy_doc_resolves() -> None:
    # the section is folded into README.md at the root: links are relative to the root
    links = re.findall(r"\]\(([^)#]+)\)", _deploy_section())
    assert links
    for link in links:
        assert (ROOT / link).exists(), link


@pytest.mark.parametrize("command", [
    "kubectl apply -k deploy/kubernetes",
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
