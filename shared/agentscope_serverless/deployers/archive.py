"""``ArchiveDeployManager``: the shared part of the AgentRun and ModelStudio deployers.

Both build an archive of the project on this machine (no Docker). Uploading it needs the
Alibaba Cloud platform, which this build cannot reach: without credentials the deployers
return the archive's path and size; with credentials (``ALIBABA_CLOUD_ACCESS_KEY_ID`` and
``ALIBABA_CLOUD_ACCESS_KEY_SECRET``, or an access key in an AgentScope config given to the
deployer: ``OSSConfig``, ``AgentRunConfig``, ``ModelstudioConfig``) they raise
:class:`~agentscope_serverless.errors.UploadNotAvailableError` before building, rather than
pretend to deploy. ``skip_upload=True`` builds only, whatever the credentials.
"""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentscope_serverless.deployers.base import (
    DeployManager,
    default_project_root,
    import_path_of,
)
from agentscope_serverless.errors import ConfigurationError, UploadNotAvailableError

if TYPE_CHECKING:
    # Imported when building only: an archive holds no packaging code, and an agent's module
    # may import its deployer (AgentScope's scripts deploy themselves in ``__main__``).
    from agentscope_serverless.packaging.archives import ArchiveReport, Progress

CREDENTIAL_VARIABLES = ("ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET")


def has_alibaba_cloud_credentials() -> bool:
    """Whether both Alibaba Cloud access key variables are set."""
    return all(os.environ.get(name) for name in CREDENTIAL_VARIABLES)


def oss_access_key_from_env() -> dict[str, str | None]:
    """AgentScope's OSS access key: ``OSS_ACCESS_KEY_ID``/``_SECRET``, else the Alibaba Cloud
    one, as ``access_key_id`` and ``access_key_secret``."""
    return {
        "access_key_id": os.environ.get(
            "OSS_ACCESS_KEY_ID", os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID")
        ),
        "access_key_secret": os.environ.get(
            "OSS_ACCESS_KEY_SECRET", os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET")
        ),
    }


def has_access_key(config: Any) -> bool:
    """Whether ``config`` (an AgentScope platform config) carries a whole access key."""
    key = (getattr(config, "access_key_id", None), getattr(config, "access_key_secret", None))
    return all(key)


def refuse_image_inputs(**inputs: Any) -> None:
    """Raise :class:`TypeError` naming those of AgentScope's image-building inputs given.

    >>> refuse_image_inputs(runner=None, extra_packages=None, cmd=None)
    >>> refuse_image_inputs(runner=None, extra_packages=["tools.py"], cmd=None)
    Traceback (most recent call last):
    ...
    TypeError: not supported here: extra_packages (the archive serves an AgentApp of the project, \
app='module:attribute' or the AgentApp object, with the project's requirements.txt)
    """
    if inputs.pop("runner", None) is not None:
        raise TypeError(
            "a runner alone cannot be served from an archive: deploy the AgentApp serving "
            "it, defined at the top level of a module of the project "
            "(app = AgentApp(runner=runner))"
        )
    given = [name for name, value in inputs.items() if value]
    if given:
        raise TypeError(
            f"not supported here: {', '.join(given)} (the archive serves an AgentApp of the "
            "project, app='module:attribute' or the AgentApp object, with the project's "
            "requirements.txt)"
        )


def archived_app_options(
    app: Any,
    endpoint_path: str,
    custom_endpoints: list[dict[str, Any]] | None,
    project_dir: str | Path | None,
    kwargs: dict[str, Any],
) -> dict[str, Any]:
    """``kwargs`` without AgentScope's serving options, which the archived app has already:
    ``telemetry_enabled`` (nothing is reported here) and a ``stream`` or ``endpoint_path``
    the AgentApp ``app`` has. Raises :class:`TypeError` for one it does not have, and for
    ``custom_endpoints`` (the archive imports the app as its module defines it);
    :class:`~agentscope_serverless.errors.ConfigurationError` for a ``project_dir`` without
    its ``app`` (AgentScope started it with ``cmd``).

    >>> archived_app_options("demo:app", "/process", None, None, {"stream": True, "port": 80})
    {'port': 80}
    """
    if app is None and project_dir is not None:
        raise ConfigurationError(
            f"deploy(project_dir={str(project_dir)!r}) serves an AgentApp of the project: name "
            "the AgentApp to serve, app='module:attribute' (or the AgentApp object)"
        )
    rest = {k: v for k, v in kwargs.items() if k not in ("stream", "telemetry_enabled")}
    wanted = {"endpoint_path": endpoint_path, "stream": kwargs.get("stream")}
    differ = [
        name
        for name, value in wanted.items()
        if value is not None and hasattr(app, name) and getattr(app, name) != value
    ]
    if differ:
        raise TypeError(
            f"the AgentApp carries its own {' and '.join(differ)} (the archive serves it as "
            "its module defines it): set them on the AgentApp"
        )
    if custom_endpoints:
        raise TypeError(
            "custom_endpoints are not supported here (the archive serves the AgentApp as its "
            "module defines it): define them with @app.endpoint(path) in the module"
        )
    return rest


