"""The AgentRun and ModelStudio archives serve the agent from their contents alone.

Each archive is unpacked into a clean directory and run with a fresh interpreter that has no
site packages: AgentRun runs its manifest's entry command in the unpacked directory;
ModelStudio installs its bundled wheels offline (``SETUP_CMD``) into a fresh virtualenv and
starts ``deploy_starter/main.py``. Both read keys from the file key store their environment
names, so neither prints nor needs a development key.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import io
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import tarfile
import threading
import tracemalloc
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentscope_serverless.errors import PackagingError
from agentscope_serverless.packaging import build_agentrun_archive, build_modelstudio_archive
from agentscope_serverless.packaging.archives import ArchiveReport, _owner, _zip_tree
from agentscope_serverless.packaging.project import check_agent_import
from tests.conftest import PROJECT_ROOT
from tests.deploy.conftest import HOST_PYTHON, unpack
from tests.support.http import bearer, free_port, stream, text_of, user_message, wait_until_healthy

# The import path of the runtime and its dependencies, as this checkout has them.
RUNTIME_PATH = [PROJECT_ROOT / "shared", Path(sysconfig.get_paths()["purelib"])]


@dataclass
class RunningService:
    url: str
    key: str
    output: Path


def clean_environment(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment without anything that points Python at other packages."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("AUTH_")
    }
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def fresh_venv(path: Path, *, with_pip: bool) -> Path:
    """A virtualenv of the host interpreter without site packages; returns its python."""
    command = [sys.executable, "-m", "venv", str(path)]
    subprocess.run(command if with_pip else [*command, "--without-pip"], check=True)
    return path / "bin" / "python"


def create_key(env: dict[str, str]) -> str:
    """A user key made by the developer's CLI (archives hold the runtime, not the tools) in
    the key file the archive's environment names."""
    key_file = Path(env["AUTH_KEYS_FILE"])
    result = subprocess.run(
        [sys.executable, "-m", "agentscope_serverless.cli", "keys", "create", "--user", "u1"],
        cwd=key_file.parent,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return next(line for line in result.stdout.splitlines() if line.startswith("ask_"))


def serve(command: list[str], cwd: Path, env: dict[str, str], key: str) -> Iterator[RunningService]:
    output = cwd / "service-output.txt"
    port = int(env["PORT"])
    with output.open("w") as sink:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=sink, stderr=sink)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, timeout=60)
        yield RunningService(url=url, key=key, output=output)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def agentrun_service(
    agentrun_deploy: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningService]:
    root = unpack(agentrun_deploy["artifact_path"], tmp_path_factory, "agentrun-unpacked")
    python = fresh_venv(tmp_path_factory.mktemp("agentrun-venv") / "venv", with_pip=False)
    manifest = json.loads((root / "agentrun.json").read_text())
    port = free_port()
    env = clean_environment({**manifest["environment"], "PORT": str(port)})
    key = create_key(env)
    entry = manifest["entrypoint"]
    command = [part.replace(str(entry["port"]), str(port)) for part in entry["command"]]
    assert command[0] == "python3"
    yield from serve([str(python), *command[1:]], root, env, key)


