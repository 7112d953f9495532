"""``agentscope-serverless deploy ...``: the SAM stack and the AgentRun/ModelStudio archives.

::

    agentscope-serverless deploy sam validate          # sam validate --lint, offline
    agentscope-serverless deploy sam build --agent mypkg.agent:app   # sam build, no Docker
    agentscope-serverless deploy sam deploy --stack-name my-agent --param LlmModel=gpt-4o-mini
    agentscope-serverless deploy sam functions         # the template's functions as JSON
    agentscope-serverless deploy agentrun --agent mypkg.agent:app --out dist/
    agentscope-serverless deploy modelstudio --agent mypkg.agent:app --out dist/ -r openai==1.40

The scripts in ``deploy/`` run the same commands. The project packaged (the agent's code and
its ``requirements.txt``) is ``--source``, else ``AGENTSCOPE_PROJECT_ROOT``, else the working
directory; an archive installs the ``--requirement``/``-r`` entries with its requirements (as
the deployers' ``requirements=[...]``). The runtime comes from this package, pinned by its
``runtime.lock``. Exit codes: 0 done, 1 failed, 3 not deployed: no AWS credentials (the
stack is built), or Alibaba Cloud credentials ask for an upload this build cannot do (nothing
is built; ``--skip-upload`` builds the archive); a build (an archive's, the stack's) stopped by
SIGTERM or Ctrl-C exits with 143 or 130 once it has removed what it wrote.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentscope_serverless.errors import AgentScopeServerlessError, UploadNotAvailableError
from agentscope_serverless.packaging.archives import DEFAULT_PYTHON

if TYPE_CHECKING:
    from agentscope_serverless.deployers.archive import ArchiveDeployManager

NOT_DEPLOYED = 3

console = Console(soft_wrap=True, highlight=False, emoji=False)
errors = Console(stderr=True, soft_wrap=True, highlight=False, emoji=False)

deploy_app = typer.Typer(
    help="Build and deploy: the SAM stack (AWS Lambda) or AgentRun/ModelStudio archives.",
    no_args_is_help=True,
)
sam_app = typer.Typer(
    help="The AWS SAM stack of template.yaml: validate, build and deploy it.",
    no_args_is_help=True,
    add_completion=False,
)
agentrun_app = typer.Typer(add_completion=False)
modelstudio_app = typer.Typer(add_completion=False)
deploy_app.add_typer(sam_app, name="sam")

ProjectRootOption = Annotated[
    Path,
    typer.Option(
        "--source",
        "--project-root",
        envvar="AGENTSCOPE_PROJECT_ROOT",
        help="The project folder: the agent's code and its requirements.txt "
        "(.git, virtualenvs, caches, dist/ and secrets are left out).",
        # Checked before anything is built: a file, or nothing, is said to be one at once.
        exists=True,
        file_okay=False,
    ),
]
SamAgentOption = Annotated[
    str | None,
    typer.Option(
        "--agent",
        help="The AgentApp to serve, as module:attribute, the default of the AgentApp "
        "parameter (needed for a project of your own; without it, the demo agent).",
    ),
]
BuildDirOption = Annotated[
    Path | None, typer.Option("--build-dir", help="Where sam build writes (.aws-sam/build).")
]
AgentOption = Annotated[
    str | None,
    typer.Option(
        "--agent",
        help="The AgentApp to serve, as module:attribute (needed for a project of your own; "
        "without it, the demo agent).",
    ),
]
OutOption = Annotated[Path, typer.Option("--out", help="Directory for the archive.")]
PythonOption = Annotated[
    str,
    typer.Option(
        "--python-version", help="CPython version of the platform's runtime (major.minor)."
    ),
]
NameOption = Annotated[
    str | None,
    typer.Option(
        "--name",
        help="Name of the app and the archive, <name>-agentrun.zip or <name>-modelstudio.zip "
        "(default: the project folder's).",
    ),
]
EnvOption = Annotated[
    list[str] | None,
    typer.Option("--env", help="KEY=VALUE in the service's environment (repeatable)."),
]
RequirementOption = Annotated[
    list[str] | None,
    typer.Option(
        "--requirement",
        "-r",
        help="A requirement to install with the project's requirements.txt (openai==1.40, "
        "name @ URL), or where packages are: '--index-url URL', '--extra-index-url URL' or "
        "'--find-links PATH' (repeatable).",
    ),
]
SkipUploadOption = Annotated[
    bool, typer.Option("--skip-upload", help="Build only, even with Alibaba Cloud credentials.")
]


def _fail(message: str, code: int = 1) -> NoReturn:
    errors.print(f"[bold red]error:[/bold red] {escape(message)}", markup=True)
    raise typer.Exit(code)


def _pairs(values: list[str] | None, option: str) -> dict[str, str]:
    pairs = {}
    for number, value in enumerate(values or [], start=1):
        key, separator, rest = value.partition("=")
        if not separator or not key:
            # Not shown: it may be a secret mistyped, and the error goes to a terminal or a log.
            _fail(f"{option} takes KEY=VALUE: {option} number {number} is not of that form")
        pairs[key] = rest
    return pairs


HEARTBEAT_SECONDS = 10.0


@contextmanager
def _steps(first: str) -> Iterator[Callable[[str], None]]:
    """A spinner with the current step; yields the function that moves to the next step.

    When the output is not a terminal (CI, a pipe, a log file) a spinner shows nothing, so
    each step is printed as it begins, with a line every ``HEARTBEAT_SECONDS`` while it lasts.
    """
    if not console.is_terminal:
        with _plain_steps(first) as step:
            yield step
        return
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(first)
        shown = [first]

        def step(line: str) -> None:
            # "zipped 500/4215 files" updates the line; any other text is a new step.
            if not line.startswith("zipped ") and shown[-1] != line:
                console.print(f"[green]✓[/green] {shown[-1]}")
                shown.append(line)
            progress.update(task, description=line)

        yield step
        console.print(f"[green]✓[/green] {shown[-1]}")


@contextmanager
def _plain_steps(first: str) -> Iterator[Callable[[str], None]]:
    current: dict[str, Any] = {"step": first, "since": time.monotonic(), "detail": ""}
    lock = threading.Lock()
    finished = threading.Event()

    def say(text: str) -> None:
        console.print(text, markup=False)
        console.file.flush()

    def step(line: str) -> None:
        with lock:
            if line.startswith("zipped "):
                current["detail"] = line
                return
            if line != current["step"]:
                current.update(step=line, since=time.monotonic(), detail="")
                say(f"{line}...")

    def heartbeat() -> None:
        while not finished.wait(HEARTBEAT_SECONDS):
            with lock:
                elapsed = time.monotonic() - current["since"]
                detail = f", {current['detail']}" if current["detail"] else ""
                say(f"  still {current['step']} ({elapsed:.0f} s{detail})")

    say(f"{first}...")
    beating = threading.Thread(target=heartbeat, daemon=True)
    beating.start()
    try:
        yield step
    finally:
        finished.set()
        beating.join()
    say("done")


def _run(action: Callable[[], Any]) -> Any:
    try:
        return action()
    except AgentScopeServerlessError as exc:
        _fail(exc.message)


def _refuse_sam_demo_agent(project_root: Path, build_dir: Path | None) -> None:
    """Exit before anything is built when the stack of a project of its own would serve the
    demo agent (:func:`~agentscope_serverless.deployers.archive.refuse_missing_app`)."""
    from agentscope_serverless.deployers.archive import refuse_missing_app
    from agentscope_serverless.packaging.sam import DEFAULT_BUILD_DIR

    root = project_root.resolve()
    try:
        refuse_missing_app(
            root,
            (build_dir or root / DEFAULT_BUILD_DIR).resolve(),
            give="--agent module:attribute",
            built="stack",
        )
    except AgentScopeServerlessError as exc:
        _fail(exc.message, code=2)


@sam_app.command("validate")
def sam_validate(project_root: ProjectRootOption = Path()) -> None:
    """Lint and validate template.yaml (sam validate --lint); needs no AWS account."""
    from agentscope_serverless.packaging import sam

    with _steps("sam validate --lint"):
        output = _run(lambda: sam.validate(project_root))
    console.print(output, markup=False)


@sam_app.command("build")
def sam_build(
    project_root: ProjectRootOption = Path(),
    build_dir: BuildDirOption = None,
    agent: SamAgentOption = None,
) -> None:
    """Build every function and the shared layer (runtime, the project's code and
    requirements) with the local Python (no Docker)."""
    from agentscope_serverless.packaging import sam
    from agentscope_serverless.packaging.project import secrets_left_out

    if agent is None:
        _refuse_sam_demo_agent(project_root, build_dir)
    with _exit_on_signals(), _steps("sam build (every function and the shared layer)"):
        built = _run(lambda: sam.build(project_root, build_dir=build_dir, agent=agent))
    console.print(f"[bold green]Built[/bold green] {built}")
    _say_left_out(_run(lambda: secrets_left_out(project_root)))


@sam_app.command("deploy")
def sam_deploy(
    stack_name: Annotated[str, typer.Option("--stack-name", help="The CloudFormation stack.")],
    param: Annotated[
        list[str] | None,
        typer.Option("--param", help="A template parameter, KEY=VALUE (repeatable)."),
    ] = None,
    region: Annotated[
        str | None, typer.Option("--region", help="AWS region (default: the SDK's).")
    ] = None,
    project_root: ProjectRootOption = Path(),
    build_dir: BuildDirOption = None,
    agent: SamAgentOption = None,
) -> None:
    """Validate, build and, with AWS credentials, deploy; print the Function URLs."""
    from agentscope_serverless.deployers.sam_deployer import SAMDeployManager

    parameters = _pairs(param, "--param")
    if agent is None and "AgentApp" not in parameters:
        _refuse_sam_demo_agent(project_root, build_dir)
    with _exit_on_signals(), _steps("starting") as step:
        manager = SAMDeployManager(
            project_root,
            stack_name,
            parameters,
            build_dir=build_dir,
            region=region,
            progress=step,
            agent=agent,
        )
        info = _run(manager.deploy_sync)  # in this thread: a stop signal reaches the build
    _say_left_out(info["left_out"])
    if not info["deployed"]:
        console.print(f"[bold green]Built[/bold green] {info['build_dir']}")
        errors.print(f"[bold yellow]not deployed:[/bold yellow] {escape(info['reason'])}")
        raise typer.Exit(NOT_DEPLOYED)
    table = Table("output", "value", title=f"stack {stack_name}")
    for name, value in info["outputs"].items():
        table.add_row(name, value)
    console.print(table)
    console.print(f"[bold green]Deployed.[/bold green] Process URL: {info['url']}")


@sam_app.command("functions")
def sam_functions() -> None:
    """Print the template's functions as JSON (code directory, handler, runtime, condition)."""
    from agentscope_serverless.packaging import sam

    typer.echo(_run(lambda: sam.functions_json(sam.assets() / "template.yaml")))


