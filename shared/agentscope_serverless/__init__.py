"""AgentScope Runtime as serverless functions: agents as HTTPS APIs on managed stores.

The package keeps its import light (Lambda cold starts are dominated by imports): the
submodules are imported where they are used, for example::

    from agentscope_serverless.services.session_history import InMemorySessionHistoryService
    from agentscope_serverless.schemas.agent_schemas import Message, TextContent

AgentScope Runtime's top-level names (``AgentApp``, ``Runner``, the deployers) are here too,
imported when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agentscope_serverless.not_offered import missing_name

if TYPE_CHECKING:
    from agentscope_serverless.app.agent_app import AgentApp
    from agentscope_serverless.deployers import (
        AgentRunDeployManager,
        DeployManager,
        LocalDeployManager,
        ModelstudioDeployManager,
    )
    from agentscope_serverless.runner import Runner

__version__ = "0.1.0"

# AgentScope Runtime's top-level names (``from agentscope_runtime.engine import AgentApp``),
# imported on first use so ``import agentscope_serverless`` stays cheap.
_LAZY = {
    "AgentApp": "agentscope_serverless.app.agent_app",
    "Runner": "agentscope_serverless.runner",
    "DeployManager": "agentscope_serverless.deployers",
    "LocalDeployManager": "agentscope_serverless.deployers",
    "AgentRunDeployManager": "agentscope_serverless.deployers",
    "ModelstudioDeployManager": "agentscope_serverless.deployers",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise missing_name(__name__, name)


__all__ = [
    "AgentApp",
    "AgentRunDeployManager",
    "DeployManager",
    "LocalDeployManager",
    "ModelstudioDeployManager",
    "Runner",
    "__version__",
]