@pytest.fixture(scope="module")
def modelstudio_service(
    modelstudio_deploy: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningService]:
    root = unpack(modelstudio_deploy["artifact_path"], tmp_path_factory, "modelstudio-unpacked")
    python = fresh_venv(tmp_path_factory.mktemp("modelstudio-venv") / "venv", with_pip=True)
    config = read_config(root / "deploy_starter" / "config.yml")
    setup = shlex.split(config["SETUP_CMD"])
    assert setup[:2] == ["pip", "install"] and "--no-index" in setup
    env = clean_environment({"PORT": str(free_port())})
    installed = subprocess.run(
        [str(python), "-m", *setup], cwd=root, env=env, capture_output=True, text=True
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    dotenv = dict(
        line.split("=", 1) for line in (root / "deploy_starter" / ".env").read_text().splitlines()
    )
    key = create_key({**env, **dotenv})
    yield from serve([str(python), "deploy_starter/main.py"], root, env, key)


def read_config(path: Path) -> dict[str, str]:
    """config.yml: one ``KEY: "value"`` per line (YAML and JSON agree on the values)."""
    return {
        key: json.loads(value)
        for key, _, value in (line.partition(": ") for line in path.read_text().splitlines())
    }


def assert_answers_process(service: RunningService) -> None:
    with httpx.Client(base_url=service.url, headers=bearer(service.key), timeout=30) as client:
        body = {"input": [user_message("My name is Alice")], "session_id": "s1"}
        response, sse = stream(client, "/process", json=body)
    assert response.status_code == 200
    events = sse.data
    assert (events[0]["object"], events[0]["status"]) == ("response", "created")
    assert (events[-1]["object"], events[-1]["status"]) == ("response", "completed")
    assert events[-1]["session_id"] == "s1"
    assert text_of(events).startswith("Nice to meet you, Alice")


def assert_uses_the_key_file(service: RunningService) -> None:
    output = service.output.read_text()
    assert "development key" not in output and "ask_" not in output
    assert "API keys:" in output
    anonymous = httpx.post(f"{service.url}/process", json={"input": [user_message("hi")]})
    assert anonymous.status_code == 401


def test_agentrun_archive_serves_process_from_its_contents(
    agentrun_service: RunningService,
) -> None:
    assert_answers_process(agentrun_service)


def test_agentrun_archive_uses_the_key_file_of_its_manifest(
    agentrun_service: RunningService,
) -> None:
    assert_uses_the_key_file(agentrun_service)


def test_agentrun_manifest_names_the_entry_command_runtime_and_health_check(
    agentrun_deploy: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = unpack(agentrun_deploy["artifact_path"], tmp_path_factory, "agentrun-manifest")
    manifest = json.loads((root / "agentrun.json").read_text())
    assert manifest["entrypoint"]["command"][:3] == [
        "python3",
        "-m",
        "agentscope_serverless.serve",
    ]
    assert manifest["runtime"] == f"python{HOST_PYTHON}"
    assert manifest["health_check"] == {"path": "/health", "port": manifest["entrypoint"]["port"]}
    assert (root / "agentscope_serverless" / "__init__.py").is_file()
    assert (root / "fastapi").is_dir() and (root / "uvicorn").is_dir()
    # The runtime only: no CLI, deploy or packaging code, and none of their dependencies.
    assert not (root / "agentscope_serverless" / "cli.py").exists()
    assert not (root / "agentscope_serverless" / "reloader.py").exists()
    assert not (root / "agentscope_serverless" / "packaging").exists()
    assert not (root / "typer").exists() and not (root / "yaml").exists()
    assert not (root / "watchfiles").exists()


def test_agentrun_archive_holds_no_installer_leftovers_and_no_file_others_may_write(
    agentrun_deploy: dict[str, Any],
) -> None:
    with zipfile.ZipFile(agentrun_deploy["artifact_path"]) as zf:
        entries = zf.infolist()
    names = [entry.filename for entry in entries]
    assert "uvicorn/__init__.py" in names
    # uv's lock file, and scripts whose first line names the building machine's Python.
    assert ".lock" not in names and not [name for name in names if name.startswith("bin/")]
    modes = {entry.filename: entry.external_attr >> 16 for entry in entries}
    assert {oct(mode) for mode in modes.values()} <= {oct(0o100644), oct(0o100755)}


@pytest.mark.parametrize("platform", ["agentrun", "modelstudio"])
def test_the_output_folder_holds_the_archive_alone(
    platform: str, request: pytest.FixtureRequest
) -> None:
    archive = Path(request.getfixturevalue(f"{platform}_deploy")["artifact_path"])
    assert [p.name for p in archive.parent.iterdir()] == [archive.name]


def test_modelstudio_archive_serves_process_after_its_offline_setup(
    modelstudio_service: RunningService,
) -> None:
    assert_answers_process(modelstudio_service)


def test_modelstudio_archive_uses_the_key_file_of_its_env(
    modelstudio_service: RunningService,
) -> None:
    assert_uses_the_key_file(modelstudio_service)


def test_modelstudio_config_has_agentscope_keys(
    modelstudio_deploy: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = unpack(modelstudio_deploy["artifact_path"], tmp_path_factory, "modelstudio-config")
    config = read_config(root / "deploy_starter" / "config.yml")
    assert {"APP_NAME", "HOST", "PORT", "SETUP_CMD", "FC_RUN_CMD", "CMD"} <= set(config)
    assert config["FC_RUN_CMD"] == "python3 deploy_starter/main.py"
    assert "--agent agentscope_serverless.agents.demo:app" in config["CMD"]
    wheels = {path.name.split("-")[0] for path in (root / "wheels").glob("*.whl")}
    assert {"fastapi", "uvicorn", "pydantic_core"} <= wheels
    assert "typer" not in wheels
    assert (root / "agentscope_serverless" / "serve.py").is_file()
    assert not (root / "agentscope_serverless" / "deploy_cli.py").exists()


def test_modelstudio_environment_values_reach_the_service_as_given(tmp_path: Path) -> None:
    # The archive's main.py read its .env stripping each value ('  >> ' came back '>>') and
    # splitting lines at a form feed, U+2028... (a value 'a\x0cb=c' also set a variable b).
    given = {"GREETING": "  >> ", "NOTE": "a\x0cb=c", "MOTTO": "x\u2028y\x85z\x1c \x0b"}
    project = tmp_path / "project"
    project.mkdir()
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    report = build_modelstudio_archive(
        project, tmp_path / "out", agent="agent:app", python_version=HOST_PYTHON, environment=given
    )
    with zipfile.ZipFile(report.path) as archive:
        archive.extractall(tmp_path / "unpacked")
    read = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import json, os, runpy\n"
            "runpy.run_path('deploy_starter/main.py', run_name='starter')['load_env']()\n"
            "print(json.dumps(dict(os.environ)))",
        ],
        cwd=tmp_path / "unpacked",
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=True,
    )
    environment = json.loads(read.stdout)
    assert {name: environment.get(name) for name in given} == given
    assert "b" not in environment


def test_an_environment_value_holding_a_nul_is_refused_without_showing_it(tmp_path: Path) -> None:
    with pytest.raises(PackagingError) as refused:
        build_agentrun_archive(PROJECT_ROOT, tmp_path, environment={"NOTE": "s3cret\0x"})
    assert str(refused.value) == (
        "the value of NOTE holds a NUL character, which no environment can carry"
    )


def test_an_archive_above_the_limit_fails_naming_the_limit(tmp_path: Path) -> None:
    with pytest.raises(PackagingError, match="limit of 1024 bytes") as refused:
        build_agentrun_archive(
            PROJECT_ROOT, tmp_path, python_version=HOST_PYTHON, max_zip_bytes=1024
        )
    assert not (tmp_path / "agentscope-serverless-agentrun.zip").exists()
    # It told a CLI user to "raise max_zip_bytes", which no option sets, and named nothing.
    assert re.search(r"the largest, zipped: [\w.]+/ \(\d+\.\d MB; ", str(refused.value))
    assert "max_zip_bytes" not in str(refused.value)


def test_a_project_whose_own_files_are_too_big_is_refused_naming_them_before_installing(
    tmp_path: Path,
) -> None:
    # It was refused only once every dependency was installed and zipped, blaming them.
    project = tmp_path / "project"
    (project / "models").mkdir(parents=True)
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    (project / "requirements.txt").write_text(NO_INDEX)
    (project / "models" / "big.bin").write_bytes(os.urandom(300_000))
    (project / "notes.txt").write_text("a line that shrinks a lot zipped\n" * 100_000)
    for build in (build_agentrun_archive, build_modelstudio_archive):
        with pytest.raises(PackagingError) as refused:
            build(
                project,
                tmp_path / "out",
                agent="agent:app",
                python_version=HOST_PYTHON,
                max_zip_bytes=200_000,
            )
        message = str(refused.value)
        assert message.startswith(
            "the project's own files zip to more than the platform's limit of 200000 bytes "
            "(0.2 MiB) on the archive, before any dependency; the largest, zipped: models/ "
            "(0.3 MB; models/big.bin 0.3 MB), notes.txt (0.0 MB). Move big data"
        ), message
        assert "max_zip_bytes" not in message
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_project_files_that_zip_below_the_limit_are_not_refused_for_their_size(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    (project / "requirements.txt").write_text(NO_INDEX)
    (project / "notes.txt").write_text("a line that shrinks a lot zipped\n" * 100_000)
    with pytest.raises(PackagingError, match="resolving") as refused:
        build_agentrun_archive(
            project,
            tmp_path / "out",
            agent="agent:app",
            python_version=HOST_PYTHON,
            max_zip_bytes=1_000_000,
        )
    assert "limit" not in str(refused.value)


def test_a_build_removes_the_folders_of_builds_killed_before_and_keeps_those_running(
    tmp_path: Path,
) -> None:
    # A build killed (SIGKILL, a machine stopped) left its folder, a copy of the project and
    # every dependency, in the output folder for good.
    project = tmp_path / "project"
    project.mkdir()
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    (project / "requirements.txt").write_text(NO_INDEX)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    out = tmp_path / "out"
    killed = out / f".agentscope-build-other-agentrun-{_owner(gone.pid)}-abcd_123"
    running = out / f".agentscope-build-other-agentrun-{_owner(os.getpid())}-efgh_456"
    elsewhere = out / f".agentscope-build-other-agentrun-0000abcd-pid{gone.pid}-ijkl_789"
    unknown = out / ".agentscope-build-other-agentrun-mnop_012"  # an older version's
    for folder in (killed, running, elsewhere, unknown):
        (folder / "archive").mkdir(parents=True)
        (folder / "archive" / "big.bin").write_bytes(b"0" * 1000)
    with pytest.raises(PackagingError, match="resolving"):
        build_agentrun_archive(project, out, agent="agent:app", python_version=HOST_PYTHON)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [running.name, elsewhere.name, unknown.name]
    )


def test_environment_names_must_be_variable_names(tmp_path: Path) -> None:
    with pytest.raises(PackagingError, match="not an environment variable name"):
        build_agentrun_archive(PROJECT_ROOT, tmp_path, environment={"BAD NAME": "x"})


def test_environment_values_must_be_text_or_numbers(tmp_path: Path) -> None:
    with pytest.raises(PackagingError, match="the value of HOSTS is a list, not text"):
        build_agentrun_archive(PROJECT_ROOT, tmp_path, environment={"HOSTS": ["a", "b"]})


@pytest.mark.parametrize("name", ["../outside", "a/b", ".hidden", "", "two words", "x" * 129])
def test_an_app_name_that_is_not_a_plain_name_is_refused_before_anything_is_written(
    tmp_path: Path, name: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for build in (build_agentrun_archive, build_modelstudio_archive):
        with pytest.raises(PackagingError, match="is not an app name"):
            build(PROJECT_ROOT, out, name=name)
    assert list(tmp_path.rglob("*")) == [out]


@pytest.mark.parametrize("out", ["agentscope-serverless-agentrun.zip", "archive.zip/dist"])
def test_an_output_folder_that_is_a_file_is_refused_saying_what_out_names(
    tmp_path: Path, out: str
) -> None:
    # --out given the archive's own path, left by an earlier build: a traceback.
    (tmp_path / "agentscope-serverless-agentrun.zip").write_bytes(b"PK")
    (tmp_path / "archive.zip").write_bytes(b"PK")
    with pytest.raises(PackagingError, match=r"--out names the folder the archive goes in"):
        build_agentrun_archive(PROJECT_ROOT, tmp_path / out, python_version=HOST_PYTHON)
    assert (tmp_path / "agentscope-serverless-agentrun.zip").read_bytes() == b"PK"


@pytest.mark.parametrize("version", ["3.12.1", "312", "python3.12", "3", ""])
def test_a_python_version_that_is_not_major_dot_minor_is_refused_before_anything_is_written(
    tmp_path: Path, version: str
) -> None:
    # The manifest's runtime is python<version>: the platform knows python3.12, not 3.12.1.
    out = tmp_path / "out"
    out.mkdir()
    for build in (build_agentrun_archive, build_modelstudio_archive):
        with pytest.raises(PackagingError, match=r"as major\.minor, such as 3\.12"):
            build(PROJECT_ROOT, out, python_version=version)
    assert list(tmp_path.rglob("*")) == [out]


EXTENSION_SETUP = """from setuptools import Extension, setup

setup(name="fastsum", version="1.0", ext_modules=[Extension("fastsum", ["fastsum.c"])])
"""
EXTENSION_SOURCE = """#include <Python.h>
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fastsum", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_fastsum(void) { return PyModule_Create(&module); }
"""


def test_a_requirement_compiled_from_source_on_this_machine_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    # A requirement with no wheel for the platform whose source holds C code: built here, it
    # would be compiled for this machine (its libraries, its tag), not for the platform.
    project = tmp_path / "project"
    (project / "fastsum").mkdir(parents=True)
    (project / "fastsum" / "setup.py").write_text(EXTENSION_SETUP)
    (project / "fastsum" / "fastsum.c").write_text(EXTENSION_SOURCE)
    (project / "requirements.txt").write_text("./fastsum\n")
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    out = tmp_path / "out"
    with pytest.raises(
        PackagingError,
        match=r"for fastsum-1\.0 \(cp\d+-cp\d+-linux_\w+\).* would not run on the platform",
    ):
        build_agentrun_archive(project, out, agent="agent:app", python_version=HOST_PYTHON)
    assert not list(out.glob("*.zip"))


@pytest.mark.parametrize("requirement", ["./libs/loudly", "-e ./libs/loudly"])
def test_a_requirements_path_is_the_project_folders_wherever_the_build_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, requirement: str
) -> None:
    # A library of the project's own, required by path: built with --source from elsewhere.
    # Editable (-e), it was installed as a link to the build machine's folder: the agent
    # could not import it, and was told to list it in requirements.txt.
    project = tmp_path / "project"
    (project / "libs" / "loudly").mkdir(parents=True)
    (project / "libs" / "loudly" / "setup.py").write_text(
        "from setuptools import setup\n\n"
        "setup(name='loudly', version='1.0', py_modules=['loudly'])\n"
    )
    (project / "libs" / "loudly" / "loudly.py").write_text("def shout(t):\n    return t.upper()\n")
    (project / "requirements.txt").write_text(f"{requirement}\n")
    (project / "agent.py").write_text(
        "import loudly\n\nfrom agentscope_serverless.agents.demo import app\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    report = build_agentrun_archive(
        Path("../project"), Path("out"), agent="agent:app", python_version=HOST_PYTHON
    )
    with zipfile.ZipFile(report.path) as archive:
        assert "loudly.py" in archive.namelist()
    # The ModelStudio archive installs offline from its wheels: a path there is refused,
    # rather than an archive whose setup fails on the platform.
    with pytest.raises(PackagingError, match=r"requirements\.txt names \./libs/loudly, a path"):
        build_modelstudio_archive(
            Path("../project"), Path("out"), agent="agent:app", python_version=HOST_PYTHON
        )
    assert [p.name for p in Path("out").iterdir()] == [report.path.name]


@pytest.mark.parametrize(
    ("source", "said"),
    [
        (
            "from agentscope_serverless.app import AgentApp\n\napp = AgentApp()\n",
            "the agent 'unservable:app' cannot be served: no query handler",
        ),
        (
            "from agentscope_serverless.app import AgentApp\n\napp = AgentApp()\n\n\n"
            "@app.query(framework='text')\nasync def query(msgs, **kwargs):\n    yield 'hi'\n",
            "cannot be served: the query handler query() takes msgs where the runner comes",
        ),
        (  # a script's app.run() left outside if __name__ == "__main__"
            "from agentscope_serverless.app import AgentApp\n\napp = AgentApp()\n\n\n"
            "@app.query(framework='text')\nasync def query(self, msgs, **kwargs):\n"
            "    yield 'hi'\n\n\napp.run(port=0)\n",
            "cannot be served: AGENT_APP='unservable:app': 'unservable' calls app.run() as it is "
            "imported",
        ),
        (  # it was told to list its packages in requirements.txt, with no AgentApp named app
            "app = 5\n",
            "cannot be served: AGENT_APP='unservable:app' is a int, not an AgentApp: name the "
            "AgentApp object",
        ),
        (
            "from agentscope_serverless.app import AgentApp\n\nbot = AgentApp()\n",
            "cannot be served: AGENT_APP='unservable:app': module 'unservable' has no attribute "
            "'app' (the module's AgentApp: unservable:bot)",
        ),
    ],
)
def test_an_agent_that_imports_but_cannot_be_served_is_refused_before_packaging(
    tmp_path: Path, source: str, said: str
) -> None:
    # Deployed, it would answer 503 to every request: the function could not start.
    (tmp_path / "unservable.py").write_text(source)
    with pytest.raises(PackagingError, match=re.escape(said)):
        check_agent_import("unservable:app", [tmp_path, *RUNTIME_PATH], python_version=HOST_PYTHON)


def test_an_agent_reading_a_secret_as_it_is_imported_gets_the_way_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its secret is in the cloud's environment, not the build's: the build said to list
    its third-party packages in requirements.txt."""
    (tmp_path / "weather.py").write_text(
        "import os\n\nfrom agentscope_serverless.app import AgentApp\n\n"
        "WEATHER_KEY = os.environ['AGENTSCOPE_TEST_WEATHER_KEY']\napp = AgentApp()\n\n\n"
        "@app.query(framework='text')\nasync def query(self, msgs, **kwargs):\n    yield 'hi'\n"
    )
    monkeypatch.delenv("AGENTSCOPE_TEST_WEATHER_KEY", raising=False)
    with pytest.raises(PackagingError) as refused:
        check_agent_import("weather:app", [tmp_path, *RUNTIME_PATH], python_version=HOST_PYTHON)
    message = str(refused.value)
    assert message.startswith(
        "the agent 'weather:app' reads the environment variable AGENTSCOPE_TEST_WEATHER_KEY as "
        "it is imported (weather.py, line 5), and the build has none: give the build a "
        "placeholder (AGENTSCOPE_TEST_WEATHER_KEY=x before the command)"
    )
    assert "requirements.txt" not in message
    monkeypatch.setenv("AGENTSCOPE_TEST_WEATHER_KEY", "x")
    check_agent_import("weather:app", [tmp_path, *RUNTIME_PATH], python_version=HOST_PYTHON)


def test_an_agent_raising_as_it_is_imported_is_told_where_and_what_to_do(tmp_path: Path) -> None:
    """An SDK's client made at import without its key raises there: the build said to list
    the agent's packages in requirements.txt, which it had done."""
    (tmp_path / "sdk.py").write_text(
        "class Client:\n    def __init__(self, api_key=None):\n        if not api_key:\n"
        "            raise ValueError('The api_key client option must be set\\nsee the docs')\n"
    )
    (tmp_path / "assistant.py").write_text(
        "import os\n\nimport sdk\n\nclient = sdk.Client(api_key=os.environ.get('NO_SUCH_KEY'))\n"
    )
    with pytest.raises(PackagingError) as refused:
        check_agent_import("assistant:app", [tmp_path, *RUNTIME_PATH], python_version=HOST_PYTHON)
    assert str(refused.value) == (
        "the agent 'assistant:app' raised ValueError as it is imported (assistant.py, line 5): "
        "The api_key client option must be set; it must import without the cloud's environment "
        "and services: read secrets and connect when it runs (its query handler, or @app.init)"
    )


def test_an_agent_raising_with_a_secret_of_the_builds_environment_never_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "leaks.py").write_text(
        "import os\n\nkey = os.environ['LLM_API_KEY']\n"
        "raise RuntimeError(f'could not log in with {key}')\n"
    )
    monkeypatch.setenv("LLM_API_KEY", "sk-BUILD-LEAK-2718281")
    with pytest.raises(PackagingError) as refused:
        check_agent_import("leaks:app", [tmp_path, *RUNTIME_PATH], python_version=HOST_PYTHON)
    message = str(refused.value)
    said = "raised RuntimeError as it is imported (leaks.py, line 4): could not log in with ***;"
    assert said in message, message
    assert "BUILD-LEAK" not in message


