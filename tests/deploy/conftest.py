"""Archives built once per session through the deployers, for the host's Python version, each
serving with a file key store whose file the tests fill with the CLI of the unpacked code."""

from __future__ import annotations

import asyncio
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentscope_serverless.deployers import AgentRunDeployManager, ModelStudioDeployManager
from agentscope_serverless.packaging import sam
from tests.conftest import PROJECT_ROOT, once_per_run

HOST_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
OUTPUTS = {
    "ProcessUrl": "https://p.lambda-url.us-east-1.on.aws/",
    "SessionsUrl": "https://s.lambda-url.us-east-1.on.aws/",
    "MemoryUrl": "https://m.lambda-url.us-east-1.on.aws/",
    "StateUrl": "https://t.lambda-url.us-east-1.on.aws/",
    "SandboxUrl": "https://x.lambda-url.us-east-1.on.aws/",
    "ApiKeysTableName": "stack-ApiKeysTable-1",
}


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
    tmp_path_factory: pytest.TempPathFactory, worker_id: str, archive_key_file: Path
) -> dict[str, Any]:
    """What ``AgentRunDeployManager.deploy()`` reports without Alibaba Cloud credentials
    (built once per test run)."""

    def deploy() -> dict[str, Any]:
        manager = AgentRunDeployManager(
            tmp_path_factory.mktemp("agentrun"),
            project_root=PROJECT_ROOT,
            python_version=HOST_PYTHON,
        )
        return _build(manager, archive_key_file)

    return once_per_run(tmp_path_factory, worker_id, "agentrun-deploy", deploy)


@pytest.fixture(scope="session")
def modelstudio_deploy(
    tmp_path_factory: pytest.TempPathFactory, worker_id: str, archive_key_file: Path
) -> dict[str, Any]:
    """What ``ModelStudioDeployManager.deploy()`` reports without Alibaba Cloud credentials
    (built once per test run)."""

    def deploy() -> dict[str, Any]:
        manager = ModelStudioDeployManager(
            tmp_path_factory.mktemp("modelstudio"),
            project_root=PROJECT_ROOT,
            python_version=HOST_PYTHON,
        )
        return _build(manager, archive_key_file)

    return once_per_run(tmp_path_factory, worker_id, "modelstudio-deploy", deploy)


def unpack(archive: str, tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """The archive's contents alone, in a fresh directory."""
    target = tmp_path_factory.mktemp(name)
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(target)
    return target


class FakeSam:
    """Stands in for the SAM CLI steps, recording what the manager asked for."""

    def __init__(self, build_dir: Path) -> None:
        self.build_dir = build_dir
        self.credentials = True
        self.calls: list[tuple[str, Any]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(sam, "validate", lambda root: self.calls.append(("validate", root)))
        monkeypatch.setattr(sam, "build", self.build)
        monkeypatch.setattr(sam, "has_credentials", lambda: self.credentials)
        monkeypatch.setattr(sam, "deploy", self.deploy)
        monkeypatch.setattr(sam, "delete", self.delete)

    def build(self, root: Path, *, build_dir: Path | None = None, agent: str | None = None) -> Path:
        self.calls.append(("build", build_dir))
        self.agent = agent
        return self.build_dir

    def deploy(self, root: Path, stack: str, **options: Any) -> dict[str, str]:
        self.calls.append(("deploy", (stack, options)))
        return dict(OUTPUTS)

    def delete(self, root: Path, stack: str, *, region: str | None = None) -> None:
        self.calls.append(("delete", stack))


@pytest.fixture
def fake_sam(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeSam]:
    """The SAM steps faked, with AWS credentials present: a deploy "succeeds" with OUTPUTS."""
    fake = FakeSam(tmp_path)
    fake.install(monkeypatch)
    yield fake
