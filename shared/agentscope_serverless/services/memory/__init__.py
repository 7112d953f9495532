"""Long-term memory: the interface and its backends.

The Redis backend is imported on first use, so importing this package never imports a
store client.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentscope_serverless.not_offered import missing_name
from agentscope_serverless.services.memory.base import MemoryService
from agentscope_serverless.services.memory.in_memory import InMemoryMemoryService

_LAZY = {
    "MemoryServiceFactory": "agentscope_serverless.services.memory.memory_service_factory",
    "RedisMemoryService": "agentscope_serverless.services.memory.redis",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise missing_name(__name__, name)


__all__ = [
    "InMemoryMemoryService",
    "MemoryService",
    "MemoryServiceFactory",
    "RedisMemoryService",
]
