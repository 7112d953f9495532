"""``ModelStudioDeployManager``: a ModelStudio-style archive (wheels and ``deploy_starter/``).

>>> manager = ModelStudioDeployManager(build_root="dist", project_root=".")
>>> # info = await manager.deploy("agentscope_serverless.agents.demo:app")
>>> # info["artifact_path"], info["size_bytes"]

See :mod:`agentscope_serverless.deployers.archive` for what happens with and without
Alibaba Cloud credentials, and
:func:`~agentscope_serverless.packaging.build_modelstudio_archive` for the archive's layout.
"""

from __future__ import annotations

from agentscope_serverless.deployers.archive import ArchiveDeployManager
from agentscope_serverless.packaging.archives import (
    MODELSTUDIO_MAX_ZIP_BYTES,
    ArchiveReport,
    Progress,
    build_modelstudio_archive,
)

MODELSTUDIO_PORT = 8080


class ModelStudioDeployManager(ArchiveDeployManager):
    """Builds ``<build_root>/<deploy_name>-modelstudio.zip`` with ``deploy_starter/config.yml``."""

    platform_name = "ModelStudio"
    max_zip_bytes = MODELSTUDIO_MAX_ZIP_BYTES

    def _build(
        self,
        app: str,
        *,
        environment: dict[str, str] | None,
        name: str,
        port: int | None,
        progress: Progress | None,
    ) -> ArchiveReport:
        return build_modelstudio_archive(
            self.project_root,
            self.build_root,
            agent=app,
            port=port or MODELSTUDIO_PORT,
            max_zip_bytes=self.max_zip_bytes,
            **self._options(environment, name, progress),
        )


__all__ = ["ModelStudioDeployManager"]
