"""Build deployable archives without Docker: AgentRun-style and ModelStudio-style.

>>> from agentscope_serverless.packaging import build_agentrun_archive  # doctest: +SKIP
>>> report = build_agentrun_archive(Path("."), Path("dist"))            # doctest: +SKIP
>>> print(report.path, report.size_bytes)                              # doctest: +SKIP
"""

from agentscope_serverless.packaging.archives import (
    AGENTRUN_MAX_ZIP_BYTES,
    MODELSTUDIO_MAX_ZIP_BYTES,
    AgentRunResources,
    ArchiveReport,
    build_agentrun_archive,
    build_modelstudio_archive,
)

__all__ = [
    "AGENTRUN_MAX_ZIP_BYTES",
    "MODELSTUDIO_MAX_ZIP_BYTES",
    "AgentRunResources",
    "ArchiveReport",
    "build_agentrun_archive",
    "build_modelstudio_archive",
]