def _requirements(values: list[str] | None) -> list[str]:
    from agentscope_serverless.packaging.project import given_requirements

    # Checked before anything is built; an entry is named by its place, not its text (an
    # index URL may hold a password).
    return list(_run(lambda: given_requirements(values or [], option="--requirement")))


def _build_archive(
    manager: ArchiveDeployManager,
    agent: str | None,
    name: str | None,
    env: dict[str, str],
    skip_upload: bool,
    requirements: list[str],
) -> None:
    from agentscope_serverless.deployers.archive import default_archive_name, refuse_missing_app

    if agent is None:
        try:
            refuse_missing_app(
                manager.project_root, manager.build_root, give="--agent module:attribute"
            )
        except AgentScopeServerlessError as exc:
            _fail(exc.message, code=2)
    name = name or default_archive_name(agent, manager.project_root)
    with _exit_on_signals(), _steps(f"building the {manager.platform_name} archive") as step:
        try:
            info = manager.deploy_sync(
                agent,
                environment=env,
                deploy_name=name,
                skip_upload=skip_upload,
                progress=step,
                requirements=requirements,
            )
        except UploadNotAvailableError as exc:
            errors.print(f"[bold yellow]not uploaded:[/bold yellow] {escape(exc.message)}")
            raise typer.Exit(NOT_DEPLOYED) from None
        except AgentScopeServerlessError as exc:
            _fail(exc.message)
    assert manager.report is not None
    console.print(f"[bold green]Built[/bold green] {manager.report.describe()}")
    console.print(f"archive: {info['artifact_path']}", markup=False)
    console.print(f"size: {info['size_bytes']} bytes", markup=False)
    _say_left_out(info["left_out"])


