"""deploy/Dockerfile and .dockerignore, linted for the basics (no container engine here:
the image is not built by the tests)."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.deploy._paths import DEPLOY, ROOT

DOCKERFILE = DEPLOY / "Dockerfile"
SECRET_NAME = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|DATABASE_URL|DSN|API_KEY|CREDENTIAL",
                         re.I)
DSN_WITH_PASSWORD = re.compile(r"postgres(?:ql)?://[^/\s:@]+:[^@\s]+@", re.I)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments out."""
    out: list[tuple[str, str]] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, rest = current.partition(" ")
        out.append((keyword.upper(), rest.strip()))
        current = ""
    assert not current, "a continuation line runs off the end of the Dockerfile"
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions(DOCKERFILE.read_text()):
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def final_stage() -> list[tuple[str, str]]:
    return stages()[-1]


def test_base_images_are_slim_python() -> None:
    all_ins = instructions(DOCKERFILE.read_text())
    args = dict(a[1].split("=", 1) for a in all_ins if a[0] == "ARG" and "=" in a[1])
    for stage in stages():
        image = stage[0][1].split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        assert image.startswith("python:") and "-slim" in image, image


def test_final_stage_runs_as_a_non_root_user() -> None:
    stage = final_stage()
    users = [(i, args) for i, (kw, args) in enumerate(stage) if kw == "USER"]
    assert users, "the final stage sets no USER: the container would run as root"
    index, user = users[-1]
    name = user.split(":")[0]
    assert name not in {"root", "0"}
    # numeric, so Kubernetes runAsNonRoot can verify it without /etc/passwd
    assert name.isdigit() and int(name) > 0
    entry = next(i for i, (kw, _) in enumerate(stage) if kw == "ENTRYPOINT")
    assert index < entry, "USER must come before ENTRYPOINT"


def test_entrypoint_is_drainer_and_default_command_run_once() -> None:
    stage = final_stage()
    entrypoint = [args for kw, args in stage if kw == "ENTRYPOINT"]
    cmd = [args for kw, args in stage if kw == "CMD"]
    # exec form (JSON): drainer is PID 1 and gets SIGTERM itself, no shell in between
    assert json.loads(entrypoint[-1]) == ["drainer"]
    assert json.loads(cmd[-1]) == ["run-once"]


def test_no_secrets_are_baked_in() -> None:
    for kw, args in instructions(DOCKERFILE.read_text()):
        if kw in {"ENV", "ARG", "LABEL"}:
            names = re.findall(r"(?:^|\s)([A-Za-z_][\w.]*)(?==|\s|$)", args)
            for name in names:
                assert not SECRET_NAME.search(name), f"{kw} {name} would bake a secret in"
        assert not DSN_WITH_PASSWORD.search(args), f"{kw} holds a DSN with a password"
    for kw, args in final_stage():
        if kw in {"COPY", "ADD"}:
            assert ".env" not in args and "pgpass" not in args, args


def test_no_dev_tools_in_the_image() -> None:
    for kw, args in instructions(DOCKERFILE.read_text()):
        if kw != "RUN":
            continue
        for tool in ("pytest", "ruff", "mypy", "hypothesis", "[test]", "build-essential",
                     "gcc", "apt-get install"):
            assert tool not in args, f"RUN installs {tool}: {args}"
    # the final stage installs nothing: it copies the virtualenv built in the first stage,
    # from which pip itself was removed
    final_runs = [args for kw, args in final_stage() if kw == "RUN"]
    assert not any("pip" in args for args in final_runs)
    build_runs = " ".join(args for kw, args in stages()[0] if kw == "RUN")
    assert "pip uninstall --yes pip" in build_runs


def test_copied_sources_exist() -> None:
    for kw, args in stages()[0]:
        if kw == "COPY" and "--from" not in args:
            *sources, _dest = shlex.split(args)
            for src in sources:
                if "*" in src:
                    continue  # optional files (README.md*)
                assert (ROOT / src).exists(), src


# -- the recipe of docs/deploy.md: handlers' dependencies on top of the image ----------------------


