"""The deployers: SAM builds and deploys only with AWS credentials; the archive deployers
build and report, and refuse to pretend to upload."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from agentscope_serverless.deployers import (
    AgentRunDeployManager,
    DeployManager,
    ModelStudioDeployManager,
    SAMDeployManager,
    sam_deployer,
)
from agentscope_serverless.deployers.base import import_path_of
from agentscope_serverless.errors import (
    ConfigurationError,
    PackagingError,
    UploadNotAvailableError,
)
from agentscope_serverless.packaging import sam
from tests.conftest import PROJECT_ROOT, without_aws_credentials
from tests.deploy.conftest import HOST_PYTHON, OUTPUTS, FakeSam
from tests.deploy.test_archives import write_wheel


@pytest.mark.timeout(300)
def test_sam_without_credentials_builds_and_deploys_nothing(
    sam_offline_deploy: dict[str, Any],
) -> None:
    info = sam_offline_deploy
    assert info["deployed"] is False
    assert info["url"] is None and info["urls"] == {} and info["deploy_id"] is None
    assert "no AWS credentials" in info["reason"]
    assert (Path(info["build_dir"]) / "template.yaml").is_file()


def test_credentials_come_from_botocores_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    without_aws_credentials(monkeypatch)
    assert not sam.has_credentials()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    assert sam.has_credentials()


def test_sam_with_credentials_deploys_and_reports_the_function_urls(
    fake_sam: FakeSam, tmp_path: Path
) -> None:
    assert sam_deployer._sam() is sam  # the module the fake stands in
    manager = SAMDeployManager(PROJECT_ROOT, "my-agent", {"LlmModel": "m"}, region="eu-west-1")
    assert isinstance(manager, DeployManager) and not manager.is_running
    info = asyncio.run(manager.deploy())
    assert info["deployed"] is True and info["url"] == OUTPUTS["ProcessUrl"]
    assert set(info["urls"]) == {"ProcessUrl", "SessionsUrl", "MemoryUrl", "StateUrl", "SandboxUrl"}
    assert info["outputs"]["ApiKeysTableName"] == "stack-ApiKeysTable-1"
    assert manager.is_running and manager.service_url == OUTPUTS["ProcessUrl"]
    assert info["deploy_id"] == manager.deploy_id
    assert [call for call, _ in fake_sam.calls] == ["validate", "build", "deploy"]
    stack, options = fake_sam.calls[2][1]
    assert stack == "my-agent"
    assert options == {
        "parameters": {"LlmModel": "m"},
        "build_dir": tmp_path,
        "region": "eu-west-1",
    }


def test_stopping_a_sam_deployment_deletes_its_stack(fake_sam: FakeSam) -> None:
    manager = SAMDeployManager(PROJECT_ROOT, "my-agent")
    asyncio.run(manager.deploy())
    asyncio.run(manager.stop())
    assert fake_sam.calls[-1] == ("delete", "my-agent")
    assert not manager.is_running and manager.service_url is None


def test_agentrun_deployer_returns_the_archive_without_credentials(
    agentrun_deploy: dict[str, Any],
) -> None:
    assert_archive_info(agentrun_deploy, "AgentRun", "-agentrun.zip")


def test_modelstudio_deployer_returns_the_archive_without_credentials(
    modelstudio_deploy: dict[str, Any],
) -> None:
    assert_archive_info(modelstudio_deploy, "ModelStudio", "-modelstudio.zip")


def assert_archive_info(info: dict[str, Any], platform: str, suffix: str) -> None:
    archive = Path(info["artifact_path"])
    assert archive.name.endswith(suffix) and archive.stat().st_size == info["size_bytes"]
    assert info["platform"] == platform and info["uploaded"] is False and info["url"] is None
    assert 0 < info["size_bytes"] < info["limit_bytes"]
    assert info["unpacked_bytes"] > info["size_bytes"] and info["files"] > 0


def test_with_credentials_the_archive_deployer_refuses_to_pretend_an_upload(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "id")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "secret")
    manager = AgentRunDeployManager(tmp_path, project_root=PROJECT_ROOT, python_version=HOST_PYTHON)
    with pytest.raises(UploadNotAvailableError, match=r"not available.*--skip-upload"):
        asyncio.run(manager.deploy())
    assert not list(tmp_path.iterdir())
    assert not manager.is_running and manager.service_url is None


def test_skip_upload_builds_only_even_with_credentials(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "id")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "secret")
    manager = AgentRunDeployManager(tmp_path, project_root=PROJECT_ROOT, python_version=HOST_PYTHON)
    info = asyncio.run(manager.deploy(skip_upload=True))
    assert Path(info["artifact_path"]).is_file() and info["uploaded"] is False


def test_archive_deployers_share_the_deploy_manager_interface() -> None:
    for manager_class in (AgentRunDeployManager, ModelStudioDeployManager):
        manager = manager_class("dist")
        assert isinstance(manager, DeployManager)
        assert not manager.is_running and manager.service_url is None
        asyncio.run(manager.stop())


def test_a_stack_name_cloudformation_refuses_is_refused_before_anything_is_built(
    fake_sam: FakeSam,
) -> None:
    manager = SAMDeployManager(PROJECT_ROOT, "my_agent")
    with pytest.raises(PackagingError, match="'my_agent' is not a CloudFormation stack name"):
        asyncio.run(manager.deploy())
    assert fake_sam.calls == []


def test_a_parameter_the_template_does_not_have_is_refused_before_anything_is_built(
    fake_sam: FakeSam,
) -> None:
    """SAM drops a parameter override the template does not have without a word: a
    misspelt LLMApiKey deployed a stack whose agent had no key."""
    manager = SAMDeployManager(PROJECT_ROOT, "my-agent", {"LLMApiKey": "sk-1", "LlmModel": "m"})
    with pytest.raises(PackagingError) as refused:
        asyncio.run(manager.deploy())
    message = str(refused.value)
    assert message.startswith("the template has no parameter LLMApiKey (did you mean LlmApiKey?)")
    assert "LlmModel" in message.partition("its parameters: ")[2]
    assert fake_sam.calls == []


@pytest.mark.parametrize(
    ("parameters", "says"),
    [
        ({"LlmBaseUrl": "api.openai.com/v1"}, "LLM_BASE_URL: give a URL beginning with http"),
        ({"ExistingRedisUrl": "localhost:6379"}, "REDIS_URL: give a URL beginning with redis"),
        ({"LlmApiKey": "sk-live-1\n"}, "LLM_API_KEY: its value begins or ends with white"),
        ({"AgentApp": "agent.py"}, "AGENT_APP: give the AgentApp as module:attribute"),
    ],
)
def test_a_parameter_that_is_a_setting_with_a_value_it_refuses_is_refused_before_building(
    fake_sam: FakeSam, parameters: dict[str, str], says: str
) -> None:
    # The stack was built and deployed; every function then failed its first request.
    manager = SAMDeployManager(PROJECT_ROOT, "my-agent", {"LlmModel": "m", **parameters})
    with pytest.raises(PackagingError) as refused:
        asyncio.run(manager.deploy())
    message = str(refused.value)
    assert message.startswith(f"invalid settings: {says}"), message
    [(parameter, _)] = parameters.items()
    assert f"{parameter} is " in message and "sk-live" not in message
    assert fake_sam.calls == []


def test_sam_deploy_refuses_a_parameter_its_built_template_does_not_have(tmp_path: Path) -> None:
    (tmp_path / "template.yaml").write_text((PROJECT_ROOT / "template.yaml").read_text())
    with pytest.raises(PackagingError, match="no parameter SubnetId \\(did you mean SubnetIds"):
        sam.deploy(
            PROJECT_ROOT,
            "my-agent",
            parameters={"SubnetId": "subnet-a"},
            build_dir=tmp_path,
            region="eu-west-1",
        )


def test_an_app_deploys_itself_with_the_sam_manager(
    fake_sam: FakeSam, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AgentScope's way, await app.deploy(manager), got a TypeError from the SAM manager
    (and an AttributeError from the archive managers, which took the app for its path)."""
    project = tmp_path / "project"
    (project / "weather").mkdir(parents=True)
    (project / "weather" / "__init__.py").write_text("")
    (project / "weather" / "agent.py").write_text(
        "from agentscope_serverless.app import AgentApp\n\nbot = AgentApp()\n"
    )
    monkeypatch.syspath_prepend(str(project))
    bot = importlib.import_module("weather.agent").bot
    info = asyncio.run(bot.deploy(SAMDeployManager(project, "my-agent")))
    assert info["deployed"] is True
    assert fake_sam.agent == "weather.agent:bot"