def refuse_missing_app(
    project_root: Path, build_root: Path, *, give: str, built: str = "archive"
) -> None:
    """Raise :class:`~agentscope_serverless.errors.ConfigurationError` for a project of its own
    (not this package's folder, nor an empty one) when no app is named: the ``built`` thing
    (the archive, the stack) would serve the demo agent. ``give`` says how to name one
    (``--agent module:attribute``); the AgentApps the project's modules assign are named as
    examples.
    """
    from agentscope_serverless.packaging.project import agents_of, holds_code

    if not holds_code(project_root, leave_out=(build_root,)):
        return
    found = agents_of(project_root, leave_out=(build_root,))
    example = (
        f"its modules assign {', '.join(found[:3])}"
        if found
        else "mypkg.agent:app for app = AgentApp(...) in mypkg/agent.py"
    )
    raise ConfigurationError(
        f"{project_root} holds a project of its own, and no AgentApp of it is named (the "
        f"{built} would serve the demo agent): name the one to serve, {give} ({example})"
    )


def default_archive_name(app: Any, project_root: Path) -> str:
    """The name of an archive none was given for: ``app_name`` of the AgentApp ``app``, else
    the project folder's name (``agentscope-serverless`` for the demo agent and this package's
    folder), as an archive's name may be.

    >>> default_archive_name("weather.agent:app", Path("/home/me/Weather Bot"))
    'Weather-Bot'
    """
    from agentscope_serverless.packaging.project import is_this_repository

    name = "" if app is None or isinstance(app, str) else str(getattr(app, "app_name", ""))
    if not name and app is not None and not is_this_repository(project_root):
        name = project_root.name
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).lstrip("._-")[:128]
    return name or "agentscope-serverless"


