"""template.yaml lints clean and builds offline (no Docker): every function and the layer."""

from __future__ import annotations

import ast
import fnmatch
import itertools
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

from agentscope_serverless.aws_secrets import SECRET_FIELDS
from agentscope_serverless.errors import PackagingError
from agentscope_serverless.http.app import EXPOSED_HEADERS, create_app
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS, DynamoDBServer
from agentscope_serverless.packaging import sam
from agentscope_serverless.sandbox_protocol import MIN_BEARER_TOKEN_LENGTH
from agentscope_serverless.services._validation import MAX_TTL_SECONDS
from agentscope_serverless.services.idempotency.dynamodb import DynamoDBIdempotencyStore
from agentscope_serverless.services.session_history.dynamodb import (
    DynamoDBSessionHistoryService,
)
from agentscope_serverless.settings import load_settings
from tests.conftest import PROJECT_ROOT
from tests.deploy.test_archives import write_wheel

TEMPLATE = PROJECT_ROOT / "template.yaml"
FUNCTIONS = sam.list_functions(TEMPLATE)
# The first test to touch the session's SAM build waits for it.
pytestmark = pytest.mark.timeout(300)


def test_sam_validate_lint_passes() -> None:
    assert "is a valid SAM Template" in sam.validate(PROJECT_ROOT)


def test_cfn_lint_is_clean() -> None:
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    result = subprocess.run([str(cfn_lint), str(TEMPLATE)], capture_output=True, text=True)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_build_has_every_function_with_its_entry_point(sam_build_dir: Path) -> None:
    assert set(FUNCTIONS) == {
        "ProcessFunction",
        "ProcessStreamFunction",
        "SessionsFunction",
        "MemoryFunction",
        "StateFunction",
        "SandboxFunction",
        "TasksFunction",
    }
    for name in FUNCTIONS:
        assert (sam_build_dir / name / "agentscope_handler.py").is_file(), name


def test_build_has_both_process_variants_whatever_their_conditions(sam_build_dir: Path) -> None:
    conditions = {
        FUNCTIONS[name].condition for name in ("ProcessFunction", "ProcessStreamFunction")
    }
    assert conditions == {"Buffered", "Streaming"}
    built = sam.load_template(sam_build_dir / "template.yaml")["Resources"]
    assert built["ProcessFunction"]["Properties"]["CodeUri"] == "ProcessFunction"
    assert built["ProcessStreamFunction"]["Properties"]["CodeUri"] == "ProcessStreamFunction"


def test_streaming_function_start_script_is_executable(sam_build_dir: Path) -> None:
    run_sh = sam_build_dir / "ProcessStreamFunction" / "run.sh"
    assert os.access(run_sh, os.X_OK)
    assert FUNCTIONS["ProcessStreamFunction"].handler == "run.sh"


def test_layer_holds_the_package_and_its_dependencies(sam_build_dir: Path) -> None:
    layer = sam_build_dir / "SharedLayer" / "python"
    assert (layer / "agentscope_serverless" / "__init__.py").is_file()
    for dependency in ("fastapi", "mangum", "aioboto3", "redis", "pydantic_core"):
        assert (layer / dependency).is_dir(), dependency


def test_the_layer_installs_the_pinned_runtime_lock() -> None:
    sam.check_layer_requirements(PROJECT_ROOT)


def test_a_stale_layer_requirements_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "requirements").mkdir()
    (tmp_path / "shared").mkdir()
    (tmp_path / "requirements" / "runtime.lock").write_text("fastapi==1\n")
    (tmp_path / "shared" / "requirements.txt").write_text("fastapi==0\n")
    with pytest.raises(PackagingError, match=r"run \./scripts/lock"):
        sam.check_layer_requirements(tmp_path)


def test_the_layer_holds_the_runtime_without_the_tools(sam_build_dir: Path) -> None:
    layer = sam_build_dir / "SharedLayer" / "python"
    for tool in ("cli.py", "deploy_cli.py", "local_stack.py", "packaging", "sandbox_server"):
        assert not (layer / "agentscope_serverless" / tool).exists(), tool
    for dependency in ("typer", "rich", "pygments", "yaml"):
        assert not (layer / dependency).exists(), dependency
    assert (layer / "botocore" / "data" / "dynamodb").is_dir()
    size = sum(p.stat().st_size for p in layer.rglob("*") if p.is_file())
    assert size <= 35 * 2**20, f"the layer is {size / 2**20:.1f} MiB unpacked"


def _pyc_flags(pyc: Path) -> int:
    return int.from_bytes(pyc.read_bytes()[4:8], "little")


