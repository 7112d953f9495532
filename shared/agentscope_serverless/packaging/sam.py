"""AWS SAM steps that need no cloud account: lint, validate and build, without Docker.

SAM CLI lives in its own virtualenv (``.venv-sam``, from ``requirements/sam.lock``) because its
pins clash with the runtime's; ``./scripts/bootstrap`` creates it.

>>> functions = list_functions(Path("template.yaml"))   # doctest: +SKIP
>>> functions["SessionsFunction"].handler               # doctest: +SKIP
'app.handler'
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentscope_serverless.errors import PackagingError

PLACEHOLDER_REGION = "us-east-1"


@dataclass(frozen=True)
class FunctionSpec:
    """A function of the template: its logical id, code directory and handler."""

    name: str
    code_uri: str
    handler: str
    condition: str | None


def _load_template(template: Path) -> dict[str, Any]:
    import yaml

    class _Loader(yaml.SafeLoader):
        """Reads CloudFormation's short tags (``!Ref``, ``!Sub``...) as plain values."""

    def _any_tag(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> Any:
        if isinstance(node, yaml.ScalarNode):
            return loader.construct_scalar(node)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]

    _Loader.add_multi_constructor("!", _any_tag)
    document = yaml.load(template.read_text(), Loader=_Loader)  # noqa: S506 - SafeLoader subclass
    if not isinstance(document, dict):
        raise PackagingError(f"{template} is not a template")
    return document


def list_functions(template: Path) -> dict[str, FunctionSpec]:
    """Every ``AWS::Serverless::Function`` of the template."""
    resources = _load_template(template).get("Resources", {})
    return {
        name: FunctionSpec(
            name=name,
            code_uri=str(spec["Properties"]["CodeUri"]),
            handler=str(spec["Properties"]["Handler"]),
            condition=spec.get("Condition"),
        )
        for name, spec in resources.items()
        if spec.get("Type") == "AWS::Serverless::Function"
    }


def sam_executable(project_root: Path) -> str:
    """The ``sam`` command: the project's ``.venv-sam`` first, then the PATH."""
    local = project_root / ".venv-sam" / "bin" / "sam"
    found = str(local) if local.exists() else shutil.which("sam")
    if not found:
        raise PackagingError("SAM CLI is not installed: run ./scripts/bootstrap (.venv-sam)")
    return found


def _sam_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("AWS_DEFAULT_REGION", env.get("AWS_REGION", PLACEHOLDER_REGION))
    env["SAM_CLI_TELEMETRY"] = "0"
    return env


def _run_sam(project_root: Path, *args: str) -> str:
    result = subprocess.run(
        [sam_executable(project_root), *args],
        cwd=project_root,
        env=_sam_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    output = (result.stdout + result.stderr).strip()
    if result.returncode != 0:
        tail = "\n".join(output.splitlines()[-20:])
        raise PackagingError(f"sam {args[0]} failed:\n{tail}")
    return output


def validate(project_root: Path) -> str:
    """``sam validate --lint`` (cfn-lint rules included); offline, no credentials needed."""
    return _run_sam(project_root, "validate", "--lint", "--template-file", "template.yaml")


def build(project_root: Path, *, build_dir: Path | None = None) -> Path:
    """``sam build`` with the local interpreter (no container); returns the build directory."""
    target = build_dir or project_root / ".aws-sam" / "build"
    _sync_layer_requirements(project_root)
    _run_sam(
        project_root,
        "build",
        "--template-file",
        "template.yaml",
        "--build-dir",
        str(target),
        "--parameter-overrides",
        # Build both process variants: a condition would otherwise skip one of them.
        "ProcessInvokeMode=RESPONSE_STREAM",
    )
    return target


def _sync_layer_requirements(project_root: Path) -> None:
    lock = project_root / "requirements" / "runtime.lock"
    layer = project_root / "shared" / "requirements.txt"
    if not layer.exists() or layer.read_text() != lock.read_text():
        layer.write_text(lock.read_text())


def stack_outputs(stack_name: str, region: str | None = None) -> dict[str, str]:
    """The outputs of a deployed stack (needs AWS credentials)."""
    import boto3

    client = boto3.client("cloudformation", region_name=region)
    stacks = client.describe_stacks(StackName=stack_name)["Stacks"]
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}


def deploy(project_root: Path, stack_name: str, *, parameters: dict[str, str]) -> dict[str, str]:
    """``sam deploy`` of the built stack, then its outputs (needs AWS credentials)."""
    overrides = [f"{key}={value}" for key, value in parameters.items()]
    args = [
        "deploy",
        "--stack-name",
        stack_name,
        "--resolve-s3",
        "--capabilities",
        "CAPABILITY_IAM",
        "--no-confirm-changeset",
        "--no-fail-on-empty-changeset",
    ]
    if overrides:
        args += ["--parameter-overrides", *overrides]
    _run_sam(project_root, *args)
    return stack_outputs(stack_name, _sam_env()["AWS_DEFAULT_REGION"])


def functions_json(template: Path) -> str:
    """The template's functions as JSON: ``{name: {code_uri, handler, condition}}``."""
    return json.dumps(
        {
            name: {"code_uri": f.code_uri, "handler": f.handler, "condition": f.condition}
            for name, f in list_functions(template).items()
        }
    )


__all__ = [
    "FunctionSpec",
    "build",
    "deploy",
    "functions_json",
    "list_functions",
    "sam_executable",
    "stack_outputs",
    "validate",
]
