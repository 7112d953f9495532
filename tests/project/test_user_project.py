"""A user's own project, from its own folder outside this repository, to every target.

The project is what ``agentscope-serverless init`` writes, grown as a user would: the agent
imports a helper module of the project, ``humanize``, a third-party package the runtime does
not have, and ``docopt``, published only as a source archive (both listed in the project's
``requirements.txt``). From that folder, with the CLI: served locally; packaged for AgentRun
and ModelStudio, each unpacked in a clean folder and served from its contents alone by the
target's Python; built with SAM and its process function run under the runtime interface
client. Every time, the agent's own reply comes back over HTTP.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentscope_serverless.auth.file import FileKeyStore
from agentscope_serverless.errors import PackagingError
from agentscope_serverless.packaging import build_agentrun_archive
from tests.conftest import PROJECT_ROOT
from tests.deploy.conftest import HOST_PYTHON
from tests.deploy.test_archives import clean_environment, fresh_venv, read_config
from tests.lambda_.conftest import (
    Artifact,
    RunningFunction,
    _environment,
    start_built_function,
)
from tests.lambda_.test_functions import sse_events
from tests.support.http import (
    bearer,
    free_port,
    issue_key,
    stream,
    text_of,
    user_message,
    wait_until_healthy,
)
from tests.support.lambda_runtime import LambdaRuntimeAPI

pytestmark = pytest.mark.timeout(600)

CLI = [sys.executable, "-m", "agentscope_serverless.cli"]
AGENT = "shouter.agent:app"
THIRD_PARTY = "humanize==4.12.3"
SOURCE_ONLY = "docopt==0.6.2"  # no wheel on PyPI: the package builds one, pure Python

AGENT_MODULE = '''"""Shouts back, with the length of what was said in words."""

import docopt
import humanize

from agentscope_serverless.app import AgentApp
from shouter.loud import shout

app = AgentApp(app_name="shouter")


@app.query(framework="text")
async def query(self, msgs, request=None, **kwargs):
    text = msgs[-1].get_text_content() or ""
    yield shout(text)
    length = humanize.intcomma(1000 * len(text))
    yield f" ({length} milli-characters, docopt {docopt.__version__})"
'''
HELPER_MODULE = """def shout(text):
    return text.upper() + "!"
"""
REPLY = "HELLO THERE! (11,000 milli-characters, docopt 0.6.2)"


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [*CLI, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=540
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's project folder, outside the repository."""
    parent = tmp_path_factory.mktemp("user")
    assert PROJECT_ROOT not in parent.parents
    cli("init", "shouter", cwd=parent)
    folder = parent / "shouter"
    (folder / "shouter" / "agent.py").write_text(AGENT_MODULE)
    (folder / "shouter" / "loud.py").write_text(HELPER_MODULE)
    (folder / "requirements.txt").write_text(f"{THIRD_PARTY}\n{SOURCE_ONLY}\n")
    # What packaging must leave out.
    (folder / ".venv" / "lib").mkdir(parents=True)
    (folder / ".venv" / "lib" / "junk.py").write_text("raise SystemExit('not me')\n")
    (folder / ".git").mkdir()
    (folder / "dist").mkdir()
    (folder / ".env.local").write_text("OPENAI_API_KEY=sk-local-secret\n")
    return folder


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("user-keys") / "keys.json"


@pytest.fixture(scope="module")
def key(key_file: Path) -> str:
    return issue_key(FileKeyStore(key_file), "u1")


def user_env(key_file: Path, **extra: str) -> dict[str, str]:
    env = clean_environment({"AUTH_KEYS_BACKEND": "file", "AUTH_KEYS_FILE": str(key_file)})
    env.pop("AGENT_APP", None)
    return {**env, **extra}


def ask(url: str, key: str) -> str:
    with httpx.Client(base_url=url, headers=bearer(key), timeout=60) as client:
        body = {"input": [user_message("hello there")], "session_id": "s1"}
        response, sse = stream(client, "/process", json=body)
    assert response.status_code == 200
    assert sse.data[-1]["status"] == "completed", sse.data[-1]
    return text_of(sse.data)


def extract(archive: Path, target: Path) -> Path:
    """The archive's contents alone, in a clean folder."""
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(target)
    return target


