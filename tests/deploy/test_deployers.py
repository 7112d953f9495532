"""The deployers: SAM builds and deploys only with AWS credentials; the archive deployers
build and report, and refuse to pretend to upload."""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
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
    assert sam_deployer.sam is sam
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