def test_a_sam_stack_of_ones_own_project_deployed_without_its_app_is_refused_naming_it(
    fake_sam: FakeSam, tmp_path: Path
) -> None:
    """manager.deploy() named no app: the stack of the project served the demo agent."""
    (tmp_path / "agent.py").write_text(
        "from agentscope_serverless import AgentApp\napp=AgentApp()\n"
    )
    manager = SAMDeployManager(tmp_path, "my-agent")
    refused = r"demo agent.*agent='module:attribute'.*agent:app"
    with pytest.raises(ConfigurationError, match=refused):
        asyncio.run(manager.deploy())
    assert fake_sam.calls == []
    asyncio.run(SAMDeployManager(tmp_path, "my-agent", agent="agent:app").deploy())
    assert fake_sam.agent == "agent:app"


def test_the_app_of_a_script_deploying_itself_is_named_by_the_scripts_module(
    tmp_path: Path,
) -> None:
    """python agent.py, whose __main__ calls app.deploy(manager), as AgentScope's examples."""
    (tmp_path / "agent.py").write_text(
        "from agentscope_serverless.app import AgentApp\n"
        "from agentscope_serverless.deployers.base import import_path_of\n\n"
        "app = AgentApp()\n\n"
        "if __name__ == '__main__':\n"
        "    print(import_path_of(app))\n"
        "    print(import_path_of('other:app'))\n"
    )
    result = subprocess.run(
        [sys.executable, "agent.py"], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["agent:app", "other:app"]
    with pytest.raises(ConfigurationError, match="top-level attribute of a module of the project"):
        import_path_of(object())


APP_MODULE = """from agentscope_serverless.app import AgentApp
from agentscope_serverless.deployers.base import import_path_of

app = AgentApp()

if __name__ == '__main__':
    print(import_path_of(app))
"""


@pytest.mark.parametrize(
    ("script", "text"),
    [
        # A script deploying itself, importing what imports multiprocessing (uvicorn).
        (
            "agent.py",
            f"from agentscope_serverless.deployers import LocalDeployManager\n{APP_MODULE}",
        ),
        # A deploy script importing a deployer, then the app of the agent's module.
        (
            "deploy.py",
            "from agentscope_serverless.deployers import LocalDeployManager\n"
            "from agentscope_serverless.deployers.base import import_path_of\n"
            "from agent import app\n\n"
            "print(import_path_of(app))\n",
        ),
    ],
)
def test_a_script_importing_multiprocessing_has_its_app_named_by_the_agents_module(
    tmp_path: Path, script: str, text: str
) -> None:
    """Once multiprocessing was imported, the script run was named '__mp_main__', which no
    archive can import."""
    (tmp_path / "agent.py").write_text(APP_MODULE)
    (tmp_path / script).write_text(text)
    result = subprocess.run(
        [sys.executable, script], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["agent:app"]


DEPLOYING = """import asyncio

from agentscope_serverless.deployers import AgentRunDeployManager
from agentscope_serverless.deployers.base import import_path_of
from agentscope_serverless.errors import PackagingError

def deploy(app):
    manager = AgentRunDeployManager()
    try:  # a name no archive takes: refused once the project is known, before building
        asyncio.run(app.deploy(manager, deploy_name="no name", skip_upload=True))
    except PackagingError:
        print(manager.project_root, manager.build_root, import_path_of(app, manager.project_root))
"""
SELF_DEPLOYING = f"""{DEPLOYING}
from agentscope_serverless.app import AgentApp

app = AgentApp()

if __name__ == '__main__':
    deploy(app)
"""


@pytest.mark.parametrize(
    ("folder", "script", "text", "root", "agent"),
    [
        # README's way: python agent.py in the project folder.
        ("bot", "agent.py", SELF_DEPLOYING, "bot", "agent:app"),
        # The same script run from the folder above: it used to archive that whole folder.
        (".", "bot/agent.py", SELF_DEPLOYING, "bot", "agent:app"),
        # A deploy script beside the agent, run from above.
        (
            ".",
            "bot/deploy.py",
            f"{DEPLOYING}\nfrom agent import app\n\ndeploy(app)\n",
            "bot",
            "agent:app",
        ),
        # A deploy script in a folder of its own, importing the project's package.
        (
            ".",
            "scripts/deploy.py",
            "import sys\nsys.path.insert(0, '.')\n"
            f"{DEPLOYING}\nfrom mypkg.agent import app\n\ndeploy(app)\n",
            ".",
            "mypkg.agent:app",
        ),
    ],
)
def test_a_script_deploying_an_app_packages_the_folder_it_imports_the_app_from(
    tmp_path: Path, folder: str, script: str, text: str, root: str, agent: str
) -> None:
    """python bot/agent.py, run from the folder above, packaged that folder: the user's other
    projects and credentials beside bot/."""
    (tmp_path / "bot").mkdir()
    (tmp_path / "bot" / "agent.py").write_text(SELF_DEPLOYING)
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "agent.py").write_text(SELF_DEPLOYING)
    (tmp_path / script).parent.mkdir(exist_ok=True)
    (tmp_path / script).write_text(text)
    result = subprocess.run(
        [sys.executable, script],
        cwd=tmp_path / folder,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    project = (tmp_path / root).resolve()
    assert result.stdout.split() == [str(project), str(project / "dist"), agent]


def without_alibaba_cloud_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith(("ALIBABA_CLOUD_", "OSS_", "AGENT_RUN_"))]:
        monkeypatch.delenv(name)


def test_agentscope_agentrun_calls_build_the_archive(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Code ported from AgentScope Runtime (its config classes, its constructor's arguments)
    failed: the names did not exist and the constructor took other arguments."""
    from agentscope_serverless.engine.deployers.agentrun_deployer import (
        AgentRunConfig,
        AgentRunDeployManager,
        LogConfig,
        NetworkConfig,
        OSSConfig,
    )

    without_alibaba_cloud_credentials(monkeypatch)
    records = object()
    agentrun_config = AgentRunConfig(
        region_id="cn-shanghai",
        log_config=LogConfig(logstore="agent-logs", project="my-project"),
        network_config=NetworkConfig(network_mode="VPC", vpc_id="vpc-1", vswitch_ids=["vsw-1"]),
        cpu=1.0,
        memory=1024,
        session_concurrency_limit=20,
        session_idle_timeout_seconds=900,
    )
    manager = AgentRunDeployManager(
        oss_config=OSSConfig(region="cn-shanghai", bucket_name="my-bucket"),
        agentrun_config=agentrun_config,
        build_root=tmp_path / "builds",
        state_manager=records,
        python_version=HOST_PYTHON,
    )
    assert manager.agentrun_config is agentrun_config and manager.state_manager is records
    demo = importlib.import_module("agentscope_serverless.agents.demo").app
    # As AgentScope's example passes them: app.deploy(deployer, **deployment_config).
    info = asyncio.run(
        demo.deploy(
            manager,
            endpoint_path="/process",
            stream=True,
            telemetry_enabled=True,
            project_dir=PROJECT_ROOT,
            deploy_name="my-agent",
            # AgentScope's example: DASHSCOPE_API_KEY=os.environ.get(...), None when unset.
            environment={"DASHSCOPE_API_KEY": None, "WORKERS": 2, "AUTH_KEYS_BACKEND": "file"},
            skip_upload=True,
        )
    )
    archive = Path(info["artifact_path"])
    assert archive == tmp_path / "builds" / "my-agent-agentrun.zip" and archive.is_file()
    assert info["deploy_name"] == "my-agent" and info["uploaded"] is False
    # The runtime's resources and session limits were always 2 CPUs, 2048 MB, 200 and 3600 s.
    with zipfile.ZipFile(archive) as zf:
        manifest = json.loads(zf.read("agentrun.json"))
    assert manifest["resources"] == {"cpu": 1.0, "memory": 1024}
    assert manifest["session_concurrency_limit"] == 20
    assert manifest["session_idle_timeout_seconds"] == 900
    assert manifest["environment"] == {"WORKERS": "2", "AUTH_KEYS_BACKEND": "file"}


def test_agentscope_configs_read_agentscopes_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    without_alibaba_cloud_credentials(monkeypatch)
    monkeypatch.setenv("AGENT_RUN_REGION_ID", "cn-beijing")
    monkeypatch.setenv("AGENT_RUN_VSWITCH_IDS", '["vsw-1", "vsw-2"]')
    monkeypatch.setenv("AGENT_RUN_MEMORY", "4096")
    monkeypatch.setenv("OSS_BUCKET_NAME", "my-bucket")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "LTAI-key-id")
    manager = AgentRunDeployManager("dist")
    config = manager.agentrun_config
    assert (config.region_id, config.endpoint) == ("cn-beijing", "agentrun.cn-beijing.aliyuncs.com")
    assert config.network_config is not None
    assert config.network_config.vswitch_ids == ["vsw-1", "vsw-2"] and config.memory == 4096
    assert config.session_idle_timeout_seconds == 3600  # the runtime's default
    assert manager.oss_config.bucket_name == "my-bucket"
    assert manager.oss_config.access_key_id == "LTAI-key-id"
    with pytest.raises(ConfigurationError, match="ALIBABA_CLOUD_ACCESS_KEY_SECRET"):
        config.ensure_valid()
    monkeypatch.setenv("AGENT_RUN_VSWITCH_IDS", "vsw-1,vsw-2")
    with pytest.raises(ConfigurationError, match="AGENT_RUN_VSWITCH_IDS must be a JSON list"):
        AgentRunDeployManager("dist")


ACCESS_KEY = {"access_key_id": "LTAI-key-id", "access_key_secret": "the-secret-value"}


def agentscope_manager_with_an_access_key(platform: str, build_root: Path) -> Any:
    """AgentScope's manager of ``platform``, given the access key in its configs alone."""
    if platform == "agentrun":
        from agentscope_serverless.deployers import agentrun_deployer as agentrun

        return agentrun.AgentRunDeployManager(
            oss_config=agentrun.OSSConfig(bucket_name="my-bucket", **ACCESS_KEY),
            agentrun_config=agentrun.AgentRunConfig(**ACCESS_KEY),
            build_root=build_root,
        )
    from agentscope_serverless.deployers import modelstudio_deployer as modelstudio

    return modelstudio.ModelstudioDeployManager(
        oss_config=modelstudio.OSSConfig(**ACCESS_KEY),
        modelstudio_config=modelstudio.ModelstudioConfig(
            workspace_id="my-workspace", dashscope_api_key="sk-dashscope-key", **ACCESS_KEY
        ),
        build_root=build_root,
    )


@pytest.mark.parametrize("platform", ["agentrun", "modelstudio"])
def test_an_access_key_given_in_agentscope_configs_is_never_shown_and_asks_for_an_upload(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    platform: str,
) -> None:
    """A ModelStudio config showed its access key and DashScope key in its repr, and its
    access key did not stop the build, which then reported nothing uploaded."""
    without_alibaba_cloud_credentials(monkeypatch)
    manager = agentscope_manager_with_an_access_key(platform, tmp_path)
    configs = [manager.oss_config, getattr(manager, f"{platform}_config")]
    shown = " ".join(f"{config!r} {config}" for config in configs)
    assert "region='cn-hangzhou'" in shown
    for secret in ("LTAI-key-id", "the-secret-value", "sk-dashscope-key"):
        assert secret not in shown
    with pytest.raises(UploadNotAvailableError) as refused:
        asyncio.run(manager.deploy(app="agentscope_serverless.agents.demo:app"))
    assert "the-secret-value" not in str(refused.value) + caplog.text
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"extra_packages": ["x.py"], "cmd": "python x.py"}, "extra_packages, cmd"),
        ({"external_whl_path": "agent.whl"}, "external_whl_path"),
        ({"agentrun_id": "ar-1"}, "agentrun_id"),
    ],
)
def test_agentscope_image_inputs_are_refused_naming_them(
    tmp_path: Path, given: dict[str, Any], named: str
) -> None:
    manager = AgentRunDeployManager(build_root=tmp_path)
    with pytest.raises(TypeError, match=named):
        asyncio.run(manager.deploy(app="agentscope_serverless.agents.demo:app", **given))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("platform", ["agentrun", "modelstudio"])
