"""``AgentRunDeployManager``: an AgentRun-style archive of the project (flat site-packages).

>>> manager = AgentRunDeployManager(build_root="dist", project_root=".")
>>> # info = await manager.deploy("agentscope_serverless.agents.demo:app")
>>> # info["artifact_path"], info["size_bytes"]

See :mod:`agentscope_serverless.deployers.archive` for what happens with and without
Alibaba Cloud credentials, and :func:`~agentscope_serverless.packaging.build_agentrun_archive`
for the archive's layout.
"""

from __future__ import annotations

from agentscope_serverless.deployers.archive import ArchiveDeployManager
from agentscope_serverless.packaging.archives import (
    AGENTRUN_MAX_ZIP_BYTES,
    ArchiveReport,
    Progress,
    build_agentrun_archive,
)

AGENTRUN_PORT = 8090


class AgentRunDeployManager(ArchiveDeployManager):
    """Builds ``<build_root>/<deploy_name>-agentrun.zip`` with its ``agentrun.json``."""

    platform_name = "AgentRun"
    max_zip_bytes = AGENTRUN_MAX_ZIP_BYTES

    def _build(
        self,
        app: str,
        *,
        environment: dict[str, str] | None,
        name: str,
        port: int | None,
        progress: Progress | None,
    ) -> ArchiveReport:
        return build_agentrun_archive(
            self.project_root,
            self.build_root,
            agent=app,
            port=port or AGENTRUN_PORT,
            max_zip_bytes=self.max_zip_bytes,
            **self._options(environment, name, progress),
        )


__all__ = ["AgentRunDeployManager"]