def test_an_agent_that_does_not_compile_is_told_where_not_to_list_packages(
    tmp_path: Path,
) -> None:
    (tmp_path / "typo.py").write_text("from agentscope_serverless.app import AgentApp\n\napp = (\n")
    with pytest.raises(PackagingError) as refused:
        check_agent_import("typo:app", [tmp_path, *RUNTIME_PATH], python_version=HOST_PYTHON)
    assert str(refused.value) == (
        "the agent 'typo:app' does not compile: '(' was never closed (typo.py, line 3): fix it "
        "(serving it, agentscope-serverless serve --agent typo:app, says the same)"
    )


def test_a_project_module_named_as_a_dependencys_is_refused_naming_both(tmp_path: Path) -> None:
    # Beside the dependencies, or ahead of them on the import path, one hides the other: the
    # project's six/ hid six.py from dateutil, so the archive's server could not start (a
    # project's anyio/__init__.py even overwrote the installed one); the build passed.
    project = tmp_path / "project"
    (project / "six").mkdir(parents=True)
    (project / "six" / "__init__.py").write_text("")
    (project / "anyio.py").write_text("")
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    out = tmp_path / "out"
    for build in (build_agentrun_archive, build_modelstudio_archive):
        with pytest.raises(PackagingError) as refused:
            build(project, out, agent="agent:app", python_version=HOST_PYTHON)
        assert re.fullmatch(
            r"the project's anyio\.py \(the module anyio of anyio [\d.]+\), six \(the module six "
            r"of six [\d.]+\) are named as a dependency the package holds: one would hide or "
            r"overwrite the other; rename the project's",
            str(refused.value),
        ), refused.value
    assert list(out.iterdir()) == []