def test_the_layer_ships_its_modules_compiled(sam_build_dir: Path) -> None:
    layer = sam_build_dir / "SharedLayer" / "python"
    # The runtime's dependencies as bytecode alone, named by where Lambda mounts the layer.
    assert not (layer / "fastapi" / "__init__.py").exists()
    assert _pyc_flags(layer / "fastapi" / "__init__.pyc") == 1  # hash-based, unchecked
    # This package keeps its sources beside its bytecode.
    package = layer / "agentscope_serverless"
    for source in package.rglob("*.py"):
        cached = source.parent / "__pycache__" / f"{source.stem}.cpython-311.pyc"
        assert _pyc_flags(cached) == 1, source
    probe = (
        "import fastapi, agentscope_serverless.settings as settings;"
        "print(fastapi.__spec__.loader.get_code('fastapi').co_filename, settings.__cached__)"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            "-B",
            "-c",
            f"import sys; sys.path[:0] = [{str(layer)!r}]; {probe}",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    fastapi_file, cached = result.stdout.split()
    assert fastapi_file == "/opt/python/fastapi/__init__.py"
    assert Path(cached).is_file()


def test_compile_layer_leaves_pinned_dependencies_as_bytecode_and_keeps_other_sources(
    tmp_path: Path,
) -> None:
    layer = tmp_path / "python"
    (layer / "pinned").mkdir(parents=True)
    (layer / "pinned" / "__init__.py").write_text("VALUE = 'pinned'\n")
    (layer / "pinned-1.0.dist-info").mkdir()
    (layer / "pinned-1.0.dist-info" / "RECORD").write_text(
        "pinned/__init__.py,sha256=x,17\npinned-1.0.dist-info/RECORD,,\n"
    )
    (layer / "project.py").write_text("VALUE = 'project'\n")
    requirements = tmp_path / "runtime.lock"
    requirements.write_text("pinned==1.0\n    # via something\n")

    sam.compile_layer(layer, runtime_requirements=requirements, python=sys.executable)

    assert sorted(p.relative_to(layer).as_posix() for p in layer.rglob("*.py*")) == [
        f"__pycache__/project.{sys.implementation.cache_tag}.pyc",
        "pinned/__init__.pyc",
        "project.py",
    ]
    result = subprocess.run(
        [
            sys.executable,
            "-S",
            "-B",
            "-c",
            "import pinned, project; print(pinned.VALUE, project.VALUE)",
        ],
        cwd=layer,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.split() == ["pinned", "project"]


def test_template_short_tags_load_as_their_long_form() -> None:
    document = sam.load_template(TEMPLATE)
    assert document["Outputs"]["SessionsUrl"]["Value"] == {
        "Fn::GetAtt": ["SessionsFunctionUrl", "FunctionUrl"]
    }
    assert document["Conditions"]["Buffered"] == {"Fn::Not": [{"Condition": "Streaming"}]}
    assert document["Resources"]["ProcessFunction"]["Properties"]["Policies"][0] == {
        "DynamoDBCrudPolicy": {"TableName": {"Ref": "SessionsTable"}}
    }


def test_functions_json_lists_code_handler_runtime_and_condition() -> None:
    functions: dict[str, Any] = json.loads(sam.functions_json(TEMPLATE))
    assert functions["SessionsFunction"] == {
        "code_uri": "functions/sessions/",
        "handler": "agentscope_handler.handler",
        "runtime": "python3.11",
        "condition": None,
    }
    for spec in functions.values():
        assert (PROJECT_ROOT / spec["code_uri"]).is_dir()


def test_every_function_logs_to_a_group_of_its_own_whose_logs_expire() -> None:
    resources = sam.load_template(TEMPLATE)["Resources"]
    functions = {n: r for n, r in resources.items() if r["Type"] == "AWS::Serverless::Function"}
    groups = [r["Properties"]["LoggingConfig"]["LogGroup"]["Ref"] for r in functions.values()]
    assert len(set(groups)) == len(functions) == 7
    for name, function in functions.items():
        group = resources[function["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]]
        assert group["Type"] == "AWS::Logs::LogGroup"
        # Named by the stack: a group Lambda made for the function before cannot clash.
        assert group["Properties"] == {"RetentionInDays": {"Ref": "LogRetentionDays"}}
        assert group.get("Condition") == function.get("Condition"), name


def test_a_file_without_resources_is_not_a_template(tmp_path: Path) -> None:
    path = tmp_path / "template.yaml"
    path.write_text("Description: nothing\n")
    with pytest.raises(PackagingError, match="no Resources"):
        sam.list_functions(path)


def test_every_value_a_secret_parameter_admits_is_its_field_of_the_stack_secrets() -> None:
    """The secrets' JSON is built by substitution: a value with a quote, a backslash or a
    control character would make it invalid (every function's first request then fails)
    or give it another field, so the parameters refuse them at deploy time."""
    document = sam.load_template(TEMPLATE)
    resources = document["Resources"]
    secrets = [r for r in resources.values() if r["Type"] == "AWS::SecretsManager::Secret"]
    templates: list[str] = [r["Properties"]["SecretString"]["Fn::Sub"] for r in secrets]
    stack_fields = re.findall(
        r'"(\w+)": "\$\{', resources["StackSecrets"]["Properties"]["SecretString"]["Fn::Sub"]
    )
    assert set(stack_fields) == {"llm_api_key", "sandbox_bearer_token", "redis_url"}
    redis_url = "rediss://:p%40ss%2Fw@cache.example:6379/0?ssl=1"
    ordinary = ["", "sk-proj-Ab3_x.y~z", redis_url]
    hostile = ['a"b', 'x", "redis_url": "redis://evil', "a\\b", "line\nbreak", "tab\there", "\x00"]
    for template in templates:
        fields = dict(re.findall(r'"(\w+)": "\$\{(\w+)\}"', template))
        for field, parameter in fields.items():
            pattern = document["Parameters"][parameter]["AllowedPattern"]
            for value in ["", redis_url] if field == "redis_url" else ordinary:
                assert re.fullmatch(pattern, value), (parameter, value)
            for value in ordinary + hostile:
                if re.fullmatch(pattern, value) is None:
                    continue
                secret = json.loads(template.replace(f"${{{parameter}}}", value))
                assert secret[field] == value and len(secret) == len(fields), (parameter, value)
            assert all(re.fullmatch(pattern, value) is None for value in hostile), parameter


def test_the_parameters_refuse_what_the_settings_they_fill_refuse() -> None:
    """A Redis URL without its scheme, a session expiry longer than the stores take, or a
    sandbox token shorter than the sandbox server takes, made every function refuse to start
    once deployed."""
    parameters = sam.load_template(TEMPLATE)["Parameters"]
    assert parameters["SessionTtlSeconds"]["MaxValue"] == MAX_TTL_SECONDS
    pattern = parameters["ExistingRedisUrl"]["AllowedPattern"]
    for url in ["", "redis://cache:6379/0", "rediss://:pw@cache.example:6379/0"]:
        assert re.fullmatch(pattern, url), url
    for url in ["localhost:6379", "cache.example:6379", "http://cache:6379"]:
        assert re.fullmatch(pattern, url) is None, url
    pattern = parameters["SandboxBearerToken"]["AllowedPattern"]
    for token in ["", "t" * MIN_BEARER_TOKEN_LENGTH]:
        assert re.fullmatch(pattern, token), token
    for token in ["t", "t" * (MIN_BEARER_TOKEN_LENGTH - 1)]:
        assert re.fullmatch(pattern, token) is None, token


def test_without_the_sam_cli_the_error_says_how_to_install_it_in_the_users_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A user's own project, with an installed package (no checkout, no .venv-sam) and no sam.
    monkeypatch.setattr(sam, "_checkout", lambda: tmp_path / "site-packages")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(PackagingError, match=r"\.venv-sam/bin/pip install aws-sam-cli"):
        sam.sam_executable(tmp_path / "project")
    installed = tmp_path / "project" / ".venv-sam" / "bin" / "sam"
    installed.parent.mkdir(parents=True)
    installed.touch()
    assert sam.sam_executable(tmp_path / "project") == str(installed)


def test_a_build_folder_inside_the_project_is_not_staged_as_its_code(tmp_path: Path) -> None:
    # `deploy sam build --build-dir build-out` from the project's folder: the stage goes
    # beside the build folder, in the project too.
    project = tmp_path / "project"
    (project / "mypkg").mkdir(parents=True)
    (project / "mypkg" / "agent.py").write_text("app = None\n")
    target = project / "build-out"
    (target / "ProcessFunction").mkdir(parents=True)
    stage = sam.stage_project(project, project / "sam-project", leave_out=(target,))
    layer = stage / "shared"
    assert {p.name for p in layer.iterdir()} == {
        "agentscope_serverless",
        "mypkg",
        "requirements.txt",
    }


def test_a_build_beside_a_folder_named_as_the_stage_leaves_that_folder_alone(
    tmp_path: Path,
) -> None:
    # A project named sam-project, built from inside it with --build-dir ../build.
    project = tmp_path / "sam-project"
    (project / "mypkg").mkdir(parents=True)
    (project / "mypkg" / "agent.py").write_text("app = None\n")
    (project / "notes.txt").write_text("mine\n")
    (project / "requirements.txt").write_text("./no-such-folder\n")  # fails fast, offline
    with pytest.raises(PackagingError, match="no-such-folder"):
        sam.build(project, build_dir=tmp_path / "build")
    assert (project / "notes.txt").read_text() == "mine\n"
    assert (project / "mypkg" / "agent.py").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sam-project"]


@pytest.mark.parametrize(
    ("build_dir", "said"),
    [
        (".", "is or holds the project folder"),  # `deploy sam build --build-dir .`
        ("..", "is or holds the project folder"),
        ("mypkg", "holds files of no earlier build"),
    ],
)
def test_a_build_folder_holding_what_is_not_a_build_is_refused_leaving_it_alone(
    tmp_path: Path, build_dir: str, said: str
) -> None:
    # SAM empties the build folder first: `--build-dir .` deleted the user's project.
    project = tmp_path / "project"
    (project / "mypkg").mkdir(parents=True)
    (project / "mypkg" / "agent.py").write_text(
        "from agentscope_serverless.agents.demo import app\n"
    )
    (project / "notes.txt").write_text("mine\n")
    with pytest.raises(PackagingError, match=said):
        sam.build(project, build_dir=project / build_dir, agent="mypkg.agent:app")
    assert (project / "notes.txt").read_text() == "mine\n"
    assert (project / "mypkg" / "agent.py").is_file()


def test_a_project_package_named_as_a_dependencys_is_refused_leaving_no_build(
    tmp_path: Path,
) -> None:
    # Its anyio/__init__.py replaced the layer's, which broke every function's start; the
    # build passed.
    project = tmp_path / "project"
    (project / "anyio").mkdir(parents=True)
    (project / "anyio" / "__init__.py").write_text("")
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    with pytest.raises(PackagingError, match=r"the project's anyio \(the module anyio of anyio "):
        sam.build(project, build_dir=tmp_path / "build", agent="agent:app")
    assert not (tmp_path / "build").exists()


def test_a_requirement_installing_a_standard_librarys_module_is_refused_leaving_no_build(
    tmp_path: Path,
) -> None:
    # enum34's enum/ in the layer came ahead of Python's enum (the streaming function's
    # run.sh puts /opt/python first on PYTHONPATH): no function could start; the build passed.
    project = tmp_path / "project"
    write_wheel(project / "vendor", "agentscope_enum_backport", "1.0", "", {"enum/__init__.py": ""})
    (project / "requirements.txt").write_text("-f ./vendor\nagentscope_enum_backport==1.0\n")
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    with pytest.raises(
        PackagingError,
        match=r"the requirements install enum/ \(of agentscope_enum_backport 1\.0\), named as a "
        r"module of the standard library of Python 3\.11: ",
    ):
        sam.build(project, build_dir=tmp_path / "build", agent="agent:app")
    assert not (tmp_path / "build").exists()


def test_a_requirement_found_by_the_projects_find_links_is_in_the_layer(tmp_path: Path) -> None:
    # SAM installed the layer's requirements without the project's --find-links (or private
    # --extra-index-url): "No matching distribution found".
    project = tmp_path / "project"
    write_wheel(project / "vendor", "agentscope_private_sdk", "1.0", "ANSWER = 42\n")
    (project / "requirements.txt").write_text("-f ./vendor\nagentscope_private_sdk==1.0\n")
    (project / "agent.py").write_text(
        "import agentscope_private_sdk\nfrom agentscope_serverless.agents.demo import app\n"
    )
    layer = sam.build(project, build_dir=tmp_path / "build", agent="agent:app") / "SharedLayer"
    assert (layer / "python" / "agentscope_private_sdk.py").is_file()
    assert not (layer / "python" / "requirements.txt").exists()


def test_a_path_in_the_projects_requirements_is_refused_for_the_layer(tmp_path: Path) -> None:
    # SAM installs the layer's requirements with pip in a folder of its own: the path would
    # fail there, in pip's words.
    project = tmp_path / "project"
    (project / "libs" / "loudly").mkdir(parents=True)
    (project / "libs" / "loudly" / "setup.py").write_text(
        "from setuptools import setup\n\nsetup(name='loudly', version='1.0')\n"
    )
    (project / "requirements.txt").write_text("-e ./libs/loudly\n")
    with pytest.raises(PackagingError, match=r"requirements\.txt names \./libs/loudly, a path"):
        sam.stage_project(project, tmp_path / "stage")


def _statements_on(function: str, table: str) -> list[dict[str, Any]]:
    """The statements of ``function``'s policies that reach ``table``; a policy template
    (``DynamoDBCrudPolicy``...) on it fails the test: it grants the whole table."""
    resources = sam.load_template(TEMPLATE)["Resources"]
    statements: list[dict[str, Any]] = []
    for policy in resources[function]["Properties"]["Policies"]:
        for name, arguments in policy.items():
            if name.startswith("DynamoDB"):
                assert arguments["TableName"] != {"Ref": table}, (function, name)
        for statement in policy.get("Statement", []):
            if statement["Resource"] == {"Fn::GetAtt": [table, "Arn"]}:
                statements.append(statement)
    return statements


async def test_functions_keeping_only_idempotency_records_reach_no_users_history(
    dynamodb_server: DynamoDBServer,
) -> None:
    """The memory, state and sandbox functions keep their Idempotency-Key records in the
    sessions table, which holds every user's history: they may reach those records only."""
    history = DynamoDBSessionHistoryService(
        dynamodb_server.sessions_table,
        endpoint_url=dynamodb_server.endpoint_url,
        region_name=dynamodb_server.region,
        **LOCAL_AWS_CREDENTIALS,
    )
    records = DynamoDBIdempotencyStore(
        dynamodb_server.sessions_table,
        endpoint_url=dynamodb_server.endpoint_url,
        region_name=dynamodb_server.region,
        **LOCAL_AWS_CREDENTIALS,
    )
    user = f"iam-{uuid.uuid4().hex[:8]}"
    async with history, records:
        session = await history.create_session(user, "iam-session")
        await history.append_message(session, {"role": "user", "content": "hi"})
        await records.begin(user, "key-1", "fingerprint")
    table = boto3.resource(
        "dynamodb",
        endpoint_url=dynamodb_server.endpoint_url,
        region_name=dynamodb_server.region,
        **LOCAL_AWS_CREDENTIALS,
    ).Table(dynamodb_server.sessions_table)
    keys = [item["pk"] for item in table.scan()["Items"]]
    own = {key for key in keys if key.startswith("IDEMPOTENCY#")}
    assert own and set(keys) - own
    for function in ("MemoryFunction", "StateFunction", "SandboxFunction"):
        statements = _statements_on(function, "SessionsTable")
        assert statements, function
        for statement in statements:
            if statement["Action"] == "dynamodb:DescribeTable":
                continue
            condition = statement["Condition"]["ForAllValues:StringLike"]
            patterns = condition["dynamodb:LeadingKeys"]
            assert {k for k in keys if any(fnmatch.fnmatchcase(k, p) for p in patterns)} == own


# The fields of the stack's secrets (aws_secrets.SECRET_FIELDS) each function uses: the agent's
# functions all of them; the memory function its Redis URL, the sandbox function the sandbox
# server's token, as the sessions function (deleting a session releases its sandboxes); the
# state function none (its store is a DynamoDB table).
SECRET_FIELDS_USED = {
    "ProcessFunction": set(SECRET_FIELDS),
    "ProcessStreamFunction": set(SECRET_FIELDS),
    "TasksFunction": set(SECRET_FIELDS),
    "MemoryFunction": {"redis_url"},
    "SandboxFunction": {"sandbox_bearer_token"},
    "SessionsFunction": {"sandbox_bearer_token"},
    "StateFunction": set(),
}


def _references(value: Any) -> set[str]:
    """The names ``value`` refers to with ``Ref`` (in any ``Fn::If`` branch)."""
    if isinstance(value, dict):
        found = {value["Ref"]} if isinstance(value.get("Ref"), str) else set()
        return found.union(*(_references(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_references(v) for v in value))
    return set()


def test_each_function_can_read_only_the_secrets_it_uses() -> None:
    """No function can read a secret it does not use (the LLM API key, say, in the
    sessions function), and each reads, through SECRETS_ARN, the secrets it may read."""
    document = sam.load_template(TEMPLATE)
    resources = document["Resources"]
    secrets = {n for n, r in resources.items() if r["Type"] == "AWS::SecretsManager::Secret"}
    assert "SECRETS_ARN" not in document["Globals"]["Function"]["Environment"]["Variables"]
    assert set(SECRET_FIELDS_USED) == set(FUNCTIONS)
    for function, used in SECRET_FIELDS_USED.items():
        properties = resources[function]["Properties"]
        readable = set()
        for policy in properties["Policies"]:
            readable |= _references(policy) & secrets
        fields = set()
        for secret in readable:
            text = resources[secret]["Properties"]["SecretString"]["Fn::Sub"]
            fields |= set(json.loads(re.sub(r"\$\{\w+\}", "", text)))
        assert fields == used, function
        variables = properties.get("Environment", {}).get("Variables", {})
        assert _references(variables.get("SECRETS_ARN")) & secrets == readable, function


def test_parameters_reach_sam_deploy_as_given() -> None:
    """SAM's --parameter-overrides splits KEY=VALUE words at spaces: a value with one (the
    origins of CorsAllowOrigins, "a, b") lost its end, or named another parameter."""
    parameters = {
        "CorsAllowOrigins": "https://app.example.com, https://admin.example.com",
        "LlmModel": "my model = large",
        "LlmApiKey": "sk-proj-Ab3_x.y~z",
        "SubnetIds": "subnet-a,subnet-b",
        "AgentApp": "it's.agent:app",
        "LlmBaseUrl": 'https://llm.example/v1?a="b c"',
        "SandboxBaseUrl": "",
    }
    arguments = sam.parameter_overrides(parameters)
    sam_python = Path(sam.sam_executable(PROJECT_ROOT)).resolve().parent / "python"
    script = (
        "import json, sys\n"
        "from samcli.cli.types import CfnParameterOverridesType\n"
        "print(json.dumps(CfnParameterOverridesType().convert(tuple(sys.argv[1:]), None, None)))"
    )
    result = subprocess.run(
        [str(sam_python), "-c", script, *arguments], capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == parameters
    with pytest.raises(PackagingError, match="LlmModel parameter holds a backslash"):
        sam.parameter_overrides({"LlmModel": "a\\b"})


# Turns the template into CloudFormation with SAM's own translator (in the SAM CLI's
# virtualenv), as CloudFormation does when the stack is deployed.
_TRANSLATE = """
import json, sys
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

class Policies:
    def load(self):
        return {}

document = yaml_parse(open(sys.argv[1]).read())
for resource in document["Resources"].values():
    properties = resource.get("Properties", {})
    for uri in ("CodeUri", "ContentUri"):
        if uri in properties:
            properties[uri] = "s3://bucket/key"
print(json.dumps(transform(document, {}, Policies())))
"""


def _translated() -> dict[str, Any]:
    sam_python = Path(sam.sam_executable(PROJECT_ROOT)).resolve().parent / "python"
    result = subprocess.run(
        [str(sam_python), "-c", _TRANSLATE, str(TEMPLATE)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "AWS_DEFAULT_REGION": "us-east-1"},
    )
    translated: dict[str, Any] = json.loads(result.stdout)
    return translated


def _holds(condition: Any, conditions: dict[str, Any], parameters: dict[str, str]) -> Any:
    """The value of a CloudFormation condition (or of the part of one) for ``parameters``."""
    if isinstance(condition, str):
        return condition
    if isinstance(condition, list):
        return [_holds(c, conditions, parameters) for c in condition]
    [(function, argument)] = condition.items()
    if function == "Condition":
        return _holds(conditions[argument], conditions, parameters)
    if function == "Ref":
        return parameters[argument]
    values = _holds(argument, conditions, parameters)
    if function == "Fn::Join":
        return values[0].join(values[1] if isinstance(values[1], list) else [values[1]])
    return {
        "Fn::Equals": lambda: values[0] == values[1],
        "Fn::Not": lambda: not values[0],
        "Fn::And": lambda: all(values),
        "Fn::Or": lambda: any(values),
    }[function]()


def test_with_function_url_auth_none_every_url_is_public_and_with_iam_none_is() -> None:
    """A Function URL whose AuthType is NONE answers 403 to everyone unless its function's
    policy lets anyone invoke it through the URL. SAM adds that policy only for a literal
    NONE, never for the template's !Ref FunctionUrlAuthType."""
    translated = _translated()
    resources, conditions = translated["Resources"], translated["Conditions"]
    defaults = {name: str(p.get("Default", "")) for name, p in translated["Parameters"].items()}
    for auth, invoke_mode, sandbox in itertools.product(
        ["NONE", "AWS_IAM"], ["RESPONSE_STREAM", "BUFFERED"], ["", "https://sandbox.example"]
    ):
        parameters = {
            **defaults,
            "FunctionUrlAuthType": auth,
            "ProcessInvokeMode": invoke_mode,
            "SandboxBaseUrl": sandbox,
            "ExistingRedisUrl": "rediss://cache.example:6379",
        }

        def deployed(resource: dict[str, Any], p: dict[str, str] = parameters) -> bool:
            condition = resource.get("Condition")
            return condition is None or bool(_holds(conditions[condition], conditions, p))

        urls = [r for r in resources.values() if r["Type"] == "AWS::Lambda::Url" and deployed(r)]
        granted = [
            r["Properties"]
            for r in resources.values()
            if r["Type"] == "AWS::Lambda::Permission" and deployed(r)
        ]
        assert len(urls) == (5 if sandbox else 4)
        for url in urls:
            function = url["Properties"]["TargetFunctionArn"]
            assert url["Properties"]["AuthType"] == {"Ref": "FunctionUrlAuthType"}
            public = [p for p in granted if p["FunctionName"] == function and p["Principal"] == "*"]
            actions = {
                (p["Action"], p.get("FunctionUrlAuthType"), p.get("InvokedViaFunctionUrl"))
                for p in public
            }
            expected = {
                ("lambda:InvokeFunctionUrl", "NONE", None),
                ("lambda:InvokeFunction", None, True),
            }
            assert actions == (expected if auth == "NONE" else set()), (auth, function)
            assert len(public) == len(actions)


def test_the_functions_may_read_an_api_key_by_its_id_but_never_list_the_keys() -> None:
    """Authenticating a caller reads one key record by its id (and the health check
    describes the table): a function allowed to scan the table could list every user."""
    translated = _translated()
    resources = translated["Resources"]
    for name, resource in resources.items():
        if resource["Type"] != "AWS::IAM::Role":
            continue
        policies = resource["Properties"].get("Policies", [])
        # A policy under a condition is Fn::If [condition, policy, AWS::NoValue].
        policies = [q for p in policies for q in p.get("Fn::If", [None, p])[1:]]
        documents = [p["PolicyDocument"] for p in policies if "PolicyDocument" in p]
        for arn in resource["Properties"].get("ManagedPolicyArns", []):
            if isinstance(arn, dict) and "Ref" in arn:
                documents.append(resources[arn["Ref"]]["Properties"]["PolicyDocument"])
        actions: set[str] = set()
        for document in documents:
            for statement in document["Statement"]:
                if "ApiKeysTable" in json.dumps(statement["Resource"]):
                    listed = statement["Action"]
                    actions |= {listed} if isinstance(listed, str) else set(listed)
        assert actions == {"dynamodb:GetItem", "dynamodb:DescribeTable"}, name


def _cache_name(stack_name: str, parameters: dict[str, str]) -> str:
    """The ServerlessCacheName CloudFormation gives the cache of ``stack_name``."""
    document = sam.load_template(TEMPLATE)
    value = document["Resources"]["RedisCache"]["Properties"]["ServerlessCacheName"]
    defaults = {n: str(p.get("Default", "")) for n, p in document["Parameters"].items()}
    given = {**defaults, **parameters}
    condition, named, default = value["Fn::If"]
    if _holds(document["Conditions"][condition], document["Conditions"], given):
        return given[named["Ref"]]
    return str(default["Fn::Sub"]).replace("${AWS::StackName}", stack_name)


def test_the_memory_cache_of_any_stack_name_has_a_name_elasticache_takes() -> None:
    """ElastiCache takes at most 40 lowercase letters, digits and single hyphens, from a
    letter, for a cache's name: a long stack name, or one with two hyphens in a row, made an
    invalid one and failed the stack at deploy time."""
    parameter = sam.load_template(TEMPLATE)["Parameters"]["MemoryCacheName"]
    names = {}
    for stack_name in [
        "my-agent",
        "a" * 33,
        "a" * 34,
        "Prod-AgentScope-Serverless-Stack-For-The-Support-Team-eu-west-1",
        "X" * 128,
        "my--agent",
        "agent-",
        "Agent",
    ]:
        given = sam.memory_cache_name(stack_name)
        parameters = {} if given is None else {"MemoryCacheName": given}
        name = _cache_name(stack_name, parameters).lower()  # ElastiCache keeps it lowercase
        assert len(name) <= 40 and re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", name), name
        if given is not None:
            assert len(given) <= parameter["MaxLength"]
            assert re.fullmatch(parameter["AllowedPattern"], given)
        names[stack_name] = name
    # A stack deployed before keeps its cache (a new name would replace it, and its memories).
    assert names["my-agent"] == "my-agent-memory"
    assert names["a" * 33] == "a" * 33 + "-memory"
    assert len(set(names.values())) == len(names)
    assert sam.memory_cache_name("a" * 40 + "x") != sam.memory_cache_name("a" * 40 + "y")
    for invalid in ["9lives", "my_agent", "a" * 129, ""]:
        with pytest.raises(PackagingError, match="is not a CloudFormation stack name"):
            sam.memory_cache_name(invalid)


def _routers_served(code_uri: str) -> tuple[str, ...]:
    """The routers a function's entry module serves (its ``make_handler([...])`` or
    ``ROUTERS``)."""
    tree = ast.parse((PROJECT_ROOT / code_uri / "agentscope_handler.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "make_handler":
            return tuple(ast.literal_eval(node.args[0]))
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "ROUTERS":
            return tuple(ast.literal_eval(node.value))
    raise AssertionError(f"no routers in {code_uri}")


def test_only_the_functions_using_the_cache_are_in_the_vpc() -> None:
    """A function in a VPC starts slower and reaches DynamoDB, Secrets Manager, the LLM
    API and the sandbox server only through a NAT: the sessions, state and sandbox
    functions, which never use the cache, were put there all the same."""
    document = sam.load_template(TEMPLATE)
    assert "VpcConfig" not in document["Globals"]["Function"]
    settings = load_settings(
        MEMORY_BACKEND="redis",
        REDIS_URL="redis://127.0.0.1:1/0",
        SESSION_HISTORY_BACKEND="in_memory",
        STATE_BACKEND="in_memory",
        RUNS_BACKEND="in_memory",
        SANDBOX_BASE_URL="https://sandbox.example",
        AUTH_KEYS_BACKEND="in_memory",
    )
    in_vpc = set()
    for name, spec in FUNCTIONS.items():
        app = create_app(_routers_served(spec.code_uri), settings=settings)
        uses_cache = app.state.context.services.memory is not None
        vpc = document["Resources"][name]["Properties"].get("VpcConfig")
        assert (vpc is not None) == uses_cache, name
        if vpc is not None:
            assert vpc == document["Resources"]["MemoryFunction"]["Properties"]["VpcConfig"]
            in_vpc.add(name)
    assert in_vpc == {"ProcessFunction", "ProcessStreamFunction", "TasksFunction", "MemoryFunction"}


def _resolved(value: Any, conditions: dict[str, Any], parameters: dict[str, str]) -> Any:
    """``value`` of a translated template as CloudFormation resolves it for ``parameters``
    (``Ref`` of parameters, ``Fn::If``, ``Fn::Split``, ``Fn::Join``; None for NoValue)."""
    if isinstance(value, list):
        return [_resolved(v, conditions, parameters) for v in value]
    if not isinstance(value, dict):
        return value
    if value == {"Ref": "AWS::NoValue"}:
        return None
    if len(value) == 1:
        [(function, argument)] = value.items()
        if function == "Ref" and argument in parameters:
            return parameters[argument]
        if function == "Fn::If":
            condition, then, otherwise = argument
            holds = _holds(conditions[condition], conditions, parameters)
            return _resolved(then if holds else otherwise, conditions, parameters)
        if function in ("Fn::Split", "Fn::Join"):
            separator, text = argument[0], _resolved(argument[1], conditions, parameters)
            return text.split(separator) if function == "Fn::Split" else separator.join(text)
    return {k: _resolved(v, conditions, parameters) for k, v in value.items()}


def test_every_function_url_answers_browsers_preflights_itself() -> None:
    """With AWS_IAM, a Function URL refuses a request it cannot authenticate before the
    function sees it, so a browser's preflight (an OPTIONS without a signature) got a 403
    and a page could not call the API: the URL's own CORS configuration answers it, and
    gives every answer its headers (the functions add none, so none comes twice)."""
    translated = _translated()
    resources, conditions = translated["Resources"], translated["Conditions"]
    defaults = {name: str(p.get("Default", "")) for name, p in translated["Parameters"].items()}
    urls = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::Lambda::Url"]
    assert len(urls) == 6
    for auth in ("AWS_IAM", "NONE"):
        for origins in ["https://app.example.com, https://admin.example.com:8443", "*", ""]:
            parameters = {**defaults, "FunctionUrlAuthType": auth, "CorsAllowOrigins": origins}
            for url in urls:
                cors = _resolved(url.get("Cors"), conditions, parameters)
                if not origins:
                    assert cors is None
                    continue
                assert cors["AllowOrigins"] == [o.strip() for o in origins.split(",")]
                assert {"GET", "POST", "DELETE"} <= set(cors["AllowMethods"])
                assert "authorization" in cors["AllowHeaders"]  # "*" leaves it out
                assert cors["ExposeHeaders"] == [h.lower() for h in EXPOSED_HEADERS]
    for resource in resources.values():
        if resource["Type"] == "AWS::Lambda::Function":
            variables = resource["Properties"].get("Environment", {}).get("Variables", {})
            assert "CORS_ALLOW_ORIGINS" not in variables


def test_subnets_without_security_groups_are_refused_before_anything_is_created() -> None:
    """The functions in the VPC and the cache were given the security group "" and the
    stack failed minutes into its creation, naming neither parameter."""
    document = sam.load_template(TEMPLATE)
    rules, conditions = document["Rules"], document["Conditions"]
    defaults = {n: str(p.get("Default", "")) for n, p in document["Parameters"].items()}

    def refusals(**given: str) -> list[str]:
        parameters: dict[str, Any] = {**defaults, **given}
        # A CommaDelimitedList is a list of its items ("" gives [""]).
        for name in ("SubnetIds", "SecurityGroupIds"):
            parameters[name] = parameters[name].split(",")
        return [
            assertion["AssertDescription"]
            for rule in rules.values()
            if _holds(rule.get("RuleCondition", True), conditions, parameters)
            for assertion in rule["Assertions"]
            if not _holds(assertion["Assert"], conditions, parameters)
        ]

    [refused] = refusals(SubnetIds="subnet-a,subnet-b")
    assert "SubnetIds need SecurityGroupIds" in refused
    [refused] = refusals(ExistingRedisUrl="rediss://cache.example:6379", SubnetIds="subnet-a")
    assert "SubnetIds need SecurityGroupIds" in refused
    assert refusals(SubnetIds="subnet-a", SecurityGroupIds="sg-1") == []
    assert refusals(ExistingRedisUrl="rediss://cache.example:6379") == []
    assert "needs SubnetIds" in refusals()[0]


def _arns_allowed(statement_resource: Any, parameters: dict[str, str]) -> list[str]:
    """The ARN patterns of a statement's ``Resource``, its parameters substituted."""
    values = statement_resource if isinstance(statement_resource, list) else [statement_resource]
    patterns = []
    for value in values:
        if isinstance(value, dict) and "Ref" in value:
            value = parameters[value["Ref"]]
        elif isinstance(value, dict) and "Fn::Sub" in value:
            text, variables = value["Fn::Sub"], {}
            if isinstance(text, list):
                text, variables = text
            for name, variable in variables.items():
                text = text.replace(f"${{{name}}}", parameters[variable["Ref"]])
            value = re.sub(r"\$\{(\w+)\}", lambda m: parameters[m.group(1)], text)
        patterns.append(value)
    return patterns


def _iam_matches(pattern: str, arn: str) -> bool:
    """Whether an IAM resource pattern (``*`` any characters, ``?`` one) matches ``arn``."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, arn) is not None


def _role_statements(
    translated: dict[str, Any], role: str, parameters: dict[str, str]
) -> list[dict[str, Any]]:
    """The policy statements ``role`` has (inline, and of the stack's managed policies) when
    the stack is deployed with ``parameters`` (the others at their defaults)."""
    conditions = translated["Conditions"]
    given = {
        **{name: str(p.get("Default", "")) for name, p in translated["Parameters"].items()},
        **parameters,
    }

    def chosen(value: Any) -> Any:  # an Fn::If's branch, or the value; None for NoValue
        if isinstance(value, dict) and "Fn::If" in value:
            condition, yes, no = value["Fn::If"]
            value = yes if _holds({"Condition": condition}, conditions, given) else no
        return None if value == {"Ref": "AWS::NoValue"} else value

    resources = translated["Resources"]
    properties = resources[role]["Properties"]
    documents = [
        policy["PolicyDocument"]
        for policy in map(chosen, properties.get("Policies", []))
        if policy is not None
    ]
    for arn in map(chosen, properties.get("ManagedPolicyArns", [])):
        if isinstance(arn, dict) and "Ref" in arn and arn["Ref"] in resources:
            documents.append(resources[arn["Ref"]]["Properties"]["PolicyDocument"])
    return [
        statement
        for document in documents
        for statement in map(chosen, document["Statement"])
        if statement is not None
    ]


@pytest.mark.parametrize("given", ["full", "partial"])
def test_the_functions_running_the_agent_can_read_its_secret_by_either_arn(given: str) -> None:
    """Secrets Manager appends six random characters to a secret's name in its ARN; the
    ARN without them (as written by hand from the name) finds the secret too, and the
    parameter takes it, but a policy naming that ARN matches no secret: every start of the
    process and tasks functions failed on AWS. Either ARN now reads that secret, and no
    other secret whose name begins like it."""
    prefix = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:"
    secret = f"{prefix}my-agent-secrets-Ab3dEf"
    others = [f"{prefix}my-agent-secrets-prod-Zx9yWv", f"{prefix}my-agent-Ab3dEf"]
    arn = secret if given == "full" else f"{prefix}my-agent-secrets"
    pattern = sam.load_template(TEMPLATE)["Parameters"]["AgentSecretsArn"]["AllowedPattern"]
    assert re.fullmatch(pattern, arn)
    translated = _translated()
    for function in ("ProcessFunction", "ProcessStreamFunction", "TasksFunction"):
        allowed: list[str] = []
        role = f"{function}Role"
        for statement in _role_statements(translated, role, {"AgentSecretsArn": arn}):
            if "AgentSecretsArn" in json.dumps(statement["Resource"]):
                assert statement["Action"] in (
                    "secretsmanager:GetSecretValue",
                    ["secretsmanager:GetSecretValue"],
                )
                allowed += _arns_allowed(statement["Resource"], {"AgentSecretsArn": arn})
        assert any(_iam_matches(p, secret) for p in allowed), (function, allowed)
        for other in others:
            assert not any(_iam_matches(p, other) for p in allowed), (function, other)


def test_a_secret_under_a_key_of_its_own_is_decrypted_through_secrets_manager_only() -> None:
    """A secret encrypted with a customer managed KMS key is read only by who may decrypt
    with that key: without AgentSecretsKeyArn the functions were refused it on AWS."""
    secret = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:my-agent-secrets-Ab3dEf"
    key = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    pattern = sam.load_template(TEMPLATE)["Parameters"]["AgentSecretsKeyArn"]["AllowedPattern"]
    assert re.fullmatch(pattern, key) and re.fullmatch(pattern, "")
    translated = _translated()

    def decrypting(role: str, parameters: dict[str, str]) -> list[dict[str, Any]]:
        statements = _role_statements(translated, role, parameters)
        return [s for s in statements if "kms:Decrypt" in json.dumps(s["Action"])]

    for function in ("ProcessFunction", "ProcessStreamFunction", "TasksFunction"):
        role = f"{function}Role"
        [statement] = decrypting(role, {"AgentSecretsArn": secret, "AgentSecretsKeyArn": key})
        assert statement["Effect"] == "Allow"
        assert statement["Resource"] == {"Ref": "AgentSecretsKeyArn"}
        via = statement["Condition"]["StringEquals"]["kms:ViaService"]
        assert via == {"Fn::Sub": "secretsmanager.${AWS::Region}.amazonaws.com"}
        # No key of its own (the account's default key), or no secret: nothing to decrypt.
        assert decrypting(role, {"AgentSecretsArn": secret}) == []
        assert decrypting(role, {"AgentSecretsKeyArn": key}) == []
    for function in ("SessionsFunction", "MemoryFunction", "StateFunction"):
        role = f"{function}Role"
        assert decrypting(role, {"AgentSecretsArn": secret, "AgentSecretsKeyArn": key}) == []


def test_a_function_and_its_layers_above_lambdas_unzipped_limit_fail_the_build(
    tmp_path: Path,
) -> None:
    # Built, it failed only at deploy time, in CloudFormation's words.
    project = tmp_path / "project"
    (project / "models").mkdir(parents=True)
    with (project / "models" / "weights.bin").open("wb") as weights:
        weights.truncate(sam.LAMBDA_UNZIPPED_LIMIT_BYTES)  # sparse: no disk written here
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    with pytest.raises(PackagingError) as raised:
        sam.build(project, build_dir=tmp_path / "build", agent="agent:app")
    message = str(raised.value)
    assert "ProcessFunction" in message and "SessionsFunction" in message
    assert "Lambda's limit of 262,144,000 bytes" in message
    assert re.search(r"the biggest: SharedLayer/python/models 262\.1 MB", message)
    assert not (tmp_path / "build").exists()


def test_a_project_module_named_as_the_standard_librarys_is_refused_for_the_layer(
    tmp_path: Path,
) -> None:
    # Lambda puts the task folder and the layer ahead of the standard library: the layer's
    # secrets.py was what starlette's `from secrets import token_hex` got, and no function
    # started; the build passed.
    project = tmp_path / "project"
    (project / "mypkg").mkdir(parents=True)
    (project / "mypkg" / "agent.py").write_text("app = None\n")
    (project / "secrets.py").write_text("def helper():\n    return 1\n")
    (project / "requirements.txt").write_text("agentscope-no-such-package==1\n")
    with pytest.raises(PackagingError, match=r"^the project's secrets\.py hides the standard "):
        sam.stage_project(project, tmp_path / "stage")
    assert not (tmp_path / "stage" / "shared" / "secrets.py").exists()