def _recipe() -> list[list[tuple[str, str]]]:
    """The stages of the docs' multi-stage Dockerfile (the block with ``AS deps``)."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    blocks = [b for b in re.findall(r"```dockerfile\n(.*?)```", text, re.S) if " AS deps" in b]
    assert len(blocks) == 1, "docs/deploy.md: one dockerfile block with a deps stage"
    out: list[list[tuple[str, str]]] = []
    for ins in instructions(blocks[0]):
        if ins[0] == "FROM":
            out.append([])
        out[-1].append(ins)
    return out


def _venv() -> str:
    """The virtualenv deploy/Dockerfile builds and copies into its final stage."""
    build_runs = " ".join(args for kw, args in stages()[0] if kw == "RUN")
    venv = re.search(r"python -m venv (\S+)", build_runs)
    assert venv, build_runs
    copied = [args for kw, args in final_stage() if kw == "COPY" and "--from=" in args]
    assert any(args.split()[-2:] == [venv[1], venv[1]] for args in copied), copied
    return venv[1]


def test_the_documented_dependency_recipe_fits_the_dockerfile() -> None:
    """The image's venv has no pip (see test_no_dev_tools_in_the_image): the recipe brings
    it back with ensurepip in a stage of its own, installs into that same venv, removes
    pip, and copies the venv into a final stage that runs as the image's user."""
    venv = _venv()
    deps, final = _recipe()
    assert deps[0][1] == "drainer:0.1.0 AS deps" and final[0][1] == "drainer:0.1.0"
    runs = " ".join(args for kw, args in deps if kw == "RUN")
    steps = [f"{venv}/bin/python -m ensurepip", f"{venv}/bin/python -m pip install",
             f"{venv}/bin/python -m pip uninstall --yes pip"]
    at = [runs.find(step) for step in steps]
    assert -1 not in at and at == sorted(at), runs
    # the same interpreter: ensurepip is in the final stage's Python, which is the build
    # stage's (the venv's python links to it)
    assert stages()[0][0][1].split()[0] == final_stage()[0][1].split()[0]
    # the final stage copies the venv back in place, installs nothing, and keeps uid 10001
    assert ("COPY", f"--from=deps {venv} {venv}") in final
    assert not any(kw == "RUN" for kw, _ in final)
    assert not any(kw == "USER" for kw, _ in final), "the image's USER applies"
    image_user = [args for kw, args in final_stage() if kw == "USER"][-1]
    assert image_user.split(":")[0] == "10001"
    # what the docs say of the base: /app on PYTHONPATH, where the recipe puts the handlers
    env = " ".join(args for kw, args in final_stage() if kw == "ENV")
    assert "PYTHONPATH=/app" in env
    assert any(kw == "COPY" and args.split()[-1].startswith("/app/") for kw, args in final)


# -- .dockerignore --------------------------------------------------------------------------------


def _pattern(p: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(p):
        if p.startswith("**/", i):
            out += "(?:.*/)?"  # any number of directories, none included
            i += 3
        elif p.startswith("**", i):
            out += ".*"
            i += 2
        elif p[i] == "*":
            out += "[^/]*"
            i += 1
        elif p[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(p[i])
            i += 1
    return re.compile(f"^{out}$")


def ignored(path: str) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parents wins."""
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negated = line.startswith("!")
            patterns.append((negated, _pattern(line.lstrip("!").strip("/"))))
    parts = path.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    result = False
    for negated, pattern in patterns:
        if any(pattern.match(c) for c in candidates):
            result = not negated
    return result


@pytest.mark.parametrize("path", [
    ".git/config", ".venv/bin/python", ".env", "tests/conftest.py", "bench/run.py",
    "deploy/kubernetes/cronjob.yaml", "drainer/__pycache__/cli.cpython-312.pyc",
    ".mypy_cache/x", "docs/deploy.md",
])
def test_dockerignore_keeps_out(path: str) -> None:
    assert ignored(path)


@pytest.mark.parametrize("path", [
    "pyproject.toml", "README.md", "drainer/cli.py", "drainer/sql/queries.sql",
    "drainer/sql/migrations/0001_jobs_table.sql", "drainer/py.typed",
])
def test_dockerignore_lets_the_build_inputs_in(path: str) -> None:
    assert not ignored(path)
