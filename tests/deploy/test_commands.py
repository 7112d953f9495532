"""The deploy commands: ``agentscope-serverless deploy ...`` and the scripts in ``deploy/``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentscope_serverless.cli import app
from agentscope_serverless.errors import PackagingError
from agentscope_serverless.packaging import sam
from tests.conftest import PROJECT_ROOT
from tests.deploy.conftest import HOST_PYTHON, OUTPUTS, FakeSam
from tests.deploy.test_archives import write_wheel
from tests.deploy.test_deployers import without_alibaba_cloud_credentials
from tests.support.signals import terminal_signals

runner = CliRunner()


def run_script(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = PROJECT_ROOT / "deploy" / f"{name}.py"
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=cwd, capture_output=True, text=True
    )


def test_sam_script_prints_the_templates_functions_from_any_directory(tmp_path: Path) -> None:
    result = run_script("sam", "functions", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(
        sam.functions_json(PROJECT_ROOT / "template.yaml")
    )


def test_agentrun_script_builds_the_archive_and_prints_its_size(tmp_path: Path) -> None:
    result = run_script(
        "agentrun", "--python-version", HOST_PYTHON, "--out", "dist", "--skip-upload", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    archive = tmp_path / "dist" / "agentscope-serverless-agentrun.zip"
    assert f"archive: {archive}" in result.stdout
    assert f"size: {archive.stat().st_size} bytes" in result.stdout


def test_deploy_sam_without_credentials_says_it_only_built(fake_sam: FakeSam) -> None:
    fake_sam.credentials = False
    result = runner.invoke(
        app, ["deploy", "sam", "deploy", "--stack-name", "s", "--project-root", str(PROJECT_ROOT)]
    )
    assert result.exit_code == 3
    assert "not deployed" in result.output and "no AWS credentials" in result.output
    assert [call for call, _ in fake_sam.calls] == ["validate", "build"]


def test_deploy_sam_prints_the_stack_outputs(fake_sam: FakeSam) -> None:
    result = runner.invoke(
        app,
        [
            "deploy",
            "sam",
            "deploy",
            "--stack-name",
            "s",
            "--param",
            "LlmModel=m",
            "--param",
            "AgentApp=pkg.mod:app",
            "--project-root",
            str(PROJECT_ROOT),
        ],
    )
    assert result.exit_code == 0, result.output
    assert OUTPUTS["ProcessUrl"] in result.output and "ApiKeysTableName" in result.output
    _, (_stack, options) = fake_sam.calls[-1]
    assert options["parameters"] == {"LlmModel": "m", "AgentApp": "pkg.mod:app"}


def test_parameters_must_be_key_value_pairs(fake_sam: FakeSam) -> None:
    result = runner.invoke(app, ["deploy", "sam", "deploy", "--stack-name", "s", "--param", "x"])
    assert result.exit_code == 1 and "KEY=VALUE" in result.output
    assert fake_sam.calls == []


@pytest.mark.parametrize("given", ["LlmApiKey:sk-live-4f3e2d", "=sk-live-4f3e2d"])
def test_a_parameter_that_is_no_key_value_pair_is_not_said_back(
    fake_sam: FakeSam, given: str
) -> None:
    # It may be a secret mistyped (the error quoted it, in a terminal or a CI log).
    arguments = ["--stack-name", "s", "--param", "LlmModel=m", "--param", given]
    result = runner.invoke(app, ["deploy", "sam", "deploy", *arguments])
    assert result.exit_code == 1 and "KEY=VALUE" in result.output
    assert "sk-live" not in result.output and "--param number 2 is not" in result.output
    assert fake_sam.calls == []


def test_deploy_modelstudio_with_credentials_stops_before_building(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "id")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "secret")
    result = runner.invoke(app, ["deploy", "modelstudio", "--out", str(tmp_path)])
    assert result.exit_code == 3 and "not uploaded" in result.output
    assert not list(tmp_path.iterdir())


def test_deploy_agentrun_with_a_bad_agentrun_variable_says_which(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AGENT_RUN_VSWITCH_IDS", "vsw-1,vsw-2")
    result = runner.invoke(app, ["deploy", "agentrun", "--out", str(tmp_path), "--skip-upload"])
    assert result.exit_code == 1, result.output
    assert "error: AGENT_RUN_VSWITCH_IDS must be a JSON list" in result.output
    assert not list(tmp_path.iterdir())


def test_long_steps_report_progress_when_the_output_is_not_a_terminal(
    fake_sam: FakeSam, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentscope_serverless import deploy_cli

    beat = threading.Event()
    printed = deploy_cli.console.print

    def print_and_notice(*args: Any, **kwargs: Any) -> None:
        if any("still building" in str(arg) for arg in args):
            beat.set()
        printed(*args, **kwargs)

    def slow_build(root: Path, *, build_dir: Path | None = None, agent: str | None = None) -> Path:
        assert beat.wait(30), "no progress line while the build ran"
        return fake_sam.build_dir

    monkeypatch.setattr(deploy_cli, "HEARTBEAT_SECONDS", 0.05)
    monkeypatch.setattr(deploy_cli.console, "print", print_and_notice)
    monkeypatch.setattr(sam, "build", slow_build)
    fake_sam.credentials = False
    result = runner.invoke(
        app, ["deploy", "sam", "deploy", "--stack-name", "s", "--project-root", str(PROJECT_ROOT)]
    )
    assert result.exit_code == 3, result.output
    lines = result.output.splitlines()
    started = lines.index("building every function and the shared layer (sam build)...")
    assert lines[started + 1].startswith("  still building every function")


def test_a_python_is_found_past_pyenv_shims_that_fail_for_versions_not_selected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # uv took pyenv's shim of python3.12, which exits 127 unless PYENV_VERSION selects 3.12,
    # and "deploy agentrun" (Python 3.12 by default) said 3.12 was not installed.
    from agentscope_serverless.packaging import project

    shims = tmp_path / "pyenv" / "shims"
    version_bin = tmp_path / "pyenv" / "versions" / "3.12.1" / "bin"
    for folder in (shims, version_bin):
        folder.mkdir(parents=True)
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    monkeypatch.setenv("PATH", os.pathsep.join(["/usr/bin", str(shims), "/bin"]))
    assert project._path_past_shims().split(os.pathsep) == ["/usr/bin", "/bin", str(version_bin)]
    with pytest.raises(PackagingError, match=r"CPython 3\.5 is needed .*\(uv: .+\)"):
        project.interpreter("3.5")  # why uv found none is said


@pytest.mark.parametrize("platform", ["agentrun", "modelstudio"])
def test_a_source_that_is_a_file_or_nothing_is_refused_before_anything_is_built(
    tmp_path: Path, platform: str
) -> None:
    # It was taken for a folder that does not exist, said only once the requirements were
    # resolved and installed.
    agent = tmp_path / "agent.py"
    agent.write_text("from agentscope_serverless.agents.demo import app\n")
    out = tmp_path / "out"
    for source, says in [(agent, "is a file"), (tmp_path / "missing", "does not exist")]:
        command = ["deploy", platform, "--source", str(source), "--out", str(out)]
        result = runner.invoke(app, [*command, "--skip-upload"])
        said = " ".join(result.output.replace("│", " ").split())  # out of its box
        assert result.exit_code == 2, result.output
        assert "--source" in said and says in said, said
    assert not out.exists()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("platform", ["agentrun", "modelstudio"])
def test_requirements_given_on_the_command_line_are_installed_in_the_archive(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, platform: str
) -> None:
    """The deployers took requirements=[...], the deploy commands had no way to give them: a
    project had to list them in a requirements.txt of its own."""
    without_alibaba_cloud_credentials(monkeypatch)
    project = tmp_path / "project"
    write_wheel(project / "vendor", "agentscope_private_sdk", "1.0", "ANSWER = 42\n")
    (project / "agent.py").write_text(
        "import agentscope_private_sdk\n\nfrom agentscope_serverless.agents.demo import app\n"
    )
    given = ["-r", "--find-links ./vendor", "--requirement", "agentscope_private_sdk==1.0"]
    command = ["deploy", platform, "--agent", "agent:app", "--source", str(project)]
    out = ["--out", str(tmp_path / "out"), "--python-version", HOST_PYTHON, "--skip-upload"]
    result = runner.invoke(app, [*command, *out, *given])
    assert result.exit_code == 0, result.output
    (archive,) = (tmp_path / "out").glob("*.zip")
    with zipfile.ZipFile(archive) as built:
        names = built.namelist()
    wheel = "wheels/agentscope_private_sdk-1.0-py3-none-any.whl"
    assert ("agentscope_private_sdk.py" if platform == "agentrun" else wheel) in names


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["openai", "--target=/srv/elsewhere"], "--requirement number 2 is the option --target"),
        (["--index-url=https://user:s3cret@pypi.example/simple extra"], "--requirement number 1"),
        (["openai --no-deps"], "--requirement number 1 carries an option"),
        (["./libs/mylib"], "--requirement number 1 is not a requirement"),
        ([" "], "--requirement number 1 is empty"),
    ],
)
@pytest.mark.parametrize("platform", ["agentrun", "modelstudio"])
def test_a_requirement_option_that_is_no_requirement_is_refused_naming_its_place(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, platform: str, given: list[str], said: str
) -> None:
    without_alibaba_cloud_credentials(monkeypatch)
    options = [option for entry in given for option in ("--requirement", entry)]
    out = tmp_path / "out"
    result = runner.invoke(app, ["deploy", platform, "--out", str(out), "--skip-upload", *options])
    assert result.exit_code == 1, result.output
    assert f"error: {said}" in result.output
    assert "s3cret" not in result.output
    assert not out.exists()


# What uv quotes when it cannot read a requirement or an index URL (an invalid port here, so
# the resolve fails at once, offline): the URL whole, its password too.
QUOTED_BY_UV = [
    ("--index-url https://alice:s3cret@127.0.0.1:99999/simple", "https://****@127.0.0.1:99999"),
    ("mylib @ https://alice:s3cret@127.0.0.1:99999/mylib-1.0.tar.gz", "https://****@127.0.0.1"),
    ("--extra-index-url https://tok%40en:s3cret@[bad/simple", "https://****@[bad/simple"),
]


@pytest.mark.parametrize("given", ["requirements.txt", "--requirement"])
@pytest.mark.parametrize(("line", "shown"), QUOTED_BY_UV)
def test_a_failed_resolve_never_shows_the_password_of_a_url_it_quotes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, given: str, line: str, shown: str
) -> None:
    without_alibaba_cloud_credentials(monkeypatch)
    project = tmp_path / "project"
    project.mkdir()
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    options = ["--requirement", line]
    if given == "requirements.txt":
        (project / "requirements.txt").write_text(f"{line}\nsix\n")
        options = []
    command = ["deploy", "agentrun", "--agent", "agent:app", "--source", str(project)]
    out = ["--out", str(tmp_path / "out"), "--python-version", HOST_PYTHON, "--skip-upload"]
    result = runner.invoke(app, [*command, *out, *options])
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    assert "failed" in said and shown in said, said  # the error says what and where
    assert "s3cret" not in said and "alice" not in said and "tok%40en" not in said


@pytest.mark.parametrize("step", ["validate", "build"])
def test_a_failed_sam_step_never_shows_the_password_of_a_url_it_quotes(
    tmp_path: Path, step: str
) -> None:
    # sam build runs pip on the layer's requirements: pip's error quotes their index URL.
    # The project's own SAM CLI (its .venv-sam) runs the step: validate and build ran the
    # SAM CLI of the runtime's checkout, or of the PATH, instead.
    (tmp_path / "agent.py").write_text("app = None\n")
    sam_program = tmp_path / ".venv-sam" / "bin" / "sam"
    sam_program.parent.mkdir(parents=True)
    sam_program.write_text(
        "#!/bin/sh\necho 'Looking in indexes: https://alice:s3cret@pypi.example/simple' >&2\n"
        "exit 1\n"
    )
    sam_program.chmod(0o755)
    agent = ["--agent", "agent:app"] if step == "build" else []
    result = runner.invoke(app, ["deploy", "sam", step, "--project-root", str(tmp_path), *agent])
    assert result.exit_code == 1, result.output
    assert f"sam {step} failed" in result.output
    assert "https://****@pypi.example/simple" in result.output
    assert "s3cret" not in result.output and "alice" not in result.output


@pytest.mark.timeout(300)
def test_the_developers_credentials_in_the_project_stay_out_of_the_archive_and_are_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A project holding .aws/credentials or a .netrc had them archived, readable by any
    user, while its .env was left out."""
    without_alibaba_cloud_credentials(monkeypatch)
    project = tmp_path / "project"
    (project / ".aws").mkdir(parents=True)
    (project / ".aws" / "credentials").write_text("[default]\naws_secret_access_key = wJalr\n")
    (project / ".netrc").write_text("machine pypi.example.com login me password pw\n")
    (project / ".env").write_text("OPENAI_API_KEY=sk-secret\n")
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    command = ["deploy", "agentrun", "--agent", "agent:app", "--source", str(project)]
    out = ["--out", str(tmp_path / "out"), "--python-version", HOST_PYTHON, "--skip-upload"]
    result = runner.invoke(app, [*command, *out])
    assert result.exit_code == 0, result.output
    assert "left out as secrets: .aws/, .env, .netrc (" in result.output
    (archive,) = (tmp_path / "out").glob("*.zip")
    with zipfile.ZipFile(archive) as built:
        names = built.namelist()
    assert "agent.py" in names
    assert not [name for name in names if name.startswith((".aws", ".netrc", ".env"))]


