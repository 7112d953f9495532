"""AWS SAM steps: lint, validate and build without Docker or an AWS account; deploy with one.

SAM CLI lives in its own virtualenv (``.venv-sam``, from ``requirements/sam.lock``) because its
pins clash with the runtime's; ``./scripts/bootstrap`` creates it. Every step runs the
project's own (its ``.venv-sam``), else this checkout's, else ``sam`` on the PATH.

>>> functions = list_functions(Path("template.yaml"))   # doctest: +SKIP
>>> functions["SessionsFunction"].handler               # doctest: +SKIP
'agentscope_handler.handler'

``sam build`` builds every function of the template whatever its ``Condition`` (both the
buffered and the streaming process function are in every build); CloudFormation picks one at
deploy time from ``ProcessInvokeMode``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentscope_serverless.errors import ConfigurationError, PackagingError
from agentscope_serverless.log import without_url_credentials
from agentscope_serverless.packaging import project
from agentscope_serverless.settings import check_setting_variables, closest_name

PLACEHOLDER_REGION = "us-east-1"
TEMPLATE = "template.yaml"
DEFAULT_BUILD_DIR = Path(".aws-sam") / "build"

# CloudFormation's short tags, read as the long form they stand for (``!Ref X`` is
# ``{"Ref": "X"}``, ``!GetAtt A.B`` is ``{"Fn::GetAtt": ["A", "B"]}``, ``!Sub s`` is
# ``{"Fn::Sub": "s"}``), so a loaded template means what CloudFormation reads.
_UNPREFIXED_TAGS = {"Ref", "Condition"}


@dataclass(frozen=True)
class FunctionSpec:
    """A function of the template: its logical id, code directory, handler and runtime."""

    name: str
    code_uri: str
    handler: str
    runtime: str | None
    condition: str | None


def _intrinsic(tag: str, node: Any, loader: Any) -> dict[str, Any]:
    import yaml

    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        if tag == "GetAtt":
            value = str(value).split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return {tag if tag in _UNPREFIXED_TAGS else f"Fn::{tag}": value}


def load_template(template: Path) -> dict[str, Any]:
    """The template as CloudFormation reads it (short tags expanded to their long form).

    >>> load_template(Path("template.yaml"))["Outputs"]["SessionsUrl"]["Value"]  # doctest: +SKIP
    {'Fn::GetAtt': ['SessionsFunctionUrl', 'FunctionUrl']}
    """
    import yaml

    class _Loader(yaml.SafeLoader):
        """A safe loader that also knows CloudFormation's short tags."""

    _Loader.add_multi_constructor(
        "!", lambda loader, suffix, node: _intrinsic(suffix, node, loader)
    )
    try:
        document = yaml.load(template.read_text(), Loader=_Loader)  # noqa: S506 - safe subclass
    except (OSError, yaml.YAMLError) as exc:
        raise PackagingError(f"cannot read {template}: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("Resources"), dict):
        raise PackagingError(f"{template} is not a CloudFormation template (no Resources)")
    return document


def list_functions(template: Path) -> dict[str, FunctionSpec]:
    """Every ``AWS::Serverless::Function`` of the template (``Globals`` applied)."""
    document = load_template(template)
    defaults = document.get("Globals", {}).get("Function", {})
    functions = {}
    for name, resource in document["Resources"].items():
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        properties = {**defaults, **resource.get("Properties", {})}
        if "CodeUri" not in properties or "Handler" not in properties:
            raise PackagingError(f"{name} needs a CodeUri and a Handler (zip packages only)")
        functions[name] = FunctionSpec(
            name=name,
            code_uri=str(properties["CodeUri"]),
            handler=str(properties["Handler"]),
            runtime=properties.get("Runtime"),
            condition=resource.get("Condition"),
        )
    return functions


def functions_json(template: Path) -> str:
    """The template's functions as JSON: ``{name: {code_uri, handler, runtime, condition}}``."""
    return json.dumps(
        {
            name: {
                "code_uri": spec.code_uri,
                "handler": spec.handler,
                "runtime": spec.runtime,
                "condition": spec.condition,
            }
            for name, spec in list_functions(template).items()
        },
        indent=2,
    )


def sam_executable(project_root: Path) -> str:
    """The ``sam`` command: the project's ``.venv-sam`` (or this checkout's), then the PATH."""
    candidates = [project_root / ".venv-sam" / "bin" / "sam", _checkout() / ".venv-sam/bin/sam"]
    local = next((c for c in candidates if c.exists()), None)
    found = str(local) if local is not None else shutil.which("sam")
    if not found:
        raise PackagingError(
            "SAM CLI is not installed: install it in its own virtualenv of the project "
            "(python3 -m venv .venv-sam && .venv-sam/bin/pip install aws-sam-cli), or put "
            "'sam' on the PATH"
        )
    return found


def configured_region() -> str | None:
    """The region the AWS SDK would use (environment, then the profile's config), or None."""
    import botocore.session

    region = botocore.session.get_session().get_config_variable("region")
    return str(region) if region else None


def has_credentials() -> bool:
    """Whether botocore's credential chain finds credentials (env, files, SSO, roles...)."""
    import botocore.session

    return botocore.session.get_session().get_credentials() is not None


def _sam_env(*, offline: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["SAM_CLI_TELEMETRY"] = "0"
    if offline and not (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")):
        # Lint and build need some region; a placeholder must never steer a deploy.
        env["AWS_DEFAULT_REGION"] = PLACEHOLDER_REGION
    return env


def _run_sam(project_root: Path, *args: str, offline: bool = True, cwd: Path | None = None) -> str:
    """``sam <args>`` found from ``project_root`` (:func:`sam_executable`), run in ``cwd``
    (default: the project)."""
    result = subprocess.run(
        [sam_executable(project_root), *args],
        cwd=cwd or project_root,
        env=_sam_env(offline=offline),
        capture_output=True,
        text=True,
        check=False,
    )
    output = (result.stdout + result.stderr).strip()
    if result.returncode != 0:
        tail = "\n".join(output.splitlines()[-20:])
        # pip, installing the layer's requirements, quotes their index URLs with passwords.
        raise PackagingError(f"sam {args[0]} failed:\n{without_url_credentials(tail)}")
    return output


def _checkout() -> Path:
    return project.PACKAGE_DIR.parents[1]


def assets() -> Path:
    """Where ``template.yaml`` and ``functions/`` are: inside the installed package, else
    this source checkout."""
    packaged = project.PACKAGE_DIR / "sam_project"
    root = packaged if (packaged / TEMPLATE).is_file() else _checkout()
    if not (root / TEMPLATE).is_file() or not (root / "functions").is_dir():
        raise PackagingError(f"the SAM template is missing from {project.PACKAGE_DIR}")
    return root


def validate(project_root: Path) -> str:
    """``sam validate --lint`` (cfn-lint rules included); offline, no credentials needed."""
    return _run_sam(project_root, "validate", "--lint", "--template-file", TEMPLATE, cwd=assets())


def stage_project(
    source: Path, stage: Path, *, agent: str | None = None, leave_out: Sequence[Path] = ()
) -> Path:
    """A SAM project for ``source`` in ``stage``: the template and the functions, and a layer
    folder with the runtime, the project's code and their requirements (Python 3.11, x86_64).

    The layer is on every function's import path (``/opt/python``), so the process functions
    import the project's agent from there. ``agent`` becomes the ``AgentApp`` default.
    ``stage`` and ``leave_out`` (the build folder) are not copied as the project's code.
    """
    root = assets()
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    template = (root / TEMPLATE).read_text()
    if agent is not None:
        default = "Default: agentscope_serverless.agents.demo:app"
        if default not in template:
            raise PackagingError("the template's AgentApp parameter has no default to replace")
        template = template.replace(default, f"Default: {agent}", 1)
    (stage / TEMPLATE).write_text(template)
    shutil.copytree(
        root / "functions", stage / "functions", ignore=shutil.ignore_patterns("__pycache__")
    )
    layer = stage / "shared"
    layer.mkdir()
    project.copy_runtime(layer, excluded=project.LAMBDA_EXCLUDED)
    project.copy_project(source, layer, leave_out=(stage, *leave_out))
    # After the project's files: SAM installs this one, the runtime's pins and the project's.
    resolved = project.resolve_requirements(
        source,
        layer / "requirements.txt",
        python_version="3.11",
        platform="manylinux2014_x86_64",
        with_sources=True,
    )
    project.refuse_path_requirements(resolved, "the SAM layer's build")
    return stage


# The AWS SDK's service models the runtime uses (the stores, the stack's secret, background
# tasks invoking the tasks function); the others (most of botocore) are dropped from the layer.
BOTOCORE_SERVICES = ("dynamodb", "lambda", "secretsmanager", "sts")


def slim_layer(layer: Path) -> None:
    """Drop what a function does without from the built layer: bytecode caches, the
    requirements SAM installed (their index URL may hold a password), uvloop, httptools, the
    unused service models of botocore and the symbol tables of extension modules."""
    for cache in list(layer.rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)
    (layer / "requirements.txt").unlink(missing_ok=True)
    # uvloop (14 MB, 40% of the layer) and httptools speed up a server with many connections
    # at once; an execution environment serves one request at a time, and uvicorn runs on
    # asyncio's loop and h11 without them.
    for name in ("uvloop", "httptools"):
        for path in [layer / name, *layer.glob(f"{name}-*.dist-info")]:
            shutil.rmtree(path, ignore_errors=True)
    data = layer / "botocore" / "data"
    if data.is_dir():
        for service in data.iterdir():
            if service.is_dir() and service.name not in BOTOCORE_SERVICES:
                shutil.rmtree(service)
    # Symbols only a debugger reads: a quarter of the layer (aiohttp's, multidict's...).
    # Where ``strip`` cannot read Linux binaries (or is missing), they stay as they are.
    strip = shutil.which("strip")
    if strip is not None:
        for extension in layer.rglob("*.so"):
            subprocess.run(
                [strip, "--strip-unneeded", str(extension)], capture_output=True, check=False
            )


# Where Lambda mounts the layer's ``python`` folder: the file names bytecode-only modules
# show in tracebacks.
LAYER_PATH = "/opt/python"


def _distribution_name(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def installed_sources(layer: Path, requirements: Path) -> list[Path]:
    """The ``.py`` files that the distributions pinned in ``requirements`` installed in
    ``layer`` (as their ``RECORD`` lists them)."""
    wanted = {
        _distribution_name(re.split(r"[=<>~!;\[ ]", pin, maxsplit=1)[0])
        for pin in project.pinned(requirements)
    }
    sources = []
    for record in sorted(layer.glob("*.dist-info/RECORD")):
        if _distribution_name(record.parent.name.split("-")[0]) not in wanted:
            continue
        for row in csv.reader(record.read_text().splitlines()):
            path = (layer / row[0]).resolve() if row else layer
            if path.suffix == ".py" and path.is_file() and layer.resolve() in path.parents:
                sources.append(path)
    return sources


def _compileall(python: str, layer: Path, *args: str) -> None:
    # A file that does not compile (none in the runtime) stays a source, imported as before.
    subprocess.run(
        [
            python,
            "-I",
            "-m",
            "compileall",
            "-q",
            "-j",
            "0",
            "--invalidation-mode",
            "unchecked-hash",
            "-s",
            str(layer),
            "-p",
            LAYER_PATH,
            *args,
        ],
        capture_output=True,
        check=False,
    )


def compile_layer(layer: Path, *, runtime_requirements: Path, python: str) -> None:
    """Ship the layer's modules compiled by ``python`` (the functions' CPython).

    Lambda mounts the layer read-only: Python cannot cache the bytecode it compiles there,
    so without it every cold start compiles each module it imports from source (twice the
    import time). The runtime's pinned dependencies (``runtime_requirements``) ship as
    bytecode alone, in place of their sources, which would not fit beside it within the
    layer's budget; their tracebacks name the file and line, without the line's text. This
    package and the project's code and requirements keep their sources beside their
    bytecode. The bytecode is not checked against the sources (``unchecked-hash``): a
    deployed layer never changes.
    """
    bytecode_only = installed_sources(layer, runtime_requirements)
    with tempfile.TemporaryDirectory() as scratch:
        listing = Path(scratch) / "sources.txt"
        listing.write_text("".join(f"{source}\n" for source in bytecode_only))
        _compileall(python, layer, "-b", "-i", str(listing))
    for source in bytecode_only:
        if source.with_suffix(".pyc").is_file():
            source.unlink()
    _compileall(python, layer, str(layer))


def check_layer_requirements(project_root: Path) -> None:
    """A plain ``sam build`` of the checkout installs ``shared/requirements.txt``, and
    packaging the package's ``runtime.lock``: both must be the pinned runtime lock."""
    lock = project_root / "requirements" / "runtime.lock"
    for copy in (project_root / "shared" / "requirements.txt", project.RUNTIME_LOCK):
        if not copy.is_file() or copy.read_text() != lock.read_text():
            raise PackagingError(
                f"{copy} differs from {lock}: run ./scripts/lock so the layer gets the pinned set"
            )


# Lambda's limit on a function's code and its layers together, unzipped.
LAMBDA_UNZIPPED_LIMIT_BYTES = 262_144_000
# How many of the biggest entries a build above the limit names.
BIGGEST_SHOWN = 5


def _tree_bytes(path: Path) -> int:
    """The bytes of the file ``path``, or of the files under the folder ``path``, as
    unzipped (a link counted as itself)."""
    if not path.is_dir() or path.is_symlink():
        return path.lstat().st_size
    return sum(
        os.lstat(os.path.join(folder, name)).st_size
        for folder, _, files in os.walk(path)
        for name in files
    )


def check_unzipped_size(target: Path) -> None:
    """Refuse the build in ``target`` when a function's code and the shared layer, unzipped,
    are above :data:`LAMBDA_UNZIPPED_LIMIT_BYTES`: the deploy would fail on it, after the
    upload. The error names the functions, their sizes, the limit and the biggest entries of
    the layer and of the biggest function's code. A layer the template takes from elsewhere
    (the streaming function's Web Adapter, a few MB) is not here to be measured."""
    layer = target / "SharedLayer"
    layer_bytes = _tree_bytes(layer)
    codes = {
        name: target / spec.code_uri for name, spec in list_functions(target / TEMPLATE).items()
    }
    over = {name: _tree_bytes(code) for name, code in codes.items()}
    over = {
        name: size
        for name, size in over.items()
        if size + layer_bytes > LAMBDA_UNZIPPED_LIMIT_BYTES
    }
    if not over:
        return
    biggest_code = codes[max(over, key=over.__getitem__)]
    entries = [*(layer / "python").iterdir(), *biggest_code.iterdir()]
    sizes = sorted(((_tree_bytes(entry), entry) for entry in entries), reverse=True)
    named = ", ".join(
        f"{entry.relative_to(target)} {size / 1e6:.1f} MB" for size, entry in sizes[:BIGGEST_SHOWN]
    )
    functions = ", ".join(
        f"{name} {size + layer_bytes:,} bytes (its code {size:,})" for name, size in over.items()
    )
    raise PackagingError(
        f"unzipped, with the shared layer ({layer_bytes:,} bytes), {functions} "
        f"{'is' if len(over) == 1 else 'are'} above Lambda's limit of "
        f"{LAMBDA_UNZIPPED_LIMIT_BYTES:,} bytes for a function's code and its layers; the "
        f"biggest: {named}: leave large files (models, data) out of the project and load them "
        "when the agent runs (from S3, say), or drop requirements"
    )


def _refuse_build_dir(target: Path, project_root: Path) -> None:
    """Refuse a build folder the build would empty of what is not its own: SAM removes the
    build folder's contents first (and a failed build the folder), and checks only that it
    holds none of the SAM project's folders, which are staged elsewhere here."""
    if target == project_root or target in project_root.parents:
        raise PackagingError(
            f"--build-dir {target} is or holds the project folder {project_root}: the build "
            "empties it first, deleting the project; choose a folder of its own (by default "
            f"{DEFAULT_BUILD_DIR})"
        )
    if target.is_dir() and any(target.iterdir()) and not (target / TEMPLATE).is_file():
        raise PackagingError(
            f"--build-dir {target} holds files of no earlier build: the build empties it "
            "first, deleting them; choose a new folder, or an earlier build's"
        )


@contextmanager
def _none_left_on_failure(target: Path) -> Iterator[None]:
    """Remove the build folder ``target`` when the block fails or is stopped (Ctrl-C, a
    signal's exception): half a build is none."""
    try:
        yield
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def build(project_root: Path, *, build_dir: Path | None = None, agent: str | None = None) -> Path:
    """``sam build`` of the project in ``project_root`` with the local interpreter (no
    container); returns the build directory.

    Every function and the shared layer are built, whatever the template's conditions; the
    layer holds the runtime, the project's code and requirements. Each function's code with
    the layer must be within Lambda's unzipped limit (:func:`check_unzipped_size`), and
    ``agent`` (default: the template's) must import from the built layer alone, else nothing
    is left built, as when ``sam build`` fails or the build is stopped (Ctrl-C, a signal).
    """
    target = (build_dir or project_root / DEFAULT_BUILD_DIR).resolve()
    _refuse_build_dir(target, project_root.resolve())
    # The SAM project is staged in a folder of its own, gone with the build: beside the build
    # folder, a folder of that name could be the user's project (emptied by staging) or
    # another build's stage.
    with tempfile.TemporaryDirectory(prefix="agentscope-sam-") as scratch:
        stage = stage_project(
            project_root, Path(scratch) / "sam-project", agent=agent, leave_out=(target,)
        )
        with _none_left_on_failure(target):
            _run_sam(
                project_root,
                "build",
                "--template-file",
                TEMPLATE,
                "--build-dir",
                str(target),
                cwd=stage,
            )
        staged = [entry.name for entry in (stage / "shared").iterdir()]
    with _none_left_on_failure(target):
        layer = target / "SharedLayer" / "python"
        project.refuse_shadowing(staged, layer)
        project.refuse_standard_shadowing(layer, python_version="3.11")
        project.check_portable(project.installed_tags(layer), "manylinux2014_x86_64")
        slim_layer(layer)
        compile_layer(
            layer, runtime_requirements=project.runtime_lock(), python=project.interpreter("3.11")
        )
        check_unzipped_size(target)
        project.check_agent_import(
            agent or "agentscope_serverless.agents.demo:app",
            [target / "ProcessFunction", layer],
            python_version="3.11",
        )
    return target


def stack_outputs(stack_name: str, region: str | None = None) -> dict[str, str]:
    """The outputs of a deployed stack (needs AWS credentials)."""
    import boto3

    client = boto3.client("cloudformation", region_name=region)
    stacks = client.describe_stacks(StackName=stack_name)["Stacks"]
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}


def parameter_overrides(parameters: dict[str, str]) -> list[str]:
    """The words of ``sam deploy --parameter-overrides`` giving ``parameters``: each value
    quoted (SAM splits the words at spaces: ``CorsAllowOrigins=a, b`` would lose ``b``).
    SAM takes a backslash in a quoted value for an escape, so a value may not hold one."""
    words = []
    for name, value in parameters.items():
        if "\\" in value:
            raise PackagingError(
                f"the {name} parameter holds a backslash, which SAM's --parameter-overrides "
                "cannot carry as it is"
            )
        quoted = value.replace('"', '\\"')
        words.append(f'{name}="{quoted}"')
    return words


# What CloudFormation takes as a stack name, and ElastiCache as a cache's.
_STACK_NAME = re.compile(r"[a-zA-Z][-a-zA-Z0-9]{0,127}")
_CACHE_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
CACHE_NAME_MAX_CHARS = 40


# A field of a secret the template writes from a parameter: ``"llm_api_key": "${LlmApiKey}"``.
_SECRET_FIELD = re.compile(r'"(\w+)"\s*:\s*"\$\{(\w+)\}"')


def setting_parameters(document: Mapping[str, Any]) -> dict[str, str]:
    """The parameters of the template ``document`` (:func:`load_template`) the functions read
    as settings as they are, with the setting's variable: those an environment variable of
    every function is (``LLM_BASE_URL: !Ref LlmBaseUrl``) and those a field of a secret is
    (``"llm_api_key": "${LlmApiKey}"``, read from ``SECRETS_ARN``).

    >>> setting_parameters(load_template(Path("template.yaml")))["LlmBaseUrl"]  # doctest: +SKIP
    'LLM_BASE_URL'
    """
    parameters = document.get("Parameters", {})
    variables = document.get("Globals", {}).get("Function", {}).get("Environment", {})
    found = {
        value["Ref"]: name
        for name, value in variables.get("Variables", {}).items()
        if isinstance(value, dict) and list(value) == ["Ref"] and value["Ref"] in parameters
    }
    for resource in document.get("Resources", {}).values():
        text = resource.get("Properties", {}).get("SecretString")
        if resource.get("Type") == "AWS::SecretsManager::Secret" and isinstance(text, dict):
            for field, parameter in _SECRET_FIELD.findall(str(text.get("Fn::Sub", ""))):
                if parameter in parameters:
                    found[parameter] = field.upper()
    return found


def check_parameters(parameters: Mapping[str, str], template: Path | None = None) -> None:
    """Raise :class:`PackagingError` naming each of ``parameters`` that ``template`` (default:
    the package's) does not have: SAM would drop it without a word (a misspelt
    ``LLMApiKey`` deploys a stack without the key); and as the functions would refuse to
    start, when a parameter that is a setting (:func:`setting_parameters`) has a value the
    setting does not take."""
    document = load_template(template or assets() / TEMPLATE)
    known = list(document.get("Parameters", {}))
    unknown = [name for name in parameters if name not in known]
    if unknown:
        guesses = {name: closest_name(name, known) for name in unknown}
        named = ", ".join(
            f"{name} (did you mean {guesses[name]}?)" if guesses[name] else name for name in unknown
        )
        raise PackagingError(
            f"the template has no parameter {named}; its parameters: {', '.join(known)}"
        )
    settings = setting_parameters(document)
    given = {name: settings[name] for name in parameters if name in settings}
    try:
        check_setting_variables({given[name]: parameters[name] for name in given})
    except ConfigurationError as exc:
        read_as = ", ".join(f"{name} is {variable}" for name, variable in given.items())
        raise PackagingError(f"{exc.message} (of the parameters: {read_as})") from None


def check_stack_name(stack_name: str) -> None:
    """Raise :class:`PackagingError` unless CloudFormation takes ``stack_name``."""
    if not _STACK_NAME.fullmatch(stack_name):
        raise PackagingError(
            f"{stack_name!r} is not a CloudFormation stack name: at most 128 letters, digits "
            "and hyphens, beginning with a letter"
        )


def memory_cache_name(stack_name: str) -> str | None:
    """The ``MemoryCacheName`` a stack named ``stack_name`` needs: None when the template's
    own ``<stack name>-memory`` is a valid cache name (stacks deployed before keep their
    cache: renaming replaces it), else a valid name made from the stack's, with a digest of
    it so that two long names alike still differ.

    >>> memory_cache_name("my-agent") is None
    True
    >>> memory_cache_name("My--Agent-")
    'my-agent-memory-8ed450ea'
    """
    check_stack_name(stack_name)
    default = f"{stack_name}-memory".lower()
    if len(default) <= CACHE_NAME_MAX_CHARS and _CACHE_NAME.fullmatch(default):
        return None
    digest = hashlib.sha256(stack_name.encode()).hexdigest()[:8]
    words = "-".join(re.findall(r"[a-z0-9]+", stack_name.lower()))
    room = CACHE_NAME_MAX_CHARS - len(f"--memory-{digest}")
    return "-".join(filter(None, [words[:room].strip("-"), "memory", digest]))


def deploy(
    project_root: Path,
    stack_name: str,
    *,
    parameters: dict[str, str] | None = None,
    build_dir: Path | None = None,
    region: str | None = None,
) -> dict[str, str]:
    """``sam deploy`` of a built stack, then its outputs (needs AWS credentials and a region).

    ``build_dir`` is where :func:`build` wrote the stack (default ``.aws-sam/build``).
    Parameters go on SAM's command line: keep secrets (``LlmApiKey``...) out of shared hosts.
    """
    region = region or configured_region()
    if not region:
        raise PackagingError("no AWS region: set AWS_REGION or a region in the AWS profile")
    built = (build_dir or project_root / DEFAULT_BUILD_DIR).resolve() / TEMPLATE
    if not built.is_file():
        raise PackagingError(f"{built} is missing: build the stack first")
    check_parameters(parameters or {}, built)
    args = [
        "deploy",
        "--template-file",
        str(built),
        "--stack-name",
        stack_name,
        "--region",
        region,
        "--resolve-s3",
        "--capabilities",
        "CAPABILITY_IAM",
        "--no-confirm-changeset",
        "--no-fail-on-empty-changeset",
    ]
    cache_name = memory_cache_name(stack_name)
    parameters = {
        **({"MemoryCacheName": cache_name} if cache_name is not None else {}),
        **(parameters or {}),
    }
    if parameters:
        args += ["--parameter-overrides", *parameter_overrides(parameters)]
    _run_sam(project_root, *args, offline=False)
    return stack_outputs(stack_name, region)


def delete(project_root: Path, stack_name: str, *, region: str | None = None) -> None:
    """``sam delete`` of the stack (its tables are retained: ``DeletionPolicy: Retain``)."""
    region = region or configured_region()
    if not region:
        raise PackagingError("no AWS region: set AWS_REGION or a region in the AWS profile")
    _run_sam(
        project_root,
        "delete",
        "--stack-name",
        stack_name,
        "--region",
        region,
        "--no-prompts",
        offline=False,
    )


__all__ = [
    "DEFAULT_BUILD_DIR",
    "LAMBDA_UNZIPPED_LIMIT_BYTES",
    "FunctionSpec",
    "assets",
    "build",
    "check_layer_requirements",
    "check_parameters",
    "check_stack_name",
    "check_unzipped_size",
    "compile_layer",
    "configured_region",
    "delete",
    "deploy",
    "functions_json",
    "has_credentials",
    "installed_sources",
    "list_functions",
    "load_template",
    "memory_cache_name",
    "sam_executable",
    "setting_parameters",
    "slim_layer",
    "stack_outputs",
    "stage_project",
    "validate",
]
