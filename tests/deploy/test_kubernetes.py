"""deploy/kubernetes: every manifest is valid against the Kubernetes schemas (offline,
strict), and the fields that keep drainer safe say what they must."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError

from tests.deploy._paths import (
    DEPLOY,
    MAINTENANCE_MARGIN_S,
    cron_min_gap,
    drainer_settings,
    load_yaml_docs,
    longest_idle_timeout,
)

K8S = DEPLOY / "kubernetes"
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
# CronJob.spec.timeZone is GA from 1.27; the newest schemas the package ships, too.
VERSIONS = ["1.27", kubernetes_validate.utils.latest_version()]



def docs(name: str) -> list[dict[str, Any]]:
    return load_yaml_docs(K8S / name)


def doc(name: str, kind: str) -> dict[str, Any]:
    found = [d for d in docs(name) if d["kind"] == kind]
    assert len(found) == 1, f"{name}: expected one {kind}"
    return found[0]


def pod_spec(resource: dict[str, Any]) -> dict[str, Any]:
    if resource["kind"] == "CronJob":
        spec: dict[str, Any] = resource["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    else:
        spec = resource["spec"]["template"]["spec"]
    return spec


def workloads() -> list[dict[str, Any]]:
    return [d for p in MANIFESTS for d in load_yaml_docs(p)
            if d["kind"] in {"CronJob", "Job", "Deployment"}]


def test_the_expected_manifests_exist() -> None:
    kinds = sorted(d["kind"] for p in MANIFESTS for d in load_yaml_docs(p))
    assert kinds == ["CronJob", "Deployment", "Job", "Service", "ServiceAccount"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid_for_kubernetes(path: Path, version: str) -> None:
    resources = load_yaml_docs(path)
    assert resources, f"{path.name} is empty"
    for resource in resources:
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except SchemaNotFoundError as exc:  # the CLI only warns; a test must not
            pytest.fail(exc.message)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{path.name} {resource['kind']}: {where}: {exc.message}")


def test_strict_validation_catches_a_misspelt_field() -> None:
    """The check above can fail: a typo that a lenient schema would let through."""
    cronjob = doc("cronjob.yaml", "CronJob")
    cronjob["spec"]["concurrencyPolicyy"] = "Forbid"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(cronjob, VERSIONS[-1], strict=True)


def test_kustomization_lists_the_base() -> None:
    kustomization = load_yaml_docs(K8S / "kustomization.yaml")[0]
    assert kustomization["kind"] == "Kustomization"
    resources = kustomization["resources"]
    for name in resources:
        assert (K8S / name).is_file(), name
    # the one-off scale-out Job is applied by hand, everything else is in the base
    assert sorted(resources) == sorted(p.name for p in MANIFESTS
                                       if p.name != "job-scale-out.yaml")
    images = {i["name"] for i in kustomization["images"]}
    used = {c["image"].split(":")[0] for w in workloads() for c in pod_spec(w)["containers"]}
    assert used == images == {"drainer"}


def test_kustomize_build_is_valid() -> None:
    built = _kustomize(K8S, "the kustomization is still checked by "
                            "test_kustomization_lists_the_base")
    assert sorted(d["kind"] for d in built) == ["CronJob", "Deployment", "Service",
                                                "ServiceAccount"]
    for resource in built:
        kubernetes_validate.validate(resource, VERSIONS[-1], strict=True)
        assert resource["metadata"]["labels"]["app.kubernetes.io/part-of"] == "drainer"
        if resource["kind"] in {"CronJob", "Deployment"}:
            image = pod_spec(resource)["containers"][0]["image"]
            assert image == "registry.example.com/drainer:0.1.0"


# -- the CronJob alone: deploy/kubernetes-cronjob-only --------------------------------------------

CRONJOB_ONLY = DEPLOY / "kubernetes-cronjob-only"


def _kustomize(folder: Path, still: str = "the overlay is still checked by "
                                       "test_cronjob_only_overlay_drops_exactly_serve"
               ) -> list[dict[str, Any]]:
    """``kubectl kustomize FOLDER``'s resources (skipped without kubectl: ``still`` says
    what checks the folder then)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip(f"kubectl is not installed: `kubectl kustomize` not run ({still})")
    out = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_cronjob_only_overlay_drops_exactly_serve() -> None:
    """The overlay takes the base as it is and deletes what serve.yaml adds, by kind and
    name: renaming or adding a resource in serve.yaml fails here, not in a user's cluster."""
    kustomization = load_yaml_docs(CRONJOB_ONLY / "kustomization.yaml")[0]
    assert kustomization["kind"] == "Kustomization"
    assert kustomization["resources"] == ["../kubernetes"]
    deleted = []
    for entry in kustomization["patches"]:
        patch = yaml.safe_load(entry["patch"])
        assert patch.pop("$patch") == "delete", entry
        deleted.append((patch["apiVersion"], patch["kind"], patch["metadata"]["name"]))
    serve = [(d["apiVersion"], d["kind"], d["metadata"]["name"]) for d in docs("serve.yaml")]
    assert sorted(deleted) == sorted(serve)
    # what is left needs no trigger token: the Secret of the comment has the DSN only
    left = [d for p in MANIFESTS if p.name in load_yaml_docs(K8S / "kustomization.yaml")[0][
        "resources"] and p.name != "serve.yaml" for d in load_yaml_docs(p)]
    assert left and "trigger-token" not in yaml.safe_dump_all(left)
    assert "--from-literal=trigger-token" not in (CRONJOB_ONLY / "kustomization.yaml").read_text()