def test_a_requirement_installing_a_standard_librarys_module_is_refused_naming_both(
    tmp_path: Path,
) -> None:
    # enum34 installs a top-level enum/ package: ahead of the standard library on the
    # deployed import path, the app could not start (module 'enum' has no attribute
    # 'global_enum'); the build passed.
    vendor = tmp_path / "vendor"
    write_wheel(vendor, "agentscope_enum_backport", "1.0", "", {"enum/__init__.py": ""})
    project = tmp_path / "project"
    project.mkdir()
    (project / "requirements.txt").write_text(
        f"--find-links {vendor}\nagentscope_enum_backport==1.0\n"
    )
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    out = tmp_path / "out"
    for build in (build_agentrun_archive, build_modelstudio_archive):
        with pytest.raises(PackagingError) as refused:
            build(project, out, agent="agent:app", python_version=HOST_PYTHON)
        assert str(refused.value).startswith(
            "the requirements install enum/ (of agentscope_enum_backport 1.0), named as a "
            f"module of the standard library of Python {HOST_PYTHON}: "
        ), refused.value
    assert list(out.iterdir()) == []


def test_the_import_check_sees_a_standard_librarys_module_the_package_hides(
    tmp_path: Path,
) -> None:
    # The check imported json (and so re and enum) before the package's folders were on
    # its path: an enum/ of the package, which the deployed app imports, went unseen.
    (tmp_path / "enum").mkdir()
    (tmp_path / "enum" / "__init__.py").write_text("")
    (tmp_path / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    with pytest.raises(PackagingError, match="cannot be imported from the package's contents"):
        check_agent_import("agent:app", [tmp_path, *RUNTIME_PATH], python_version=HOST_PYTHON)


def test_two_builds_at_once_into_the_projects_folder_each_leave_a_whole_archive(
    tmp_path: Path,
) -> None:
    # Both assembled their archive in the same folder of the output folder, each emptying it
    # for itself: one crashed with a traceback, the other was refused an agent that imports.
    project = tmp_path / "project"
    project.mkdir()
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    with ThreadPoolExecutor(2) as pool:
        builds = [
            pool.submit(
                build_agentrun_archive,
                project,
                project,
                agent="agent:app",
                python_version=HOST_PYTHON,
            )
            for _ in range(2)
        ]
        archives = {build.result().path for build in builds}
    assert archives == {project / "agentscope-serverless-agentrun.zip"}
    assert sorted(p.name for p in project.iterdir()) == [
        "agent.py",
        "agentscope-serverless-agentrun.zip",
    ]
    with zipfile.ZipFile(archives.pop()) as archive:
        assert archive.testzip() is None
        names = archive.namelist()
    assert "agent.py" in names and "agentrun.json" in names
    assert not [name for name in names if name.startswith(".agentscope-build-")]


def test_an_agent_whose_code_imports_what_the_package_lacks_is_told_its_file_and_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "agent.py").write_text(
        "from shop.tools import search\nfrom agentscope_serverless.agents.demo import app\n"
    )
    (tmp_path / "shop" / "tools.py").write_text(
        "import json\n\nimport agentscope_no_such_sdk\n\nsearch = None\n"
    )
    with pytest.raises(PackagingError) as refused:
        check_agent_import("shop.agent:app", [tmp_path, *RUNTIME_PATH], python_version=HOST_PYTHON)
    assert (
        "cannot import 'shop.agent': ModuleNotFoundError: No module named "
        "'agentscope_no_such_sdk' (tools.py, line 3); " in str(refused.value)
    )