class ArchiveDeployManager(DeployManager):
    """Builds a platform archive of ``project_root`` into ``build_root`` (default: its
    ``dist/``), for ``python_version`` and ``platform`` (default: CPython 3.12,
    ``manylinux2014_x86_64``). Without ``project_root``, the project is the app's
    (:func:`~agentscope_serverless.deployers.base.default_project_root`: the working
    directory, or the folder of the script run, ``python bot/agent.py``).
    """

    platform_name: str

    def __init__(
        self,
        build_root: str | Path | None = None,
        *,
        project_root: str | Path | None = None,
        python_version: str | None = None,
        platform: str | None = None,
    ) -> None:
        super().__init__()
        self._root_given = project_root is not None
        self._build_root_given = build_root is not None
        self.project_root = Path(project_root or ".").resolve()
        self.build_root = (
            Path(build_root).resolve() if build_root is not None else self.project_root / "dist"
        )
        self.python_version = python_version
        self.platform = platform
        self.report: ArchiveReport | None = None

    async def deploy(
        self,
        app: Any = None,
        *,
        environment: dict[str, str] | None = None,
        deploy_name: str | None = None,
        port: int | None = None,
        skip_upload: bool = False,
        progress: Progress | None = None,
        requirements: Sequence[str] = (),
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Build the archive serving ``app`` (an import path ``module:attribute``, or the
        AgentApp of a module of the project, as ``app.deploy(manager)`` gives it; none: the
        demo agent, for a project with no code of its own), with ``requirements`` installed
        beside the project's ``requirements.txt`` (see
        :func:`~agentscope_serverless.packaging.project.given_requirements`), named
        ``deploy_name`` (default: :func:`default_archive_name`).

        Returns ``deploy_id``, ``deploy_name``, ``message``, ``url`` (None: nothing runs
        yet), ``artifact_path``, ``size_bytes``, ``unpacked_bytes``, ``files``,
        ``limit_bytes``, ``left_out`` (the project's secrets left out of the archive:
        ``.env``, ``.aws/``...) and ``uploaded`` (False). Raises
        :class:`~agentscope_serverless.errors.PackagingError` when the build fails or the
        archive is above the platform's limit, and
        :class:`~agentscope_serverless.errors.UploadNotAvailableError`, before building, when
        credentials (in the environment, or in a config given to the manager) ask for an
        upload; :class:`~agentscope_serverless.errors.ConfigurationError` when no app is
        named for a project of its own (:func:`refuse_missing_app`).
        """
        if kwargs:
            raise TypeError(f"unexpected arguments: {', '.join(sorted(kwargs))}")
        return await asyncio.to_thread(
            self.deploy_sync,
            app,
            environment=environment,
            deploy_name=deploy_name,
            port=port,
            skip_upload=skip_upload,
            progress=progress,
            requirements=requirements,
        )

    def deploy_sync(
        self,
        app: Any = None,
        *,
        environment: dict[str, str] | None = None,
        deploy_name: str | None = None,
        port: int | None = None,
        skip_upload: bool = False,
        progress: Progress | None = None,
        requirements: Sequence[str] = (),
    ) -> dict[str, Any]:
        """:meth:`deploy` in the calling thread: the CLI builds in its main thread, where a
        signal's exception (SIGTERM, Ctrl-C) unwinds the build, which then removes its
        folder."""
        if not skip_upload and self._has_credentials():
            raise UploadNotAvailableError(self.platform_name)
        from agentscope_serverless.packaging.archives import DEFAULT_AGENT

        if not self._root_given:
            self.use_project(default_project_root(DEFAULT_AGENT if app is None else app))
        if app is None:
            refuse_missing_app(
                self.project_root,
                self.build_root,
                give="app='module:attribute' (or the AgentApp object)",
            )
        if deploy_name is None:
            deploy_name = default_archive_name(app, self.project_root)
        report = self._build(
            import_path_of(DEFAULT_AGENT if app is None else app, self.project_root),
            environment=environment,
            name=deploy_name,
            port=port,
            progress=progress,
            requirements=requirements,
        )
        self.report = report
        self.deploy_id = str(uuid.uuid4())
        return {
            "deploy_id": self.deploy_id,
            "deploy_name": deploy_name,
            "message": f"{self.platform_name} archive built (not uploaded)",
            "url": None,
            "platform": self.platform_name,
            "artifact_path": str(report.path),
            "size_bytes": report.size_bytes,
            "unpacked_bytes": report.unpacked_bytes,
            "files": report.files,
            "limit_bytes": report.limit_bytes,
            "left_out": list(report.left_out),
            "uploaded": False,
        }

    def use_project(self, project_root: str | Path) -> None:
        """Package ``project_root`` (AgentScope's ``project_dir``), into its ``dist/`` unless
        a build root was given."""
        self._root_given = True
        self.project_root = Path(project_root).resolve()
        if not self._build_root_given:
            self.build_root = self.project_root / "dist"

    def _has_credentials(self) -> bool:
        """Whether an upload is asked for: an access key in the environment or in a config."""
        return has_alibaba_cloud_credentials() or any(map(has_access_key, self._configs()))

    def _configs(self) -> tuple[Any, ...]:
        """The AgentScope configs given to the manager (none here)."""
        return ()

    @abstractmethod
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
        """Build the platform's archive."""

    def _options(
        self,
        environment: dict[str, str] | None,
        name: str,
        progress: Progress | None,
        requirements: Sequence[str],
    ) -> dict[str, Any]:
        options: dict[str, Any] = {
            "requirements": requirements,
            "name": name,
            "python_version": self.python_version,
            "platform": self.platform,
            "environment": environment,
            "progress": progress,
        }
        return {key: value for key, value in options.items() if value is not None}

    async def stop(self, deploy_id: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Nothing runs locally: a no-op."""
        return {"success": True, "deploy_id": deploy_id or self.deploy_id}

    @property
    def is_running(self) -> bool:
        return False


__all__ = [
    "CREDENTIAL_VARIABLES",
    "ArchiveDeployManager",
    "archived_app_options",
    "default_archive_name",
    "has_access_key",
    "has_alibaba_cloud_credentials",
    "oss_access_key_from_env",
    "refuse_image_inputs",
    "refuse_missing_app",
]