class _Stopped(BaseException):
    """A stop signal, raised where the build is: no ``except Exception`` takes it for a
    failure to go on from."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def _exit_on_signals() -> Iterator[None]:
    """Exit with 128 + the signal's number (143, 130) on SIGTERM (a CI job cancelled,
    ``timeout``) or Ctrl-C, once the build has unwound: the tool it runs is killed and its
    folder in --out removed, where the default SIGTERM ended the process at once and left
    them. A second signal meets the handler of before (a second Ctrl-C cuts that short)."""

    def stop(signum: int, frame: object) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise _Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        yield
    except _Stopped as stopped:
        name = signal.Signals(stopped.signum).name
        errors.print(f"[bold yellow]stopped[/bold yellow] by {name}", markup=True)
        raise typer.Exit(128 + stopped.signum) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _say_left_out(left_out: list[str]) -> None:
    """Name the project's secrets a build left out (see ``project.secrets_left_out``)."""
    if left_out:
        console.print(
            f"left out as secrets: {', '.join(left_out)} (give the agent what it needs "
            "of them in the platform's environment)",
            markup=False,
        )


@agentrun_app.command()
def agentrun(
    agent: AgentOption = None,
    out: OutOption = Path("dist"),
    python_version: PythonOption = DEFAULT_PYTHON,
    name: NameOption = None,
    env: EnvOption = None,
    skip_upload: SkipUploadOption = False,
    project_root: ProjectRootOption = Path(),
    requirement: RequirementOption = None,
) -> None:
    """Build an AgentRun archive: flat site-packages and agentrun.json (entry command)."""
    from agentscope_serverless.deployers.agentrun_deployer import AgentRunDeployManager

    requirements = _requirements(requirement)
    try:  # it reads AgentScope's AGENT_RUN_* variables
        manager = AgentRunDeployManager(
            out, project_root=project_root, python_version=python_version
        )
    except AgentScopeServerlessError as exc:
        _fail(exc.message)
    _build_archive(manager, agent, name, _pairs(env, "--env"), skip_upload, requirements)


@modelstudio_app.command()
def modelstudio(
    agent: AgentOption = None,
    out: OutOption = Path("dist"),
    python_version: PythonOption = DEFAULT_PYTHON,
    name: NameOption = None,
    env: EnvOption = None,
    skip_upload: SkipUploadOption = False,
    project_root: ProjectRootOption = Path(),
    requirement: RequirementOption = None,
) -> None:
    """Build a ModelStudio archive: wheels, requirements.txt and deploy_starter/."""
    from agentscope_serverless.deployers.modelstudio_deployer import ModelStudioDeployManager

    requirements = _requirements(requirement)
    manager = ModelStudioDeployManager(
        out, project_root=project_root, python_version=python_version
    )
    _build_archive(manager, agent, name, _pairs(env, "--env"), skip_upload, requirements)


deploy_app.command("agentrun")(agentrun)
deploy_app.command("modelstudio")(modelstudio)


__all__ = ["agentrun_app", "deploy_app", "modelstudio_app", "sam_app"]