def write_wheel(
    folder: Path, name: str, version: str, module: str, extra: dict[str, str] | None = None
) -> None:
    """A pure-Python wheel of ``module`` (one ``.py``) and the ``extra`` files, as a private
    index would serve it."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    files = {
        **(extra or {}),
        f"{name}.py": module,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


@pytest.fixture(scope="module")
def private_sdk_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project requiring a wheel from its own folder of wheels (as from a private index),
    its requirements.txt naming a private index with its password in a comment."""
    project = tmp_path_factory.mktemp("private-sdk") / "project"
    write_wheel(project / "vendor", "agentscope_private_sdk", "1.0", "ANSWER = 42\n")
    (project / "requirements.txt").write_text(
        "--find-links ./vendor  # beside: --extra-index-url https://user:s3cret@pkgs.example\n"
        "agentscope_private_sdk==1.0\n"
    )
    (project / "agent.py").write_text(
        "import agentscope_private_sdk\nfrom agentscope_serverless.agents.demo import app\n"
    )
    return project


@pytest.fixture(scope="module")
def private_sdk_agentrun(
    private_sdk_project: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[zipfile.ZipFile]:
    """The AgentRun archive of :func:`private_sdk_project`, which tests only read."""
    out = tmp_path_factory.mktemp("private-sdk-agentrun")
    report = build_agentrun_archive(
        private_sdk_project, out, agent="agent:app", python_version=HOST_PYTHON
    )
    with zipfile.ZipFile(report.path) as archive:
        yield archive


def test_a_requirement_found_by_the_projects_find_links_is_packaged(
    private_sdk_project: Path, private_sdk_agentrun: zipfile.ZipFile, tmp_path: Path
) -> None:
    # Resolved from the project's own folder of wheels (as from a private index), it was
    # looked for on PyPI alone when installed: "not found in the package registry".
    assert "agentscope_private_sdk.py" in private_sdk_agentrun.namelist()
    report = build_modelstudio_archive(
        private_sdk_project, tmp_path, agent="agent:app", python_version=HOST_PYTHON
    )
    with zipfile.ZipFile(report.path) as archive:
        assert "wheels/agentscope_private_sdk-1.0-py3-none-any.whl" in archive.namelist()
        setup = archive.read("requirements.txt").decode()
    assert "agentscope-private-sdk==1.0" in setup and "--" not in setup


@contextlib.contextmanager
def serving_files(folder: Path) -> Iterator[int]:
    """An HTTP server on loopback handing out the files of ``folder``; yields its port."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_modelstudio_archive_pins_a_url_requirement_without_its_password(
    tmp_path: Path,
) -> None:
    # Its requirements.txt kept `name @ http://bob:password@host/...` word for word, and the
    # platform's offline SETUP_CMD fetched that URL again, failing where it cannot reach it.
    project = tmp_path / "project"
    write_wheel(tmp_path / "files", "agentscope_url_sdk", "1.0", "ANSWER = 42\n")
    (project / "agent.py").parent.mkdir()
    (project / "agent.py").write_text(
        "import agentscope_url_sdk\nfrom agentscope_serverless.agents.demo import app\n"
    )
    with serving_files(tmp_path / "files") as port:
        (project / "requirements.txt").write_text(
            f"agentscope_url_sdk @ http://bob:Sup3rS3cretPw9@127.0.0.1:{port}/"
            "agentscope_url_sdk-1.0-py3-none-any.whl\n"
        )
        report = build_modelstudio_archive(
            project, tmp_path / "out", agent="agent:app", python_version=HOST_PYTHON
        )
    root = tmp_path / "unpacked"
    with zipfile.ZipFile(report.path) as archive:
        archive.extractall(root)
    held = [p for p in root.rglob("*") if p.is_file() and b"Sup3rS3cretPw9" in p.read_bytes()]
    assert held == []
    assert "agentscope-url-sdk==1.0\n" in (root / "requirements.txt").read_text()
    assert (root / "wheels" / "agentscope_url_sdk-1.0-py3-none-any.whl").is_file()
    setup = shlex.split(read_config(root / "deploy_starter" / "config.yml")["SETUP_CMD"])
    # As on the platform: the archive's wheels alone, none of this machine's pip settings.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    installed = subprocess.run(
        [sys.executable, "-m", *setup, "--dry-run", "--ignore-installed", "--retries", "0"],
        cwd=root,
        env={**env, "PIP_CONFIG_FILE": os.devnull},
        capture_output=True,
        text=True,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "Processing ./wheels/agentscope_url_sdk-1.0-py3-none-any.whl" in installed.stdout


def test_an_agent_whose_import_never_ends_is_told_to_connect_when_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A connection made as the agent is imported, to a service the build cannot reach,
    # waited out the check's time limit and crashed the build with a traceback.
    (tmp_path / "waits.py").write_text("import time\n\ntime.sleep(3600)\n")
    monkeypatch.setattr("agentscope_serverless.packaging.project.IMPORT_TIMEOUT_SECONDS", 1.0)
    with pytest.raises(PackagingError) as refused:
        check_agent_import("waits:app", [tmp_path, *RUNTIME_PATH], python_version=HOST_PYTHON)
    assert str(refused.value) == (
        "the agent 'waits:app' was still importing after 1 s (waiting on a connection, say): it "
        "must import without the cloud's services: connect when it runs (its query handler, or "
        "@app.init)"
    )


# Requirements no index can give (the runtime's included): a project the build refuses with
# them is refused before its requirements are resolved. It was refused after they were
# installed, half a minute later, or for the requirements, and once they were mended, for
# what it had been refused for all along.
NO_INDEX = "--no-index\n"


def test_a_project_with_a_deploy_starter_folder_is_refused_for_modelstudio(
    tmp_path: Path,
) -> None:
    # Left by an earlier packaging (AgentScope's), it crashed the build with a traceback
    # (FileExistsError) and left the build's folder behind.
    project = tmp_path / "project"
    (project / "deploy_starter").mkdir(parents=True)
    (project / "deploy_starter" / "main.py").write_text("print('old starter')\n")
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    (project / "requirements.txt").write_text(NO_INDEX)
    out = tmp_path / "out"
    with pytest.raises(PackagingError, match="the project has a deploy_starter folder"):
        build_modelstudio_archive(project, out, agent="agent:app", python_version=HOST_PYTHON)
    assert not out.exists()  # nothing written


def test_a_project_file_whose_name_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    # Zipping it crashed the build with a traceback (UnicodeEncodeError).
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    (project / "requirements.txt").write_text(NO_INDEX)
    Path(os.fsdecode(bytes(project / "data") + b"/caf\xe9.txt")).write_text("x")
    out = tmp_path / "out"
    for build in (build_agentrun_archive, build_modelstudio_archive):
        with pytest.raises(PackagingError) as refused:
            build(project, out, agent="agent:app", python_version=HOST_PYTHON)
        assert str(refused.value) == (
            "the name of data/caf\\xe9.txt is not UTF-8 (written on another system, say), "
            "which an archive cannot hold: rename it"
        )
    assert not out.exists()  # nothing written


def test_a_link_out_of_the_project_is_refused_before_its_requirements_are_resolved(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    (project / "requirements.txt").write_text(NO_INDEX)
    (tmp_path / "id_ed25519").write_text("PRIVATE KEY\n")
    (project / "key").symlink_to(tmp_path / "id_ed25519")
    out = tmp_path / "out"
    for build in (build_agentrun_archive, build_modelstudio_archive):
        with pytest.raises(PackagingError, match="key links outside the project folder"):
            build(project, out, agent="agent:app", python_version=HOST_PYTHON)
    assert not out.exists()


def test_a_project_file_named_as_a_dependencys_leaves_that_dependency_as_it_was(
    tmp_path: Path,
) -> None:
    # uv installs a file as a link to its cache (and to every virtualenv holding it): the
    # project's README.md, copied over the dependency's, was written into them all, and the
    # next project built with the dependency got the first one's README.md as its own.
    vendor = tmp_path / "vendor"
    write_wheel(vendor, "agentscope_notes_sdk", "1.0", "", {"README.md": "the sdk's\n"})
    archived = {}
    for name, readme in (("first", "the first project's\n"), ("second", None)):
        project = tmp_path / name
        project.mkdir()
        (project / "requirements.txt").write_text(
            f"--find-links {vendor}\nagentscope_notes_sdk==1.0\n"
        )
        (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
        if readme is not None:
            (project / "README.md").write_text(readme)
        report = build_agentrun_archive(
            project, tmp_path / f"{name}-out", agent="agent:app", python_version=HOST_PYTHON
        )
        with zipfile.ZipFile(report.path) as archive:
            archived[name] = archive.read("README.md").decode()
    assert archived == {"first": "the first project's\n", "second": "the sdk's\n"}


def test_an_agentrun_archive_keeps_no_requirements_file_of_the_project(
    private_sdk_agentrun: zipfile.ZipFile,
) -> None:
    # Its options may name a private index with its password (--extra-index-url
    # https://user:token@...): it was archived as it was, as one of the project's files.
    names = private_sdk_agentrun.namelist()
    assert "agentscope_private_sdk.py" in names and "agent.py" in names
    assert "requirements.txt" not in names
    assert not [n for n in names if b"s3cret" in private_sdk_agentrun.read(n)]


def test_two_builds_of_an_unchanged_project_give_the_same_bytes(tmp_path: Path) -> None:
    # Each entry took its file's time: a checksum could not tell an unchanged build.
    project = tmp_path / "project"
    (project / "bin").mkdir(parents=True)
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    (project / "bin" / "start.sh").write_text("#!/bin/sh\n")
    (project / "bin" / "start.sh").chmod(0o700)
    digests = []
    for build in (1, 2):
        for path in project.rglob("*"):
            os.utime(path, (1_700_000_000 + build * 1000,) * 2)
        report = build_agentrun_archive(
            project, tmp_path / f"out{build}", agent="agent:app", python_version=HOST_PYTHON
        )
        digests.append(hashlib.sha256(report.path.read_bytes()).hexdigest())
    assert digests[0] == digests[1]
    with zipfile.ZipFile(report.path) as archive:
        infos = archive.infolist()
    assert {info.date_time for info in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert [info.filename for info in infos] == sorted(info.filename for info in infos)
    modes = {info.filename: info.external_attr >> 16 for info in infos}
    assert modes["bin/start.sh"] == 0o100755 and modes["agent.py"] == 0o100644


def write_sdist(folder: Path, name: str, version: str, module: str) -> None:
    """A pure-Python source archive of ``module`` (one ``.py``), as an index serves a package
    published with no wheel (docopt)."""
    folder.mkdir(parents=True, exist_ok=True)
    base = f"{name}-{version}"
    files = {
        f"{base}/setup.py": f"from setuptools import setup\n\nsetup(py_modules=[{name!r}])\n",
        f"{base}/setup.cfg": f"[metadata]\nname = {name}\nversion = {version}\n",
        f"{base}/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{base}/{name}.py": module,
    }
    with tarfile.open(folder / f"{base}.tar.gz", "w:gz") as sdist:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            sdist.addfile(info, io.BytesIO(data))


def test_two_modelstudio_builds_of_a_requirement_built_from_source_give_the_same_bytes(
    tmp_path: Path,
) -> None:
    # The wheel built of a source archive (docopt's) had its files dated when it was built.
    project = tmp_path / "project"
    write_sdist(project / "vendor", "agentscope_plain_sdk", "1.0", "ANSWER = 42\n")
    (project / "requirements.txt").write_text("--find-links ./vendor\nagentscope_plain_sdk==1.0\n")
    (project / "agent.py").write_text(
        "import agentscope_plain_sdk\nfrom agentscope_serverless.agents.demo import app\n"
    )
    digests = []
    for build in (1, 2):
        report = build_modelstudio_archive(
            project, tmp_path / f"out{build}", agent="agent:app", python_version=HOST_PYTHON
        )
        digests.append(hashlib.sha256(report.path.read_bytes()).hexdigest())
    with zipfile.ZipFile(report.path) as archive:
        wheel = archive.read("wheels/agentscope_plain_sdk-1.0-py3-none-any.whl")
    with zipfile.ZipFile(io.BytesIO(wheel)) as built:
        assert {info.date_time for info in built.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    assert digests[0] == digests[1]


def test_an_archive_takes_source_date_epoch_and_streams_each_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 3 GB model of the project was read whole into memory to be zipped.
    root = tmp_path / "root"
    root.mkdir()
    with (root / "model.bin").open("wb") as model:
        model.truncate(64 * 2**20)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # 2023-11-14 22:13:20 UTC
    tracemalloc.start()
    try:
        report = _zip_tree(root, tmp_path / "a.zip", 2**30, lambda _: None, tmp_path / "a.part")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak
    assert report.unpacked_bytes == 64 * 2**20
    with zipfile.ZipFile(tmp_path / "a.zip") as archive:
        (info,) = archive.infolist()
        assert info.date_time == (2023, 11, 14, 22, 13, 20)
        assert archive.testzip() is None
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(PackagingError, match=r"SOURCE_DATE_EPOCH is 'yesterday': give a time"):
        _zip_tree(root, tmp_path / "b.zip", 2**30, lambda _: None, tmp_path / "b.part")


def test_a_report_says_its_share_is_of_the_limit_on_the_archive(tmp_path: Path) -> None:
    # "3289.1 MB unpacked, 6% of the 500 MiB limit" read as a share of the unpacked size.
    report = ArchiveReport(tmp_path / "a.zip", 31_400_000, 3_289_100_000, 3447, 500 * 2**20)
    assert report.describe() == (
        f"{tmp_path / 'a.zip'} 31.4 MB zipped, 6% of the 500 MiB limit on the archive "
        "(3289.1 MB unpacked, 3447 files)"
    )


@pytest.mark.parametrize(
    ("name", "text", "refused"),
    [
        ("secrets.py", "def helper():\n    return 1\n", "the project's secrets.py hides the "),
        ("uuid.py", "X = 1\n", "the project's uuid.py hides the standard library's module uuid"),
        ("llm.py", 'KEY = "sk-proj-Ab3dEfGh1jKlMn0pQrStUvWx0123"\n', "llm.py (line 1) holds "),
        ("agentscope_serverless.py", "X = 1\n", "the project's agentscope_serverless.py is"),
    ],
)
def test_a_project_the_deployed_app_could_not_start_from_is_refused_before_installing(
    tmp_path: Path, name: str, text: str, refused: str
) -> None:
    # Built, the archive's server could not start (starlette got the project's secrets.py),
    # or carried the key; uuid.py was refused by the import check, told to use --source.
    project = tmp_path / "project"
    project.mkdir()
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    (project / "requirements.txt").write_text("agentscope-no-such-package==1\n")
    (project / name).write_text(text)
    out = tmp_path / "out"
    for build in (build_agentrun_archive, build_modelstudio_archive):
        with pytest.raises(PackagingError) as error:
            build(project, out, agent="agent:app", python_version=HOST_PYTHON)
        assert str(error.value).startswith(refused), error.value
        assert "--source" not in str(error.value) and "sk-proj" not in str(error.value)
    assert not out.exists()  # nothing resolved, installed or written


def test_a_stop_coming_as_the_build_folder_is_made_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A SIGTERM landing after the folder was made but before the build held it (a loaded
    # machine) left the folder in --out, the build exiting 143 all the same.
    from agentscope_serverless.packaging import archives

    made = archives._scratch

    def made_then_stopped(out_dir: Path, archive: Path) -> Path:
        made(out_dir, archive)
        raise KeyboardInterrupt  # as the stop signal's handler raises

    monkeypatch.setattr(archives, "_scratch", made_then_stopped)
    out = tmp_path / "dist"
    with pytest.raises(KeyboardInterrupt), archives._build_folder(out, out / "a.zip"):
        pass
    assert list(out.iterdir()) == []
