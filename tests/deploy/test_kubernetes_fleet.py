"""deploy/kubernetes-fleet: valid against the Kubernetes schemas (offline, strict), and the
shard of each pod of the Indexed Job is what drainer computes from JOB_COMPLETION_INDEX."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes_validate.utils import SchemaNotFoundError

from drainer.fleet.tenants import check_name, select, shard_from
from tests.deploy._paths import (
    DEPLOY,
    MAINTENANCE_MARGIN_S,
    cron_min_gap,
    drainer_settings,
    load_yaml_docs,
    longest_idle_timeout,
)
from tests.deploy.test_kubernetes import VERSIONS, _kustomize, pod_spec

FLEET = DEPLOY / "kubernetes-fleet"
MANIFESTS = sorted(p for p in FLEET.glob("*.yaml") if p.name != "kustomization.yaml")
SECRETS_MOUNT = "/etc/drainer/tenant-secrets"


def _one(name: str, kind: str) -> dict[str, Any]:
    (found,) = [d for d in load_yaml_docs(FLEET / name) if d["kind"] == kind]
    return found


def _cronjob() -> dict[str, Any]:
    return _one("cronjob.yaml", "CronJob")


def _container(resource: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec(resource)["containers"]
    return container


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container["env"]}


def _tenant_lines() -> list[tuple[str, str]]:
    lines = []
    for raw in (FLEET / "tenants.txt").read_text().splitlines():
        line = raw.split(" #")[0].strip()
        if line and not line.startswith("#"):
            name, url = line.split(None, 1)
            lines.append((name, url.strip()))
    return lines


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid_for_kubernetes(path: Path, version: str) -> None:
    for resource in load_yaml_docs(path):
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except SchemaNotFoundError as exc:
            pytest.fail(exc.message)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{path.name} {resource['kind']}: {where}: {exc.message}")


def test_the_kustomization_lists_the_base_and_the_tenants_file() -> None:
    (kustomization,) = load_yaml_docs(FLEET / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == ["cronjob.yaml", "serviceaccount.yaml"]
    (generated,) = kustomization["configMapGenerator"]
    assert generated["files"] == ["tenants.txt"]
    assert kustomization["generatorOptions"]["disableNameSuffixHash"] is True
    # the ConfigMap and the Secret each pod mounts are the ones the base makes and names
    for manifest in (_cronjob(), _one("migrate-job.yaml", "Job")):
        volumes = {v["name"]: v for v in pod_spec(manifest)["volumes"]}
        assert volumes["tenants"]["configMap"]["name"] == generated["name"]
        assert volumes["tenant-secrets"]["secret"]["secretName"] == \
            "drainer-fleet-tenant-passwords"


def test_each_pod_takes_the_shard_of_its_completion_index() -> None:
    cronjob = _cronjob()
    job = cronjob["spec"]["jobTemplate"]["spec"]
    assert job["completionMode"] == "Indexed"
    assert job["parallelism"] == job["completions"]
    count = int(_env(_container(cronjob))["DRAINER_FLEET_SHARD_COUNT"]["value"])
    assert count == job["completions"]
    from drainer.fleet.tenants import Tenant

    tenants = [Tenant(name, url) for name, url in _tenant_lines()]
    shards = [select(tenants, shard_from(None, count, {"JOB_COMPLETION_INDEX": str(i)}))
              for i in range(count)]
    assert sorted(t.name for s in shards for t in s) == sorted(t.name for t in tenants)


def test_the_cronjob_runs_fleet_run_once_within_its_deadlines() -> None:
    cronjob = _cronjob()
    spec = cronjob["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert 0 < spec["startingDeadlineSeconds"] < cron_min_gap(spec["schedule"])
    assert cron_min_gap(spec["schedule"]) > longest_idle_timeout()
    args, settings = drainer_settings(_container(cronjob)["args"])
    assert (args.command, args.fleet_command) == ("fleet", "run-once")
    assert settings.max_runtime is not None
    deadline = spec["jobTemplate"]["spec"]["activeDeadlineSeconds"]
    # every turn's deadline is at most the run's --max-runtime; then the grace period
    assert settings.fleet_tenant_budget < settings.max_runtime
    assert deadline >= settings.max_runtime + settings.grace + MAINTENANCE_MARGIN_S
    assert deadline < cron_min_gap(spec["schedule"])
    assert pod_spec(cronjob)["terminationGracePeriodSeconds"] > settings.grace
    # exit 7 (some tenants failed, recorded with a backoff) does not use up the retries
    (seven, *_) = spec["jobTemplate"]["spec"]["podFailurePolicy"]["rules"]
    assert seven["action"] == "Ignore" and seven["onExitCodes"]["values"] == [7]


def test_the_migrate_job_parses_as_fleet_migrate() -> None:
    args, _ = drainer_settings(_container(_one("migrate-job.yaml", "Job"))["args"])
    assert (args.command, args.fleet_command) == ("fleet", "migrate")


@pytest.mark.parametrize("name", ["cronjob.yaml", "migrate-job.yaml"])
def test_no_url_nor_password_is_written_in_a_manifest(name: str) -> None:
    resource = load_yaml_docs(FLEET / name)[0]
    container = _container(resource)
    env = _env(container)
    assert env["DRAINER_FLEET_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "drainer-fleet", "key": "fleet-url"}
    for item in container["env"]:
        assert "://" not in str(item.get("value", "")), item
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[SECRETS_MOUNT]["readOnly"] is True
    assert env["DRAINER_FLEET_TENANTS"]["value"].startswith(
        next(p for p in mounts if p.endswith("/tenants")))
    pod = pod_spec(resource)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_example_tenants_file_reads_each_password_from_the_mounted_secret() -> None:
    lines = _tenant_lines()
    assert len(lines) >= 4
    for name, url in lines:
        check_name(name)
        refs = re.findall(r"\$\{([^}]*)\}", url)
        assert refs == [f"file:{SECRETS_MOUNT}/{name}"], (name, url)
        assert "@" in url and ":${" in url  # the password place, not a literal


def test_kustomize_build_is_valid() -> None:
    built = _kustomize(FLEET, "the kustomization is still checked by "
                              "test_the_kustomization_lists_the_base_and_the_tenants_file")
    assert sorted(d["kind"] for d in built) == ["ConfigMap", "CronJob", "ServiceAccount"]
    for resource in built:
        kubernetes_validate.validate(resource, VERSIONS[-1], strict=True)
        assert resource["metadata"]["labels"]["app.kubernetes.io/part-of"] == "drainer"
    config = next(d for d in built if d["kind"] == "ConfigMap")
    assert config["data"]["tenants.txt"] == (FLEET / "tenants.txt").read_text()


def test_the_readme_says_what_keeps_the_databases_awake() -> None:
    text = (FLEET / "README.md").read_text()
    assert "## What keeps the database awake\n" in text and "## What does not\n" in text
    assert "## Growing from 1 to N pods\n" in text
    for path in re.findall(r"`(deploy/[\w./-]+)`", text):
        assert (DEPLOY.parent / path).exists(), path
