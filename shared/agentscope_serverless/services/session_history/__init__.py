"""Session history: the interface and its backends.

The Redis and DynamoDB backends are imported on first use, so importing this package
never imports a store client.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentscope_serverless.not_offered import missing_name
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services.session_history.base import SessionHistoryService
from agentscope_serverless.services.session_history.in_memory import (
    InMemorySessionHistoryService,
)

_LAZY = {
    "SessionHistoryServiceFactory": (
        "agentscope_serverless.services.session_history.session_history_service_factory"
    ),
    "RedisSessionHistoryService": "agentscope_serverless.services.session_history.redis",
    "DynamoDBSessionHistoryService": "agentscope_serverless.services.session_history.dynamodb",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise missing_name(__name__, name)


__all__ = [
    "DynamoDBSessionHistoryService",
    "InMemorySessionHistoryService",
    "RedisSessionHistoryService",
    "Session",
    "SessionHistoryService",
    "SessionHistoryServiceFactory",
]