@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"endpoint_path": "/chat"}, "carries its own endpoint_path"),
        ({"stream": False}, "carries its own stream"),
        ({"custom_endpoints": [{"path": "/ping", "func": print}]}, "@app.endpoint"),
    ],
)
def test_what_the_archived_app_would_not_serve_is_refused(
    tmp_path: Path, platform: str, given: dict[str, Any], message: str
) -> None:
    """The archive serves the AgentApp as its module defines it: an endpoint path, stream
    or custom endpoint given to deploy() was dropped without a word."""
    from agentscope_serverless.deployers import ModelstudioDeployManager

    demo = importlib.import_module("agentscope_serverless.agents.demo").app
    managers = {"agentrun": AgentRunDeployManager, "modelstudio": ModelstudioDeployManager}
    manager = managers[platform](build_root=tmp_path)
    with pytest.raises(TypeError, match=message):
        asyncio.run(manager.deploy(app=demo, skip_upload=True, **given))
    assert not list(tmp_path.iterdir())


def test_a_runner_is_refused_saying_to_deploy_its_app(tmp_path: Path) -> None:
    from agentscope_serverless.deployers import ModelstudioDeployManager
    from agentscope_serverless.runner import Runner

    deploys = [
        AgentRunDeployManager(build_root=tmp_path).deploy(Runner()),
        ModelstudioDeployManager(build_root=tmp_path).deploy(runner=Runner()),
        # AgentScope's runner.deploy(manager) said the app (which it made) was in no module.
        Runner().deploy(AgentRunDeployManager(build_root=tmp_path)),
    ]
    for deploy in deploys:
        with pytest.raises(TypeError, match=r"deploy the AgentApp serving it"):
            asyncio.run(deploy)
    assert not list(tmp_path.iterdir())


