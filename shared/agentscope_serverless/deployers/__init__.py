"""Deployers: ``from agentscope_serverless.deployers import DeployManager, LocalDeployManager``.

- :class:`LocalDeployManager` serves an agent on this machine (imports uvicorn).
- :class:`SAMDeployManager` builds the SAM stack and deploys it with AWS credentials.
- :class:`AgentRunDeployManager` and :class:`ModelStudioDeployManager` build the
  platforms' archives.

Each deployer is imported when first used, so importing this package is cheap; the HTTP
application and the Lambda functions never import it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agentscope_serverless.deployers.base import DeployManager
from agentscope_serverless.not_offered import missing_name

if TYPE_CHECKING:
    from agentscope_serverless.deployers.agentrun_deployer import AgentRunDeployManager
    from agentscope_serverless.deployers.local_deployer import LocalDeployManager
    from agentscope_serverless.deployers.modelstudio_deployer import (
        ModelStudioDeployManager,
        ModelstudioDeployManager,
    )
    from agentscope_serverless.deployers.sam_deployer import SAMDeployManager

_MODULES = {
    "AgentRunDeployManager": "agentrun_deployer",
    "LocalDeployManager": "local_deployer",
    "ModelStudioDeployManager": "modelstudio_deployer",
    "ModelstudioDeployManager": "modelstudio_deployer",
    "SAMDeployManager": "sam_deployer",
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        module = importlib.import_module(f"{__name__}.{_MODULES[name]}")
        return getattr(module, name)
    raise missing_name(__name__, name)


__all__ = [
    "AgentRunDeployManager",
    "DeployManager",
    "LocalDeployManager",
    "ModelStudioDeployManager",
    "ModelstudioDeployManager",
    "SAMDeployManager",
]
