"""Archives built once per session through the deployers, for the host's Python version, each
serving with a file key store whose file the tests fill with the CLI of the unpacked code."""

from __future__ import annotations

import asyncio
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from agentscope_serverless.deployers import AgentRunDeployManager, ModelStudioDeployManager
from tests.conftest import PROJECT_ROOT

HOST_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture(scope="session")
def archive_key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The key file the archived services read (created by the first key)."""
    return tmp_path_factory.mktemp("keys") / "keys.json"


def file_key_store_environment(key_file: Path) -> dict[str, str]:
    return {"AUTH_KEYS_BACKEND": "file", "AUTH_KEYS_FILE": str(key_file)}


def _build(
    manager: AgentRunDeployManager | ModelStudioDeployManager, key_file: Path
) -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.delenv("ALIBABA_CLOUD_ACCESS_KEY_ID", raising=False)
        monkeypatch.delenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", raising=False)
        return asyncio.run(
            manager.deploy(
                "agentscope_serverless.agents.demo:app",
                environment=file_key_store_environment(key_file),
            )
        )


@pytest.fixture(scope="session")
def agentrun_deploy(
    tmp_path_factory: pytest.TempPathFactory, archive_key_file: Path
) -> dict[str, Any]:
    """What ``AgentRunDeployManager.deploy()`` reports without Alibaba Cloud credentials."""
    manager = AgentRunDeployManager(
        tmp_path_factory.mktemp("agentrun"), project_root=PROJECT_ROOT, python_version=HOST_PYTHON
    )
    return _build(manager, archive_key_file)


@pytest.fixture(scope="session")
def modelstudio_deploy(
    tmp_path_factory: pytest.TempPathFactory, archive_key_file: Path
) -> dict[str, Any]:
    """What ``ModelStudioDeployManager.deploy()`` reports without Alibaba Cloud credentials."""
    manager = ModelStudioDeployManager(
        tmp_path_factory.mktemp("modelstudio"),
        project_root=PROJECT_ROOT,
        python_version=HOST_PYTHON,
    )
    return _build(manager, archive_key_file)


def unpack(archive: str, tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """The archive's contents alone, in a fresh directory."""
    target = tmp_path_factory.mktemp(name)
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(target)
    return target
