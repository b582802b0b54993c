"""deploy/serverless: the SAM template parses with CloudFormation's tags and names a
handler that exists; the Cloud Run job and the Cloud Functions entry point likewise."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy._paths import (
    DEPLOY,
    MAINTENANCE_MARGIN_S,
    drainer_settings,
    load_yaml_docs,
    longest_idle_timeout,
)

AWS = DEPLOY / "serverless" / "aws"
GCP = DEPLOY / "serverless" / "gcp"
HANDLER = "drainer.serverless.lambda_handler"


# -- CloudFormation YAML ------------------------------------------------------------------------

#: CloudFormation's short-form intrinsic functions: !Tag -> the long form.
_INTRINSICS = {
    "Ref": "Ref", "Condition": "Condition", "GetAtt": "Fn::GetAtt", "Sub": "Fn::Sub",
    "Join": "Fn::Join", "Select": "Fn::Select", "Split": "Fn::Split", "If": "Fn::If",
    "Equals": "Fn::Equals", "Not": "Fn::Not", "And": "Fn::And", "Or": "Fn::Or",
    "FindInMap": "Fn::FindInMap", "Base64": "Fn::Base64", "Cidr": "Fn::Cidr",
    "ImportValue": "Fn::ImportValue", "GetAZs": "Fn::GetAZs", "Transform": "Fn::Transform",
}


class CloudFormationLoader(yaml.SafeLoader):
    """SafeLoader that reads !Ref, !GetAtt, !Sub... as CloudFormation's long forms; any
    other tag is an error, as it is for CloudFormation."""


def _intrinsic(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    if suffix not in _INTRINSICS:
        raise yaml.constructor.ConstructorError(None, None, f"unknown tag !{suffix}",
                                                node.start_mark)
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        if suffix == "GetAtt":
            value = value.split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    return {_INTRINSICS[suffix]: value}


CloudFormationLoader.add_multi_constructor("!", _intrinsic)


def load_cfn(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.load(path.read_text(), Loader=CloudFormationLoader)
    return data


def template() -> dict[str, Any]:
    return load_cfn(AWS / "template.yaml")


def walk(node: Any) -> Any:
    yield node
    if isinstance(node, dict):
        for v in node.values():
            yield from walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v)


def generated_resources(tpl: dict[str, Any]) -> set[str]:
    """Logical ids SAM generates from a function: <Fn>Url, <Fn><Event>, <Fn>Role."""
    out = set()
    for name, res in tpl["Resources"].items():
        if res["Type"] != "AWS::Serverless::Function":
            continue
        props = res["Properties"]
        out.add(f"{name}Role")
        if "FunctionUrlConfig" in props:
            out.add(f"{name}Url")
        out.update(f"{name}{event}" for event in props.get("Events", {}))
    return out


def test_the_loader_knows_the_tags_and_refuses_others() -> None:
    doc = yaml.load("a: !Ref X\nb: !GetAtt F.Arn\nc: !Sub '${X}'\n",
                    Loader=CloudFormationLoader)
    assert doc == {"a": {"Ref": "X"}, "b": {"Fn::GetAtt": ["F", "Arn"]},
                   "c": {"Fn::Sub": "${X}"}}
    with pytest.raises(yaml.constructor.ConstructorError):
        yaml.load("a: !Reff X\n", Loader=CloudFormationLoader)


def test_sam_template_parses_and_is_a_sam_template() -> None:
    tpl = template()
    assert tpl["AWSTemplateFormatVersion"] == "2010-09-09"
    assert tpl["Transform"] == "AWS::Serverless-2016-10-31"
    functions = {k: v for k, v in tpl["Resources"].items()
                 if v["Type"] == "AWS::Serverless::Function"}
    assert list(functions) == ["DrainerFunction"]


def test_every_reference_resolves() -> None:
    tpl = template()
    known = set(tpl.get("Parameters", {})) | set(tpl["Resources"])
    resources = set(tpl["Resources"]) | generated_resources(tpl)
    for node in walk(tpl):
        if not isinstance(node, dict):
            continue
        if "Ref" in node:
            assert node["Ref"] in known | resources or node["Ref"].startswith("AWS::"), node
        if "Fn::GetAtt" in node:
            assert node["Fn::GetAtt"][0] in resources, node
        if "Fn::Sub" in node:
            text = node["Fn::Sub"] if isinstance(node["Fn::Sub"], str) else node["Fn::Sub"][0]
            for name in re.findall(r"\$\{([^}!]+)\}", text):
                base = name.split(".")[0]
                assert base in known | resources or base.startswith("AWS::"), name


def test_lambda_names_the_handler_and_its_triggers() -> None:
    tpl = template()
    fn = tpl["Resources"]["DrainerFunction"]["Properties"]
    globals_fn = tpl.get("Globals", {}).get("Function", {})
    assert fn["Handler"] == HANDLER
    runtime = fn.get("Runtime", globals_fn.get("Runtime"))
    assert re.fullmatch(r"python3\.(1[0-9])", runtime), runtime  # requires-python >= 3.10
    assert 0 < fn["Timeout"] <= 900  # Lambda's limit
    # an EventBridge schedule
    (event,) = fn["Events"].values()
    assert event["Type"] == "Schedule"
    schedule = event["Properties"]["Schedule"]
    if isinstance(schedule, dict):
        schedule = tpl["Parameters"][schedule["Ref"]]["Default"]
    m = re.fullmatch(r"rate\((\d+) (minutes?|hours?)\)", schedule)
    assert m, schedule
    interval = int(m.group(1)) * (60 if m.group(2).startswith("minute") else 3600)
    assert interval > longest_idle_timeout()
    assert interval > fn["Timeout"]
    # a function URL for trigger-on-enqueue, not public by default: the handler does not
    # check a token
    auth = fn["FunctionUrlConfig"]["AuthType"]
    if isinstance(auth, dict):
        auth = tpl["Parameters"][auth["Ref"]]["Default"]
    assert auth == "AWS_IAM"


def test_lambda_takes_the_dsn_from_secrets_manager() -> None:
    tpl = template()
    env = tpl["Resources"]["DrainerFunction"]["Properties"]["Environment"]["Variables"]
    dsn = env["DRAINER_DATABASE_URL"]
    assert isinstance(dsn, dict) and "{{resolve:secretsmanager:" in dsn["Fn::Sub"]
    for node in walk(tpl):
        if isinstance(node, str):
            assert not re.search(r"postgres(?:ql)?://\S+:\S+@", node), node


def _handler_env_names() -> set[str]:
    names = set(template()["Resources"]["DrainerFunction"]["Properties"]["Environment"][
        "Variables"])
    return {n for n in names if n.startswith("DRAINER_")}


def test_lambda_handler_resolves() -> None:
    module_name, _, attr = HANDLER.rpartition(".")
    module = importlib.import_module(module_name)
    handler = getattr(module, attr)
    assert callable(handler)
    inspect.signature(handler).bind({"source": "aws.events"}, object())  # (event, context)
    # every DRAINER_* variable the template sets is a setting drainer reads
    from drainer.settings import Settings, env_of

    known = {env_of(name) for name in Settings.model_fields}
    assert _handler_env_names() <= known, _handler_env_names() - known


# -- Google Cloud ---------------------------------------------------------------------------------


def test_cloud_run_job_runs_run_once_within_its_timeout() -> None:
    (job,) = load_yaml_docs(GCP / "cloud-run-job.yaml")
    assert job["apiVersion"] == "run.googleapis.com/v1" and job["kind"] == "Job"
    task = job["spec"]["template"]["spec"]["template"]["spec"]
    (container,) = task["containers"]
    args, settings = drainer_settings(container["args"])
    assert args.command == "run-once"
    assert settings.max_runtime is not None
    assert int(task["timeoutSeconds"]) >= (settings.max_runtime + settings.grace
                                           + MAINTENANCE_MARGIN_S)
    env = {e["name"]: e for e in container["env"]}
    assert env["DRAINER_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "latest"
    assert all("value" not in e or "://" not in str(e["value"]) for e in container["env"])


def test_cloud_function_requirements_name_drainer_with_the_gcp_extra() -> None:
    lines = [ln.strip() for ln in (GCP / "cloud-functions" / "requirements.txt")
             .read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert any(ln.startswith("drainer[gcp]") for ln in lines)


def test_cloud_function_entry_point_resolves() -> None:
    spec = importlib.util.spec_from_file_location(
        "drainer_gcf_main", GCP / "cloud-functions" / "main.py")
    assert spec is not None and spec.loader is not None
    main = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(main)
    from drainer.serverless import gcf_handler

    # the entry point named in the deploy command (--entry-point gcf_handler)
    assert "--entry-point gcf_handler" in (GCP / "README.md").read_text()
    assert main.gcf_handler is gcf_handler
    inspect.signature(gcf_handler).bind(object())  # (request)