@pytest.mark.parametrize("version", VERSIONS)
def test_cronjob_only_kustomize_build_is_the_base_without_serve(version: str) -> None:
    built = _kustomize(CRONJOB_ONLY)
    assert sorted(d["kind"] for d in built) == ["CronJob", "ServiceAccount"]
    base = {(d["kind"], d["metadata"]["name"]): d for d in _kustomize(K8S)}
    for resource in built:
        kubernetes_validate.validate(resource, version, strict=True)
        # the same objects as in the base: its labels, its image, its CronJob
        assert resource == base[(resource["kind"], resource["metadata"]["name"])]
    cronjob = next(d for d in built if d["kind"] == "CronJob")
    assert pod_spec(cronjob)["containers"][0]["image"] == "registry.example.com/drainer:0.1.0"


# -- the CronJob ----------------------------------------------------------------------------------


def test_cronjob_runs_one_drain_at_a_time_and_gives_up_on_late_starts() -> None:
    spec = doc("cronjob.yaml", "CronJob")["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert 0 < spec["startingDeadlineSeconds"] < cron_min_gap(spec["schedule"])
    job = spec["jobTemplate"]["spec"]
    assert job["backoffLimit"] >= 1
    assert job["ttlSecondsAfterFinished"] > 0
    assert pod_spec(doc("cronjob.yaml", "CronJob"))["restartPolicy"] == "Never"


def test_cronjob_interval_lets_the_compute_suspend() -> None:
    """A wake more often than the idle timeout keeps the compute up all day."""
    schedule = doc("cronjob.yaml", "CronJob")["spec"]["schedule"]
    assert cron_min_gap(schedule) > longest_idle_timeout()


def test_cronjob_runs_run_once_with_a_deadline_below_the_jobs() -> None:
    cronjob = doc("cronjob.yaml", "CronJob")
    (container,) = pod_spec(cronjob)["containers"]
    args, settings = drainer_settings(container["args"])
    assert args.command == "run-once"
    assert settings.max_runtime is not None, "--max-runtime must be set"
    deadline = cronjob["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"]
    assert deadline > settings.max_runtime
    assert deadline >= settings.max_runtime + settings.grace + MAINTENANCE_MARGIN_S
    # and the deadline ends before the next run is due
    assert deadline < cron_min_gap(cronjob["spec"]["schedule"])


# -- every workload -------------------------------------------------------------------------------


@pytest.mark.parametrize("resource", workloads(), ids=lambda r: r["kind"])
def test_workload_deadlines_and_grace(resource: dict[str, Any]) -> None:
    pod = pod_spec(resource)
    (container,) = pod["containers"]
    _, settings = drainer_settings(container["args"])
    # SIGTERM -> drainer stops claiming and gives handlers --grace s -> SIGKILL after this
    assert pod["terminationGracePeriodSeconds"] > settings.grace
    if resource["kind"] != "Deployment":
        job = resource["spec"]["jobTemplate"]["spec"] if resource["kind"] == "CronJob" \
            else resource["spec"]
        assert settings.max_runtime is not None
        assert job["activeDeadlineSeconds"] >= (settings.max_runtime + settings.grace
                                                + MAINTENANCE_MARGIN_S)


@pytest.mark.parametrize("resource", workloads(), ids=lambda r: r["kind"])
def test_workload_takes_the_dsn_from_a_secret(resource: dict[str, Any]) -> None:
    (container,) = pod_spec(resource)["containers"]
    env = {e["name"]: e for e in container["env"]}
    ref = env["DRAINER_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "drainer-database", "key": "database-url"}
    for item in container["env"]:
        value = str(item.get("value", ""))
        assert "postgres://" not in value and "postgresql://" not in value, item
        if any(word in item["name"] for word in ("TOKEN", "PASSWORD", "URL", "SECRET")):
            assert "valueFrom" in item, f"{item['name']} must come from a Secret"


@pytest.mark.parametrize("resource", workloads(), ids=lambda r: r["kind"])
def test_workload_runs_as_non_root_on_a_read_only_root(resource: dict[str, Any]) -> None:
    pod = pod_spec(resource)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    ctx = container["securityContext"]
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["runAsNonRoot"] is True
    assert ctx["capabilities"]["drop"] == ["ALL"]
    # the only writable place is a small /tmp
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts == {"/tmp": "tmp"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["tmp"]


@pytest.mark.parametrize("resource", workloads(), ids=lambda r: r["kind"])
def test_workload_has_resources(resource: dict[str, Any]) -> None:
    (container,) = pod_spec(resource)["containers"]
    resources = container["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"}
    assert set(resources["limits"]) == {"cpu", "memory"}


# -- scale-out ------------------------------------------------------------------------------------


def test_scale_out_job_runs_several_drainers_as_a_work_queue() -> None:
    job = doc("job-scale-out.yaml", "Job")
    assert job["spec"]["parallelism"] > 1
    # no completions: done once one pod succeeded and all ended (the queue is empty)
    assert "completions" not in job["spec"]
    (container,) = pod_spec(job)["containers"]
    args, settings = drainer_settings(container["args"])
    assert args.command == "run-once"
    # maintenance stays with the CronJob: N drainers would queue N VACUUMs on one table
    assert settings.vacuum_threshold == 0
    assert settings.archive_mode == "off"


# -- serve ----------------------------------------------------------------------------------------


def test_serve_deployment_probes_healthz_on_its_port() -> None:
    deployment = doc("serve.yaml", "Deployment")
    (container,) = pod_spec(deployment)["containers"]
    args, _ = drainer_settings(container["args"])
    assert args.command == "serve"
    assert args.host == "0.0.0.0", "serve must listen beyond the pod's loopback"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == args.port
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/healthz"
        assert get["port"] in ("http", args.port)
    env = {e["name"]: e for e in container["env"]}
    assert env["DRAINER_TRIGGER_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == \
        "drainer-database"


def test_service_routes_to_the_serve_pods() -> None:
    service = doc("serve.yaml", "Service")
    deployment = doc("serve.yaml", "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = service["spec"]["selector"]
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    assert all(labels[k] == v for k, v in selector.items())
    # the CronJob's pods carry another component, so the Service never picks them
    cron_labels = doc("cronjob.yaml", "CronJob")["spec"]["jobTemplate"]["spec"][
        "template"]["metadata"]["labels"]
    assert not all(cron_labels.get(k) == v for k, v in selector.items())
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "http"
