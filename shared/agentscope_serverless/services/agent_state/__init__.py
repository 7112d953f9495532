"""Agent state: the interface and its backends.

The Redis and DynamoDB backends are imported on first use, so importing this package
never imports a store client.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentscope_serverless.services.agent_state.base import StateService
from agentscope_serverless.services.agent_state.in_memory import InMemoryStateService

_LAZY = {
    "StateServiceFactory": "agentscope_serverless.services.agent_state.state_service_factory",
    "RedisStateService": "agentscope_serverless.services.agent_state.redis",
    "DynamoDBStateService": "agentscope_serverless.services.agent_state.dynamodb",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DynamoDBStateService",
    "InMemoryStateService",
    "RedisStateService",
    "StateService",
    "StateServiceFactory",
]