def serving(command: list[str], cwd: Path, env: dict[str, str]) -> Iterator[str]:
    port = env["PORT"]
    log = cwd.parent / f"{cwd.name}-server.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [part.replace("$PORT", port) for part in command],
            cwd=cwd,
            env=env,
            stdout=sink,
            stderr=sink,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, timeout=90)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def serving_agentrun_archive(root: Path, tmp_path: Path, key_file: Path) -> Iterator[str]:
    """The unpacked AgentRun archive at ``root`` served by its manifest's entry command, with
    the interpreter of a fresh virtualenv (nothing installed: the archive holds it all)."""
    manifest = json.loads((root / "agentrun.json").read_text())
    python = fresh_venv(tmp_path / "venv", with_pip=False)
    command = [
        str(python),
        *[
            p.replace(str(manifest["entrypoint"]["port"]), "$PORT")
            for p in manifest["entrypoint"]["command"][1:]
        ],
    ]
    yield from serving(command, root, user_env(key_file, PORT=str(free_port())))


def test_the_cli_serves_the_project_from_its_folder(
    project: Path, key_file: Path, key: str, tmp_path: Path
) -> None:
    # The user installed the project's requirements in their environment.
    deps = tmp_path / "deps"
    subprocess.run(
        [
            str(Path(sys.executable).parent / "uv"),
            "pip",
            "install",
            "--quiet",
            "--target",
            str(deps),
            "-r",
            str(project / "requirements.txt"),
        ],
        check=True,
    )
    port = str(free_port())
    env = user_env(key_file, PORT=port, PYTHONPATH=str(deps))
    command = [*CLI, "serve", "--agent", AGENT, "--port", "$PORT"]
    for url in serving(command, project, env):
        assert ask(url, key) == REPLY


def test_the_agentrun_archive_serves_the_project_from_its_contents(
    project: Path, key_file: Path, key: str, tmp_path: Path
) -> None:
    out = cli(
        "deploy",
        "agentrun",
        "--agent",
        AGENT,
        "--out",
        "dist",
        "--python-version",
        HOST_PYTHON,
        "--skip-upload",
        cwd=project,
    )
    archive = project / "dist" / "shouter-agentrun.zip"  # the project folder's name
    assert f"archive: {archive}" in out
    root = extract(archive, tmp_path / "unpacked")
    assert (root / "shouter" / "loud.py").is_file() and (root / "humanize").is_dir()
    assert not (root / ".venv").exists() and not (root / ".git").exists()
    assert not (root / "dist").exists() and not (root / ".env.local").exists()
    assert not (root / "tests").exists() and not (root / "conftest.py").exists()
    assert not (root / "pytest.ini").exists()  # init's, as the tests it runs
    for url in serving_agentrun_archive(root, tmp_path, key_file):
        assert ask(url, key) == REPLY