def test_a_path_first_is_the_build_root_and_may_not_be_given_twice(tmp_path: Path) -> None:
    assert AgentRunDeployManager(tmp_path).build_root == tmp_path.resolve()
    assert AgentRunDeployManager(str(tmp_path)).build_root == tmp_path.resolve()
    with pytest.raises(TypeError, match="two build roots"):
        AgentRunDeployManager(tmp_path, build_root=tmp_path)


@pytest.mark.parametrize("platform", ["agentrun", "modelstudio"])
def test_a_project_dir_without_its_app_is_refused_rather_than_served_the_demo_agent(
    tmp_path: Path, platform: str
) -> None:
    """AgentScope's deploy(project_dir=...) named no app: the archive served the demo agent."""
    from agentscope_serverless.deployers import ModelstudioDeployManager

    managers = {"agentrun": AgentRunDeployManager, "modelstudio": ModelstudioDeployManager}
    manager = managers[platform](build_root=tmp_path / "builds")
    with pytest.raises(ConfigurationError, match=r"name the AgentApp .*app='module:attribute'"):
        asyncio.run(manager.deploy(project_dir=PROJECT_ROOT, skip_upload=True))
    assert not (tmp_path / "builds").exists()


@pytest.mark.parametrize("platform", ["agentrun", "modelstudio"])
def test_a_project_of_ones_own_deployed_without_its_app_is_refused_naming_it(
    tmp_path: Path, platform: str
) -> None:
    """manager.deploy() named no app: the project's archive served the demo agent."""
    from agentscope_serverless.deployers import ModelstudioDeployManager

    (tmp_path / "agent.py").write_text(
        "from agentscope_serverless import AgentApp\napp=AgentApp()\n"
    )
    managers = {"agentrun": AgentRunDeployManager, "modelstudio": ModelstudioDeployManager}
    manager = managers[platform](build_root=tmp_path / "builds")
    manager.use_project(tmp_path)
    with pytest.raises(ConfigurationError, match=r"demo agent.*app='module:attribute'.*agent:app"):
        asyncio.run(manager.deploy(skip_upload=True))
    assert not (tmp_path / "builds").exists()


