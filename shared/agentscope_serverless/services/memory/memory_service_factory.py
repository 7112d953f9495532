"""``MemoryServiceFactory``: backends ``in_memory`` and ``redis``::

service = await MemoryServiceFactory.create("redis", redis_url="redis://...")
"""

from __future__ import annotations

from typing import Any, ClassVar

from agentscope_serverless.services import memory
from agentscope_serverless.services.memory.base import MemoryService
from agentscope_serverless.services.memory.in_memory import InMemoryMemoryService
from agentscope_serverless.services.service_factory import LazyBackend, ServiceFactory


class MemoryServiceFactory(ServiceFactory[MemoryService]):
    """Builds long-term memory services; environment prefix ``MEMORY_``."""

    _env_prefix: ClassVar[str] = "MEMORY_"


MemoryServiceFactory.register_backend("in_memory", InMemoryMemoryService)
MemoryServiceFactory.register_backend(
    "redis", LazyBackend("agentscope_serverless.services.memory.redis:RedisMemoryService")
)


def __getattr__(name: str) -> Any:
    return getattr(memory, name)


__all__ = [
    "InMemoryMemoryService",
    "MemoryService",
    "MemoryServiceFactory",
    "RedisMemoryService",  # noqa: F822 - imported on first use
    "ServiceFactory",
]