def test_the_modelstudio_archive_serves_the_project_after_its_offline_setup(
    project: Path, key_file: Path, key: str, tmp_path: Path
) -> None:
    cli(
        "deploy",
        "modelstudio",
        "--agent",
        AGENT,
        "--out",
        "dist",
        "--python-version",
        HOST_PYTHON,
        "--skip-upload",
        cwd=project,
    )
    archive = project / "dist" / "shouter-modelstudio.zip"  # the project folder's name
    root = extract(archive, tmp_path / "unpacked")
    assert any(p.name.startswith("humanize-") for p in (root / "wheels").iterdir())
    python = fresh_venv(tmp_path / "venv", with_pip=True)
    config = read_config(root / "deploy_starter" / "config.yml")
    port = str(free_port())
    env = user_env(key_file, PORT=port)
    setup = subprocess.run(
        [str(python), "-m", *shlex.split(config["SETUP_CMD"])],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    assert setup.returncode == 0, setup.stdout + setup.stderr
    for url in serving([str(python), "deploy_starter/main.py"], root, env):
        assert ask(url, key) == REPLY


def test_the_sam_build_serves_the_project_from_the_process_function(
    project: Path,
    key: str,
    tmp_path: Path,
    function_environment: dict[str, str],
    key_file: Path,
) -> None:
    build_dir = tmp_path / "build"
    cli(
        "deploy",
        "sam",
        "build",
        "--agent",
        AGENT,
        "--build-dir",
        str(build_dir),
        cwd=project,
        env={**os.environ, "AWS_DEFAULT_REGION": "us-east-1"},
    )
    built = build_dir / "SharedLayer" / "python"
    assert (built / "shouter" / "loud.py").is_file() and (built / "humanize").is_dir()
    assert not (built / "tests").exists() and not (built / "conftest.py").exists()
    artifact = Artifact(build_dir / "ProcessFunction", built)
    runtime = LambdaRuntimeAPI().start()
    settings = {
        **function_environment,
        "AGENT_APP": AGENT,
        "AUTH_KEYS_FILE": str(key_file),
    }
    env = _environment(artifact, runtime, settings)
    process = subprocess.Popen(
        [sys.executable, "-m", "awslambdaric", "agentscope_handler.handler"],
        cwd=artifact.code_dir,
        env=env,
        start_new_session=True,
    )
    function = RunningFunction(runtime, [process])
    try:
        status, _, body, _ = function.request(
            "POST",
            "/process",
            key=key,
            body={"input": [{"role": "user", "content": "hello there"}], "session_id": "sam"},
        )
    finally:
        function.stop()
    assert status == 200, body
    events = sse_events(body)
    assert events[-1]["status"] == "completed", events[-1]
    assert (
        "".join(e.get("text", "") for e in events if e["object"] == "content" and e.get("delta"))
        == REPLY
    )


def test_archives_written_into_the_project_folder_hold_neither_one_another_nor_themselves(
    project: Path, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    subprocess.run(["cp", "-r", str(project), str(source)], check=True)
    for platform in ("agentrun", "modelstudio"):
        cli(
            "deploy",
            platform,
            "--agent",
            AGENT,
            "--out",
            "artifacts",
            "--python-version",
            HOST_PYTHON,
            "--skip-upload",
            cwd=source,
        )
        archive = source / "artifacts" / f"source-{platform}.zip"
        with zipfile.ZipFile(archive) as zf:
            names = zf.namelist()
        assert "shouter/agent.py" in names
        assert not [name for name in names if name.startswith("artifacts/")], platform


def test_archived_files_are_readable_by_any_user_whatever_the_projects_modes(
    project: Path, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    subprocess.run(["cp", "-r", str(project), str(source)], check=True)
    (source / "shouter" / "loud.py").chmod(0o600)  # made under umask 077
    (source / "bin").mkdir()  # the project's own scripts
    (source / "bin" / "warm.sh").write_text("#!/bin/sh\n")
    (source / "bin" / "warm.sh").chmod(0o777)
    out = tmp_path / "out"
    report = build_agentrun_archive(source, out, agent=AGENT, python_version=HOST_PYTHON)
    with zipfile.ZipFile(report.path) as zf:
        modes = {entry.filename: entry.external_attr >> 16 for entry in zf.infolist()}
    assert oct(modes["shouter/loud.py"]) == oct(0o100644)
    assert oct(modes["bin/warm.sh"]) == oct(0o100755)
    assert [name for name in modes if name.startswith("bin/")] == ["bin/warm.sh"]


SINGLE_FILE_AGENT = """from agentscope_serverless.app import AgentApp

app = AgentApp(app_name="single")


@app.query(framework="text")
async def query(self, msgs, request=None, **kwargs):
    yield "single: " + (msgs[-1].get_text_content() or "")
"""


@pytest.fixture(scope="module")
def single_file_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SAM build of a project that is one module, ``app.py``, whose agent is ``app:app``."""
    folder = tmp_path_factory.mktemp("single")
    (folder / "app.py").write_text(SINGLE_FILE_AGENT)
    build_dir = folder / ".aws-sam" / "build"
    cli(
        "deploy",
        "sam",
        "build",
        "--agent",
        "app:app",
        cwd=folder,
        env={**os.environ, "AWS_DEFAULT_REGION": "us-east-1"},
    )
    return build_dir


@pytest.mark.parametrize("function", ["ProcessFunction", "ProcessStreamFunction"])
def test_an_agent_module_named_app_is_served_by_the_process_functions(
    single_file_build: Path,
    function: str,
    key: str,
    key_file: Path,
    function_environment: dict[str, str],
) -> None:
    artifact = Artifact(single_file_build / function, single_file_build / "SharedLayer" / "python")
    settings = {**function_environment, "AGENT_APP": "app:app", "AUTH_KEYS_FILE": str(key_file)}
    running = start_built_function(artifact, settings)
    try:
        status, _, body, _ = running.request(
            "POST",
            "/process",
            key=key,
            body={"input": [{"role": "user", "content": "hi"}], "session_id": function},
        )
    finally:
        running.stop()
    assert status == 200, body
    events = sse_events(body)
    assert events[-1]["status"] == "completed", events[-1]
    assert "single: hi" in body.decode()


def test_an_agent_that_does_not_import_from_the_archive_writes_nothing(
    project: Path, tmp_path: Path
) -> None:
    with pytest.raises(PackagingError, match=r"'shouter\.nowhere'"):
        build_agentrun_archive(
            project, tmp_path, agent="shouter.nowhere:app", python_version=HOST_PYTHON
        )
    assert not list(tmp_path.glob("*.zip"))


def test_a_requirement_missing_from_requirements_txt_is_named(
    project: Path, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    subprocess.run(["cp", "-r", str(project), str(source)], check=True)
    (source / "requirements.txt").write_text("")
    out = tmp_path / "out"
    with pytest.raises(PackagingError, match=r"'shouter\.agent'.*No module named 'docopt'"):
        build_agentrun_archive(source, out, agent=AGENT, python_version=HOST_PYTHON)
    assert not list(out.glob("*.zip"))


def test_serve_reload_answers_with_the_edited_agent(
    key_file: Path, key: str, tmp_path: Path
) -> None:
    cli("init", "echoer", cwd=tmp_path)
    folder = tmp_path / "echoer"
    port = str(free_port())
    command = [*CLI, "serve", "--agent", "echoer.agent:app", "--port", "$PORT", "--reload"]
    for url in serving(command, folder, user_env(key_file, PORT=port)):
        assert ask(url, key) == "You said: hello there"
        agent = folder / "echoer" / "agent.py"
        agent.write_text(agent.read_text().replace('yield "You said: "', 'yield "Heard: "'))
        deadline = time.monotonic() + 90
        while True:
            try:
                if ask(url, key) == "Heard: hello there":
                    break
            except (httpx.HTTPError, AssertionError):
                pass  # restarting
            assert time.monotonic() < deadline, "the server did not reload the agent"
            time.sleep(0.5)


SRC_AGENT = "mypkg.agent:app"
SRC_AGENT_MODULE = """from agentscope_serverless.app import AgentApp
from mypkg.words import echo

app = AgentApp(app_name="mypkg")


@app.query(framework="text")
async def query(self, msgs, request=None, **kwargs):
    yield echo(msgs[-1].get_text_content() or "")
"""
SRC_REPLY = "src layout: hello there"


@pytest.fixture(scope="module")
def src_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project in the src layout: pyproject.toml at its root, its package under src/."""
    folder = tmp_path_factory.mktemp("src-user") / "mypkg-project"
    assert PROJECT_ROOT not in folder.parents
    (folder / "src" / "mypkg").mkdir(parents=True)
    (folder / "pyproject.toml").write_text(
        '[project]\nname = "mypkg"\nversion = "0.1.0"\n\n'
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
    )
    (folder / "src" / "mypkg" / "__init__.py").write_text("")
    (folder / "src" / "mypkg" / "agent.py").write_text(SRC_AGENT_MODULE)
    (folder / "src" / "mypkg" / "words.py").write_text(
        'def echo(text):\n    return "src layout: " + text\n'
    )
    (folder / "tests").mkdir()
    (folder / "tests" / "test_agent.py").write_text("def test(): pass\n")
    return folder


def test_the_cli_serves_a_src_layout_project_from_its_folder(
    src_project: Path, key_file: Path, key: str
) -> None:
    port = str(free_port())
    env = user_env(key_file, PORT=port, PYTHONPATH=str(PROJECT_ROOT / "shared"))
    command = [*CLI, "serve", "--agent", SRC_AGENT, "--port", "$PORT"]
    for url in serving(command, src_project, env):
        assert ask(url, key) == SRC_REPLY


def test_the_agentrun_archive_serves_a_src_layout_project_from_its_contents(
    src_project: Path, key_file: Path, key: str, tmp_path: Path
) -> None:
    report = build_agentrun_archive(
        src_project, tmp_path / "out", agent=SRC_AGENT, python_version=HOST_PYTHON
    )
    root = extract(report.path, tmp_path / "unpacked")
    assert (root / "mypkg" / "agent.py").is_file() and not (root / "src").exists()
    for url in serving_agentrun_archive(root, tmp_path, key_file):
        assert ask(url, key) == SRC_REPLY


def test_the_sam_build_serves_a_src_layout_project_from_the_process_function(
    src_project: Path,
    key: str,
    key_file: Path,
    tmp_path: Path,
    function_environment: dict[str, str],
) -> None:
    build_dir = tmp_path / "build"
    cli(
        "deploy",
        "sam",
        "build",
        "--agent",
        SRC_AGENT,
        "--build-dir",
        str(build_dir),
        cwd=src_project,
        env={**os.environ, "AWS_DEFAULT_REGION": "us-east-1"},
    )
    layer = build_dir / "SharedLayer" / "python"
    assert (layer / "mypkg" / "agent.py").is_file() and not (layer / "src").exists()
    artifact = Artifact(build_dir / "ProcessFunction", layer)
    settings = {**function_environment, "AGENT_APP": SRC_AGENT, "AUTH_KEYS_FILE": str(key_file)}
    running = start_built_function(artifact, settings)
    try:
        status, _, body, _ = running.request(
            "POST",
            "/process",
            key=key,
            body={"input": [{"role": "user", "content": "hello there"}], "session_id": "src"},
        )
    finally:
        running.stop()
    assert status == 200, body
    assert SRC_REPLY in body.decode()