def test_an_apps_archive_is_named_after_it_unless_named() -> None:
    from agentscope_serverless.app import AgentApp
    from agentscope_serverless.deployers.archive import default_archive_name

    assert default_archive_name(AgentApp(app_name="Weather Bot"), PROJECT_ROOT) == "Weather-Bot"
    assert default_archive_name(AgentApp(), Path("/home/me/bot")) == "bot"
    assert default_archive_name("agent:app", Path("/home/me/bot")) == "bot"
    assert default_archive_name(None, Path("/home/me/bot")) == "agentscope-serverless"  # demo
    assert default_archive_name("agent:app", PROJECT_ROOT) == "agentscope-serverless"


AGENT_DEPLOYING_ITSELF = """import asyncio

from agentscope_serverless.engine import AgentApp
from agentscope_serverless.engine.deployers.agentrun_deployer import (
    AgentRunConfig,
    AgentRunDeployManager,
    OSSConfig,
)
from agentscope_serverless.engine.deployers.modelstudio_deployer import ModelstudioDeployManager

app = AgentApp(app_name="Friday")


@app.query(framework="text")
async def query_func(self, msgs, request=None, **kwargs):
    yield "hello"


if __name__ == "__main__":
    deployer = AgentRunDeployManager(oss_config=OSSConfig(), agentrun_config=AgentRunConfig())
    asyncio.run(app.deploy(deployer, skip_upload=True))
"""


