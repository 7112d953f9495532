"""``AgentRunDeployManager``: an AgentRun-style archive of the project (flat site-packages).

>>> manager = AgentRunDeployManager(build_root="dist", project_root=".")
>>> # info = await manager.deploy("agentscope_serverless.agents.demo:app")
>>> # info["artifact_path"], info["size_bytes"]

AgentScope Runtime's calls work unchanged: ``AgentRunDeployManager(oss_config=...,
agentrun_config=..., build_root=..., state_manager=...)`` with :class:`OSSConfig` and
:class:`AgentRunConfig`, then ``deploy(app=..., deploy_name=..., skip_upload=True)``.

See :mod:`agentscope_serverless.deployers.archive` for what happens with and without
Alibaba Cloud credentials, and :func:`~agentscope_serverless.packaging.build_agentrun_archive`
for the archive's layout.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

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
from agentscope_serverless.errors import ConfigurationError

if TYPE_CHECKING:
    from agentscope_serverless.packaging.archives import (
        AgentRunResources,
        ArchiveReport,
        Progress,
    )

AGENTRUN_PORT = 8090


@dataclass
class EndpointConfig:
    """An AgentRun runtime endpoint (AgentScope's; kept, the upload is not built in)."""

    agent_runtime_endpoint_name: str | None = None
    description: str | None = None
    tags: list[str] | None = None
    target_version: str | None = "LATEST"


@dataclass
class CodeConfig:
    """The code of an AgentRun runtime (AgentScope's; kept, the upload is not built in)."""

    command: list[str] | None = None
    oss_bucket_name: str | None = None
    oss_object_name: str | None = None


@dataclass
class LogConfig:
    """The Log Service project and logstore of an AgentRun runtime."""

    logstore: str | None = None
    project: str | None = None


@dataclass
class NetworkConfig:
    """The network of an AgentRun runtime (``PUBLIC``, or a VPC)."""

    network_mode: str = "PUBLIC"
    security_group_id: str | None = None
    vpc_id: str | None = None
    vswitch_ids: list[str] | None = None


N = TypeVar("N", int, float)


def _env_number(name: str, kind: type[N], default: N) -> N:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{name} must be a positive number")
    return value


class AgentRunConfig(BaseModel):
    """The AgentRun service AgentScope deploys to (kept; the upload is not built in).

    The access key never appears in ``repr`` or ``str``:

    >>> AgentRunConfig(access_key_id="id", access_key_secret="secret")
    AgentRunConfig(region_id='cn-hangzhou', endpoint=None, log_config=None, ...)
    """

    access_key_id: str | None = Field(default=None, repr=False)
    access_key_secret: str | None = Field(default=None, repr=False)
    region_id: str = "cn-hangzhou"
    endpoint: str | None = None
    log_config: LogConfig | None = None
    network_config: NetworkConfig | None = Field(default_factory=NetworkConfig)
    cpu: float = Field(default=2.0, gt=0, allow_inf_nan=False)
    memory: int = Field(default=2048, gt=0)
    execution_role_arn: str | None = None
    session_concurrency_limit: int | None = Field(default=200, gt=0)
    session_idle_timeout_seconds: int | None = Field(default=3600, gt=0)

    @classmethod
    def from_env(cls) -> AgentRunConfig:
        """From ``ALIBABA_CLOUD_ACCESS_KEY_ID``/``_SECRET`` and ``AGENT_RUN_*`` (AgentScope's
        names: ``_REGION_ID``, ``_ENDPOINT``, ``_LOG_STORE`` with ``_LOG_PROJECT``,
        ``_NETWORK_MODE``, ``_VPC_ID``, ``_SECURITY_GROUP_ID``, ``_VSWITCH_IDS`` as a JSON
        list, ``_CPU``, ``_MEMORY``, ``_EXECUTION_ROLE_ARN``,
        ``_SESSION_CONCURRENCY_LIMIT``, ``_SESSION_IDLE_TIMEOUT_SECONDS``: 3600 when unset,
        the class's default, where AgentScope's ``from_env`` said 600)."""
        region_id = os.environ.get("AGENT_RUN_REGION_ID", "cn-hangzhou")
        log_store = os.environ.get("AGENT_RUN_LOG_STORE")
        log_project = os.environ.get("AGENT_RUN_LOG_PROJECT")
        return cls(
            access_key_id=os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID"),
            access_key_secret=os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET"),
            region_id=region_id,
            endpoint=os.environ.get("AGENT_RUN_ENDPOINT", f"agentrun.{region_id}.aliyuncs.com"),
            log_config=(
                LogConfig(logstore=log_store, project=log_project)
                if log_store and log_project
                else None
            ),
            network_config=NetworkConfig(
                network_mode=os.environ.get("AGENT_RUN_NETWORK_MODE", "PUBLIC"),
                vpc_id=os.environ.get("AGENT_RUN_VPC_ID"),
                security_group_id=os.environ.get("AGENT_RUN_SECURITY_GROUP_ID"),
                vswitch_ids=_vswitch_ids_from_env(),
            ),
            cpu=_env_number("AGENT_RUN_CPU", float, 2.0),
            memory=_env_number("AGENT_RUN_MEMORY", int, 2048),
            execution_role_arn=os.environ.get("AGENT_RUN_EXECUTION_ROLE_ARN"),
            session_concurrency_limit=_env_number("AGENT_RUN_SESSION_CONCURRENCY_LIMIT", int, 200),
            session_idle_timeout_seconds=_env_number(
                "AGENT_RUN_SESSION_IDLE_TIMEOUT_SECONDS", int, 3600
            ),
        )

    def ensure_valid(self) -> None:
        """Raise when the access key is incomplete."""
        missing = [
            name
            for name, value in (
                ("ALIBABA_CLOUD_ACCESS_KEY_ID", self.access_key_id),
                ("ALIBABA_CLOUD_ACCESS_KEY_SECRET", self.access_key_secret),
            )
            if not value
        ]
        if missing:
            raise ConfigurationError(f"Missing required AgentRun env vars: {', '.join(missing)}")


def _vswitch_ids_from_env() -> list[str] | None:
    text = os.environ.get("AGENT_RUN_VSWITCH_IDS")
    if not text:
        return None
    try:
        ids = json.loads(text)
    except json.JSONDecodeError:
        ids = None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ConfigurationError('AGENT_RUN_VSWITCH_IDS must be a JSON list of ids: ["vsw-..."]')
    return ids


class OSSConfig(BaseModel):
    """The OSS bucket AgentScope uploads the archive to (kept; the upload is not built in).

    >>> OSSConfig(access_key_id="id", access_key_secret="secret", bucket_name="b")
    OSSConfig(region='cn-hangzhou', bucket_name='b')
    """

    region: str = "cn-hangzhou"
    access_key_id: str | None = Field(default=None, repr=False)
    access_key_secret: str | None = Field(default=None, repr=False)
    bucket_name: str | None = None

    @classmethod
    def from_env(cls) -> OSSConfig:
        """From ``OSS_REGION``, ``OSS_BUCKET_NAME`` and ``OSS_ACCESS_KEY_ID``/``_SECRET``
        (default: ``ALIBABA_CLOUD_ACCESS_KEY_ID``/``_SECRET``)."""
        return cls(
            region=os.environ.get("OSS_REGION", "cn-hangzhou"),
            bucket_name=os.environ.get("OSS_BUCKET_NAME"),
            **oss_access_key_from_env(),
        )

    def ensure_valid(self) -> None:
        """Raise when the access key or the bucket is missing."""
        if not (self.access_key_id and self.access_key_secret and self.bucket_name):
            raise ConfigurationError(
                "OSSConfig needs access_key_id, access_key_secret (OSS_ACCESS_KEY_ID/_SECRET "
                "or ALIBABA_CLOUD_ACCESS_KEY_ID/_SECRET) and bucket_name (OSS_BUCKET_NAME)"
            )


class AgentRunDeployManager(ArchiveDeployManager):
    """Builds ``<build_root>/<deploy_name>-agentrun.zip`` with its ``agentrun.json``.

    Takes AgentScope's arguments (``oss_config``, ``agentrun_config``: from the environment
    when not given; ``build_root``; ``state_manager``, kept as given) and this package's
    (``AgentRunDeployManager("dist", project_root=".")``: a path first is ``build_root``).

    >>> AgentRunDeployManager(oss_config=OSSConfig(bucket_name="b"), build_root="dist").oss_config
    OSSConfig(region='cn-hangzhou', bucket_name='b')
    """

    platform_name = "AgentRun"

    def __init__(
        self,
        oss_config: OSSConfig | str | Path | None = None,
        agentrun_config: AgentRunConfig | None = None,
        build_root: str | Path | None = None,
        state_manager: Any = None,
        *,
        project_root: str | Path | None = None,
        python_version: str | None = None,
        platform: str | None = None,
    ) -> None:
        if isinstance(oss_config, str | Path):
            if build_root is not None:
                raise TypeError(
                    "AgentRunDeployManager() got two build roots: a path first is build_root"
                )
            oss_config, build_root = None, oss_config
        if build_root is not None and not isinstance(build_root, str | Path):
            raise TypeError(f"build_root must be a path, not {type(build_root).__name__}")
        super().__init__(
            build_root,
            project_root=project_root,
            python_version=python_version,
            platform=platform,
        )
        self.state_manager = state_manager
        self.oss_config = oss_config or OSSConfig.from_env()
        self.agentrun_config = agentrun_config or AgentRunConfig.from_env()

    async def deploy(  # type: ignore[override]  # AgentScope's parameters, then ours
        self,
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
        external_whl_path: str | None = None,
        agentrun_id: str | None = None,
        custom_endpoints: list[dict[str, Any]] | None = None,
        app: Any = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Build the archive serving ``app`` (``module:attribute`` or the AgentApp object,
        also accepted first, where AgentScope has ``runner``; none: the demo agent, for a
        project with no code of its own) of ``project_dir`` (default: ``project_root``), as
        :meth:`ArchiveDeployManager.deploy` does (``port`` and ``progress`` too).

        ``requirements`` (a list of requirement strings, as AgentScope takes them) are
        installed in the archive with the project's ``requirements.txt``; an entry that is
        no requirement, or an option other than where packages are, is refused with a
        :class:`~agentscope_serverless.errors.PackagingError` before anything is built.
        ``runner``, ``extra_packages``, ``cmd``, ``external_whl_path`` (AgentScope's
        image-building inputs) and ``agentrun_id`` (updating a deployed runtime, an upload)
        are refused with a :class:`TypeError`, as are ``custom_endpoints`` and an
        ``endpoint_path`` or ``stream`` the AgentApp does not have (see
        :func:`~agentscope_serverless.deployers.archive.archived_app_options`).
        """
        from agentscope_serverless.runner import Runner

        if app is None and runner is not None and not isinstance(runner, Runner):
            app, runner = runner, None
        refuse_protocol_adapters(protocol_adapters)
        refuse_image_inputs(
            runner=runner,
            extra_packages=extra_packages,
            cmd=cmd,
            external_whl_path=external_whl_path,
        )
        if agentrun_id:
            raise TypeError(
                "agentrun_id (updating a deployed AgentRun runtime) needs an upload, which is "
                "not built in: build the archive (skip_upload=True) and update the runtime "
                "with AgentRun's console or CLI"
            )
        kwargs = archived_app_options(app, endpoint_path, custom_endpoints, project_dir, kwargs)
        if project_dir is not None:
            await asyncio.to_thread(self.use_project, project_dir)
        if deploy_name is not None:
            kwargs["deploy_name"] = deploy_name
        return await super().deploy(
            app,
            environment=environment,
            skip_upload=skip_upload,
            requirements=() if requirements is None else requirements,
            **kwargs,
        )

    def _configs(self) -> tuple[Any, ...]:
        return (self.oss_config, self.agentrun_config)

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
        from agentscope_serverless.packaging.archives import build_agentrun_archive

        return build_agentrun_archive(
            self.project_root,
            self.build_root,
            agent=app,
            port=port or AGENTRUN_PORT,
            resources=self._resources(),
            **self._options(environment, name, progress, requirements),
        )

    def _resources(self) -> AgentRunResources:
        """The runtime's resources of ``agentrun_config`` (a limit it leaves unset: the
        default)."""
        from agentscope_serverless.packaging.archives import AgentRunResources

        config, default = self.agentrun_config, AgentRunResources()
        return AgentRunResources(
            cpu=config.cpu,
            memory=config.memory,
            session_concurrency_limit=(
                config.session_concurrency_limit or default.session_concurrency_limit
            ),
            session_idle_timeout_seconds=(
                config.session_idle_timeout_seconds or default.session_idle_timeout_seconds
            ),
        )


__all__ = [
    "AgentRunConfig",
    "AgentRunDeployManager",
    "CodeConfig",
    "EndpointConfig",
    "LogConfig",
    "NetworkConfig",
    "OSSConfig",
]
