"""``ModelStudioDeployManager``: a ModelStudio-style archive (wheels and ``deploy_starter/``).

>>> manager = ModelStudioDeployManager(build_root="dist", project_root=".")
>>> # info = await manager.deploy("agentscope_serverless.agents.demo:app")
>>> # info["artifact_path"], info["size_bytes"]

See :mod:`agentscope_serverless.deployers.archive` for what happens with and without
Alibaba Cloud credentials, and
:func:`~agentscope_serverless.packaging.build_modelstudio_archive` for the archive's layout.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from agentscope_serverless.deployers.adapter.protocol_adapter import (
    ProtocolAdapter,
    refuse_protocol_adapters,
)
from agentscope_serverless.deployers.archive import (
    ArchiveDeployManager,
    archived_app_options,
    oss_access_key_from_env,
    refuse_image_inputs,
)
from agentscope_serverless.deployers.base import DeployManager, Deployment
from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.not_offered import missing_name

if TYPE_CHECKING:
    from agentscope_serverless.packaging.archives import ArchiveReport, Progress

MODELSTUDIO_PORT = 8080


class ModelStudioDeployManager(ArchiveDeployManager):
    """Builds ``<build_root>/<deploy_name>-modelstudio.zip`` with ``deploy_starter/config.yml``."""

    platform_name = "ModelStudio"

    def _build(
        self,
        app: str,
        *,
        environment: dict[str, str] | None,
        name: str,
        port: int | None,
        progress: Progress | None,
        requirements: Sequence[str],
    ) -> ArchiveReport:
        from agentscope_serverless.packaging.archives import build_modelstudio_archive

        return build_modelstudio_archive(
            self.project_root,
            self.build_root,
            agent=app,
            port=port or MODELSTUDIO_PORT,
            **self._options(environment, name, progress, requirements),
        )


class OSSConfig(BaseModel):
    """Alibaba Cloud OSS, where AgentScope uploads the archive (kept; upload is not built in).

    The access key never appears in ``repr`` or ``str``:

    >>> OSSConfig(access_key_id="id", access_key_secret="secret")
    OSSConfig(region='cn-hangzhou', bucket_prefix='tmpbucket-agentscope-runtime')
    """

    region: str = "cn-hangzhou"
    access_key_id: str | None = Field(default=None, repr=False)
    access_key_secret: str | None = Field(default=None, repr=False)
    bucket_prefix: str = "tmpbucket-agentscope-runtime"

    @classmethod
    def from_env(cls) -> OSSConfig:
        """From ``OSS_REGION`` and ``OSS_ACCESS_KEY_ID``/``_SECRET`` (default:
        ``ALIBABA_CLOUD_ACCESS_KEY_ID``/``_SECRET``)."""
        return cls(region=os.environ.get("OSS_REGION", "cn-hangzhou"), **oss_access_key_from_env())

    def ensure_valid(self) -> None:
        """Raise when the access key is incomplete."""
        if not (self.access_key_id and self.access_key_secret):
            raise ConfigurationError("OSSConfig needs access_key_id and access_key_secret")


class ModelstudioConfig(BaseModel):
    """The ModelStudio workspace AgentScope deploys to (kept; upload is not built in).

    The access key and the DashScope key never appear in ``repr`` or ``str``:

    >>> ModelstudioConfig(workspace_id="ws", access_key_secret="secret", dashscope_api_key="sk")
    ModelstudioConfig(endpoint='bailian.cn-beijing.aliyuncs.com', workspace_id='ws')
    """

    endpoint: str = "bailian.cn-beijing.aliyuncs.com"
    workspace_id: str | None = None
    access_key_id: str | None = Field(default=None, repr=False)
    access_key_secret: str | None = Field(default=None, repr=False)
    dashscope_api_key: str | None = Field(default=None, repr=False)

    @classmethod
    def from_env(cls) -> ModelstudioConfig:
        """From ``MODELSTUDIO_*``, ``ALIBABA_CLOUD_ACCESS_KEY_*`` and ``DASHSCOPE_API_KEY``."""
        return cls(
            endpoint=os.environ.get("MODELSTUDIO_ENDPOINT", "bailian.cn-beijing.aliyuncs.com"),
            workspace_id=os.environ.get("MODELSTUDIO_WORKSPACE_ID"),
            access_key_id=os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID"),
            access_key_secret=os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET"),
            dashscope_api_key=os.environ.get("DASHSCOPE_API_KEY"),
        )

    def ensure_valid(self) -> None:
        """Raise when the workspace or the access key is missing."""
        if not (self.workspace_id and self.access_key_id and self.access_key_secret):
            raise ConfigurationError(
                "ModelstudioConfig needs workspace_id, access_key_id and access_key_secret"
            )


def default_deploy_name() -> str:
    """A deployment name from the time: ``deploy-<epoch seconds>``."""
    return f"deploy-{int(time.time())}"


def generate_build_directory(platform: str = "unknown", workspace: Path | None = None) -> Path:
    """A new directory ``.agentscope_serverless_builds/<platform>-<ns>`` in ``workspace``."""
    root = (workspace or Path.cwd()) / ".agentscope_serverless_builds"
    path = root / f"{platform}-{time.time_ns()}"
    path.mkdir(parents=True)
    return path


class ModelstudioDeployManager(ModelStudioDeployManager):
    """AgentScope's ModelStudio deployer: builds the archive of ``project_dir`` serving ``app``.

    >>> manager = ModelstudioDeployManager(build_root="dist")
    >>> # info = await manager.deploy(app=app, project_dir=".", skip_upload=True)
    """

    def __init__(
        self,
        oss_config: OSSConfig | None = None,
        modelstudio_config: ModelstudioConfig | None = None,
        build_root: str | Path | None = None,
        state_manager: Any = None,
    ) -> None:
        super().__init__(build_root)
        self.state_manager = state_manager
        self.oss_config = oss_config or OSSConfig.from_env()
        self.modelstudio_config = modelstudio_config or ModelstudioConfig.from_env()

    async def deploy(
        self,
        app: Any = None,
        runner: Any = None,
        endpoint_path: str = "/process",
        protocol_adapters: list[ProtocolAdapter] | None = None,
        requirements: Sequence[str] | None = None,
        extra_packages: list[str] | None = None,
        environment: dict[str, str] | None = None,
        project_dir: str | Path | None = None,
        cmd: str | None = None,
        deploy_name: str | None = None,
        skip_upload: bool = False,
        telemetry_enabled: bool = True,
        external_whl_path: str | None = None,
        agent_id: str | None = None,
        agent_desc: str | None = None,
        custom_endpoints: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Build the archive; the project's own requirements come from ``project_dir``, and
        ``requirements`` (a list of requirement strings, as AgentScope takes them) are
        bundled with them, each checked first (see
        :func:`~agentscope_serverless.packaging.project.given_requirements`).

        ``extra_packages``, ``cmd``, ``external_whl_path`` and ``runner`` (AgentScope's
        image-building inputs) are refused: the archive serves an AgentApp of the project
        with its pinned dependencies; so are ``custom_endpoints`` and an ``endpoint_path`` or
        ``stream`` the AgentApp does not have (see
        :func:`~agentscope_serverless.deployers.archive.archived_app_options`).
        """
        refuse_protocol_adapters(protocol_adapters)
        refuse_image_inputs(
            runner=runner,
            extra_packages=extra_packages,
            cmd=cmd,
            external_whl_path=external_whl_path,
        )
        kwargs = archived_app_options(app, endpoint_path, custom_endpoints, project_dir, kwargs)
        if project_dir is not None:
            await asyncio.to_thread(self.use_project, project_dir)
        return await super().deploy(
            app,
            environment=environment,
            deploy_name=deploy_name or default_deploy_name(),
            skip_upload=skip_upload,
            requirements=() if requirements is None else requirements,
            **kwargs,
        )

    def _configs(self) -> tuple[Any, ...]:
        return (self.oss_config, self.modelstudio_config)

    def get_status(self) -> str:
        """``built`` once an archive was built, else ``not_deployed``."""
        return "built" if self.report is not None else "not_deployed"


def __getattr__(name: str) -> Any:
    if name == "LocalDeployManager":
        from agentscope_serverless.deployers.local_deployer import LocalDeployManager

        return LocalDeployManager
    raise missing_name(__name__, name)


__all__ = [
    "DeployManager",
    "Deployment",
    "LocalDeployManager",  # noqa: F822 - imported on first use (it imports uvicorn)
    "ModelStudioDeployManager",
    "ModelstudioConfig",
    "ModelstudioDeployManager",
    "OSSConfig",
    "ProtocolAdapter",
    "default_deploy_name",
    "generate_build_directory",
]