def test_an_agent_module_importing_its_deployer_is_archived(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """AgentScope's scripts import the deployer beside the app, deploying in __main__: the
    archive, which holds no packaging code, could not import the module, as the deployer
    modules imported it."""
    without_alibaba_cloud_credentials(monkeypatch)
    project = tmp_path / "project"
    project.mkdir()
    (project / "agent.py").write_text(AGENT_DEPLOYING_ITSELF)
    manager = AgentRunDeployManager(
        tmp_path / "builds", project_root=project, python_version=HOST_PYTHON
    )
    info = asyncio.run(manager.deploy("agent:app", skip_upload=True))
    assert Path(info["artifact_path"]).is_file()


@pytest.mark.parametrize(
    ("variable", "value"),
    [("AGENT_RUN_CPU", "nan"), ("AGENT_RUN_MEMORY", "0"), ("AGENT_RUN_CPU", "two")],
)
def test_agentrun_resources_must_be_positive_numbers(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """AGENT_RUN_CPU=nan wrote "cpu": NaN into agentrun.json, which is not JSON."""
    from agentscope_serverless.deployers.agentrun_deployer import AgentRunConfig

    without_alibaba_cloud_credentials(monkeypatch)
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError, match=f"^{variable} must be a positive number$"):
        AgentRunConfig.from_env()
    with pytest.raises(ValueError, match="greater than 0"):
        AgentRunConfig(memory=0)


@pytest.mark.parametrize("module", ["agentrun_deployer", "modelstudio_deployer"])
def test_oss_configs_read_agentscopes_oss_key_before_the_alibaba_cloud_one(
    monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    """AgentScope's OSSConfig.from_env() reads OSS_ACCESS_KEY_ID/_SECRET first; the
    ModelStudio one here read the Alibaba Cloud key alone, and refused a valid OSS key."""
    oss_config = importlib.import_module(f"agentscope_serverless.deployers.{module}").OSSConfig
    without_alibaba_cloud_credentials(monkeypatch)
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "LTAI-cloud")
    monkeypatch.setenv("OSS_ACCESS_KEY_ID", "LTAI-oss")
    monkeypatch.setenv("OSS_ACCESS_KEY_SECRET", "oss-secret")
    monkeypatch.setenv("OSS_BUCKET_NAME", "my-bucket")
    config = oss_config.from_env()
    assert (config.access_key_id, config.access_key_secret) == ("LTAI-oss", "oss-secret")
    config.ensure_valid()


@pytest.mark.parametrize(
    "deployer",
    [
        "agentscope_serverless.deployers.SAMDeployManager",
        "agentscope_serverless.deployers.AgentRunDeployManager",
        "agentscope_serverless.deployers.ModelstudioDeployManager",
    ],
)
def test_every_deployer_imports_where_the_runtime_is_deployed_without_the_tools(
    tmp_path: Path, deployer: str
) -> None:
    """An agent module importing its deployer beside the app (AgentScope's scripts deploy
    themselves under ``if __name__ == "__main__"``) runs where the runtime was deployed: a
    Lambda layer or an archive, which hold no packaging code. The SAM deployer imported it."""
    from agentscope_serverless.packaging.project import LAMBDA_EXCLUDED, copy_runtime

    copy_runtime(tmp_path, excluded=LAMBDA_EXCLUDED)
    module, name = deployer.rsplit(".", 1)
    imported = subprocess.run(
        [sys.executable, "-c", f"from {module} import {name}; print({name}.__name__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        timeout=60,
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == name


@pytest.mark.timeout(300)
@pytest.mark.parametrize("platform", ["agentrun", "modelstudio"])
def test_requirements_given_to_an_archive_deployer_are_installed_in_the_archive(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, platform: str
) -> None:
    """AgentScope's deploy(requirements=[...]) was refused: the project had to list them in a
    requirements.txt of its own."""
    without_alibaba_cloud_credentials(monkeypatch)
    project = tmp_path / "project"
    write_wheel(project / "vendor", "agentscope_private_sdk", "1.0", "ANSWER = 42\n")
    (project / "agent.py").write_text(
        "import agentscope_private_sdk\nimport humanize\n\n"
        "from agentscope_serverless.agents.demo import app\n"
    )
    managers = {"agentrun": AgentRunDeployManager, "modelstudio": ModelStudioDeployManager}
    manager = managers[platform](tmp_path / "out", project_root=project, python_version=HOST_PYTHON)
    requirements = ["humanize==4.12.3", "--find-links ./vendor", "agentscope_private_sdk==1.0"]
    info = asyncio.run(manager.deploy("agent:app", requirements=requirements, skip_upload=True))
    with zipfile.ZipFile(info["artifact_path"]) as archive:
        names = archive.namelist()
        if platform == "agentrun":
            assert "agentscope_private_sdk.py" in names and "humanize/__init__.py" in names
            assert "requirements.txt" not in names
        else:
            assert "wheels/agentscope_private_sdk-1.0-py3-none-any.whl" in names
            setup = archive.read("requirements.txt").decode().splitlines()
            assert "humanize==4.12.3" in setup and "agentscope-private-sdk==1.0" in setup


@pytest.mark.parametrize(
    ("requirements", "said"),
    [
        (["openai", "--target=/srv/elsewhere"], "requirements[1] is the option --target"),
        (["--index-url=https://user:s3cret@pypi.example/simple extra"], "requirements[0]"),
        (["openai\n--index-url https://pypi.example/simple"], "requirements[0] spans lines"),
        (["openai \\", "--no-deps"], "requirements[0] ends with a backslash"),
        (["openai --no-deps"], "requirements[0] carries an option"),
        (["./libs/mylib"], "requirements[0] is not a requirement"),
        ([""], "requirements[0] is empty"),
        ([3], "requirements[0] is a int, not text"),
        ("openai", "a list of requirement strings"),
    ],
)
def test_requirements_that_are_not_requirements_are_refused_before_anything_is_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, requirements: Any, said: str
) -> None:
    without_alibaba_cloud_credentials(monkeypatch)
    manager = AgentRunDeployManager(build_root=tmp_path / "out", python_version=HOST_PYTHON)
    with pytest.raises(PackagingError) as refused:
        asyncio.run(
            manager.deploy(
                app="agentscope_serverless.agents.demo:app",
                requirements=requirements,
                skip_upload=True,
            )
        )
    assert said in str(refused.value) and "s3cret" not in str(refused.value)
    assert not (tmp_path / "out").exists()