@pytest.mark.timeout(300)
def test_credentials_files_of_any_name_and_the_tests_settings_stay_out_of_the_archive(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An AWS credentials file or an OAuth client's secret of a name of its own was archived,
    readable by any user, and so was the pytest.ini init writes; a module showing the
    credentials file's format stays."""
    without_alibaba_cloud_credentials(monkeypatch)
    project = tmp_path / "project"
    (project / "secrets").mkdir(parents=True)
    aws = "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n"
    (project / "prod-aws.ini").write_text(f"[prod]\naws_access_key_id = AKIAEXAMPLE\n{aws}")
    (project / "secrets" / "aws").write_text(f"[default]\n{aws}")
    (project / "service.json").write_text('{"client_secret": "GOCSPX-abcdefghijklmnop"}\n')
    (project / "aws_files.py").write_text(f'"""Reads a file of these lines:\n\n{aws}"""\n')
    (project / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    command = ["deploy", "agentrun", "--agent", "agent:app", "--source", str(project)]
    out = ["--out", str(tmp_path / "out"), "--python-version", HOST_PYTHON, "--skip-upload"]
    result = runner.invoke(app, [*command, *out])
    assert result.exit_code == 0, result.output
    assert "left out as secrets: prod-aws.ini, secrets/aws, service.json (" in result.output
    (archive,) = (tmp_path / "out").glob("*.zip")
    with zipfile.ZipFile(archive) as built:
        names = built.namelist()
    assert "agent.py" in names and "aws_files.py" in names
    left_out = ("prod-aws.ini", "secrets/", "service.json", "pytest.ini")
    assert not [name for name in names if name.startswith(left_out)]


@pytest.mark.parametrize("platform", ["agentrun", "modelstudio"])
def test_a_project_of_ones_own_without_agent_is_refused_naming_its_agentapp(
    tmp_path: Path, platform: str
) -> None:
    """The archive of the project served the demo agent, without a word."""
    project = tmp_path / "project"
    (project / "weather").mkdir(parents=True)
    (project / "weather" / "__init__.py").write_text("")
    (project / "weather" / "agent.py").write_text(
        "from agentscope_serverless.app import AgentApp\n\nbot: AgentApp = AgentApp()\n"
    )
    out = tmp_path / "out"
    command = ["deploy", platform, "--source", str(project), "--out", str(out), "--skip-upload"]
    result = runner.invoke(app, command)
    said = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "demo agent" in said and "--agent module:attribute" in said, said
    assert "its modules assign weather.agent:bot" in said, said
    assert not out.exists()


@pytest.mark.timeout(300)
def test_an_archive_is_named_after_the_project_folder_unless_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every archive was agentscope-serverless-agentrun.zip, named agentscope-serverless."""
    without_alibaba_cloud_credentials(monkeypatch)
    project = tmp_path / "weather bot"
    project.mkdir()
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    command = ["deploy", "agentrun", "--agent", "agent:app", "--source", str(project)]
    out = ["--out", str(tmp_path / "out"), "--python-version", HOST_PYTHON, "--skip-upload"]
    for given, name in [([], "weather-bot"), (["--name", "forecasts"], "forecasts")]:
        result = runner.invoke(app, [*command, *out, *given])
        assert result.exit_code == 0, result.output
        with zipfile.ZipFile(tmp_path / "out" / f"{name}-agentrun.zip") as built:
            assert json.loads(built.read("agentrun.json"))["name"] == name


@pytest.mark.parametrize("command", [["build"], ["deploy", "--stack-name", "s"]])
def test_a_sam_stack_of_ones_own_project_without_agent_is_refused_naming_its_agentapp(
    fake_sam: FakeSam, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """Run from the project's folder, the stack's layer held the project but served the
    demo agent (the template's default), without a word."""
    project = tmp_path / "project"
    (project / "weather").mkdir(parents=True)
    (project / "weather" / "__init__.py").write_text("")
    (project / "weather" / "agent.py").write_text(
        "from agentscope_serverless.app import AgentApp\n\nbot: AgentApp = AgentApp()\n"
    )
    monkeypatch.chdir(project)
    monkeypatch.delenv("AGENTSCOPE_PROJECT_ROOT", raising=False)
    result = runner.invoke(app, ["deploy", "sam", *command])
    said = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "stack would serve the demo agent" in said and "--agent module:attribute" in said
    assert "its modules assign weather.agent:bot" in said, said
    assert fake_sam.calls == []
    # Named by --agent, or by the stack's AgentApp parameter, it is built.
    result = runner.invoke(app, ["deploy", "sam", *command, "--agent", "weather.agent:bot"])
    assert result.exit_code == 0, result.output
    assert fake_sam.agent == "weather.agent:bot"
    if command[0] == "deploy":
        given = ["--param", "AgentApp=weather.agent:bot"]
        assert runner.invoke(app, ["deploy", "sam", *command, *given]).exit_code == 0


@pytest.mark.parametrize("command", [["build"], ["deploy", "--stack-name", "s"]])
def test_a_sam_stack_names_the_projects_secrets_its_layer_leaves_out(
    fake_sam: FakeSam, tmp_path: Path, command: list[str]
) -> None:
    """The archive builds named the secrets they left out; the SAM layer left them out
    without a word, so an agent reading its .env found nothing on Lambda, unsaid."""
    project = tmp_path / "project"
    (project / ".aws").mkdir(parents=True)
    (project / ".aws" / "credentials").write_text("[default]\naws_secret_access_key = wJalr\n")
    (project / ".env").write_text("OPENAI_API_KEY=sk-secret\n")
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    given = ["--project-root", str(project), "--agent", "agent:app"]
    result = runner.invoke(app, ["deploy", "sam", *command, *given])
    assert result.exit_code == 0, result.output
    assert "left out as secrets: .aws/, .env (" in result.output
    assert "wJalr" not in result.output and "sk-secret" not in result.output
    # What the build is made of (the SAM project it stages) holds none of them.
    layer = sam.stage_project(project, tmp_path / "stage", agent="agent:app") / "shared"
    assert (layer / "agent.py").is_file()
    assert not (layer / ".env").exists() and not (layer / ".aws").exists()


@pytest.mark.parametrize("platform", ["agentrun", "modelstudio"])
@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            "SESSION_HISTORY_BACKND=redis",
            "SESSION_HISTORY_BACKND (did you mean SESSION_HISTORY_BACKEND?), which is no setting",
        ),
        ("state_backen=dynamodb", "state_backen (did you mean STATE_BACKEND?)"),
        ("SESSION_HISTORY_BACKEND=dynamo", "invalid settings: SESSION_HISTORY_BACKEND: "),
        ("AGENT_HISTORY_WINDOW=abc", "invalid settings: AGENT_HISTORY_WINDOW: "),
        ("LLM_API_KEY=sk-secret-123 ", "invalid settings: LLM_API_KEY: its value begins"),
        ("REDIS_URL=localhost:6379", "invalid settings: REDIS_URL: give a URL beginning with"),
    ],
)
def test_an_env_option_naming_a_setting_amiss_or_giving_it_a_bad_value_is_refused(
    tmp_path: Path, platform: str, env: str, says: str
) -> None:
    # The archive was built, exit 0: the service then ignored the misspelt setting (in-memory
    # stores) or refused to start with the bad value.
    project_root = tmp_path / "project"
    project_root.mkdir()
    (project_root / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    out = tmp_path / "out"
    command = ["deploy", platform, "--agent", "agent:app", "--project-root", str(project_root)]
    result = runner.invoke(
        app, [*command, "--out", str(out), "--env", "OPENAI_API_KEY=sk-own", "--env", env]
    )
    said = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert says in said and "sk-secret" not in said and "OPENAI" not in said, said
    assert not out.exists() or not list(out.iterdir())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_build_stopped_by_a_signal_removes_its_folder_and_exits_with_the_signals_code(
    tmp_path: Path, signum: signal.Signals
) -> None:
    # Stopped by SIGTERM (a CI job cancelled, `timeout`), a build ended at once, leaving its
    # folder (a copy of the project and every dependency, 79 MB) in --out for good.
    project = tmp_path / "project"
    project.mkdir()
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    (project / "requirements.txt").write_text("")
    out = tmp_path / "dist"
    command = [
        *("deploy", "agentrun", "--agent", "agent:app", "--source", str(project)),
        *("--out", str(out), "--python-version", HOST_PYTHON, "--skip-upload"),
    ]
    stopped(command, signum, when=lambda: bool(list(out.glob(".agentscope-build-*"))))
    assert list(out.iterdir()) == []


def stopped(
    command: list[str],
    signum: signal.Signals,
    *,
    when: Callable[[], bool],
    env: dict[str, str] | None = None,
) -> None:
    """Run the CLI's ``command`` and send it ``signum`` once ``when()`` holds: it exits with
    the signal's code, saying it was stopped."""
    build = subprocess.Popen(
        [sys.executable, "-m", "agentscope_serverless.cli", *command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=terminal_signals,
    )
    try:
        deadline = time.monotonic() + 60
        while not when():
            assert build.poll() is None, build.communicate()
            assert time.monotonic() < deadline, "the build never got that far"
            time.sleep(0.05)
        build.send_signal(signum)
        _, stderr = build.communicate(timeout=60)
    finally:
        build.kill()
    assert build.returncode == 128 + signum, stderr
    assert f"stopped by {signum.name}" in stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("command", [["build"], ["deploy", "--stack-name", "my-agent"]])
def test_a_stack_build_stopped_by_a_signal_leaves_no_half_build_and_exits_with_its_code(
    tmp_path: Path, signum: signal.Signals, command: list[str]
) -> None:
    # Stopped by SIGTERM, `deploy sam build` ended at once: its stage in the temporary
    # folder and the half-written build folder stayed, and the exit status was the signal's;
    # `deploy sam deploy` built in a thread the signal never reached.
    project = tmp_path / "project"
    (project / ".venv-sam" / "bin").mkdir(parents=True)
    (project / "agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    pid_file = tmp_path / "sam.pid"
    stand_in = project / ".venv-sam" / "bin" / "sam"  # a SAM CLI writing its build, slowly
    stand_in.write_text(
        "#!/bin/sh\n"
        '[ "$1" = validate ] && exit 0\n'
        'while [ $# -gt 0 ]; do [ "$1" = --build-dir ] && dir=$2; shift; done\n'
        'mkdir -p "$dir/SharedLayer/python" && touch "$dir/template.yaml"\n'
        f'echo $$ > "{pid_file}"\n'
        "exec sleep 60\n"
    )
    stand_in.chmod(0o755)
    scratch, build_dir = tmp_path / "tmp", tmp_path / "build"
    scratch.mkdir()
    where = ["--project-root", str(project), "--build-dir", str(build_dir)]
    stopped(
        ["deploy", "sam", *command, "--agent", "agent:app", *where],
        signum,
        when=lambda: pid_file.exists() and bool(pid_file.read_text().strip()),
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert not build_dir.exists()
    assert list(scratch.iterdir()) == []
    sam_pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # the SAM CLI was stopped too
        os.kill(sam_pid, 0)
