"""``SessionHistoryServiceFactory``: backends ``in_memory``, ``redis`` and ``dynamodb``::

service = await SessionHistoryServiceFactory.create("in_memory")
"""

from __future__ import annotations

from typing import Any, ClassVar

from agentscope_serverless.services import session_history
from agentscope_serverless.services.service_factory import LazyBackend, ServiceFactory
from agentscope_serverless.services.session_history import (
    InMemorySessionHistoryService,
    SessionHistoryService,
)


class SessionHistoryServiceFactory(ServiceFactory[SessionHistoryService]):
    """Builds session history services; environment prefix ``SESSION_HISTORY_``."""

    _env_prefix: ClassVar[str] = "SESSION_HISTORY_"


_PACKAGE = "agentscope_serverless.services.session_history"
SessionHistoryServiceFactory.register_backend("in_memory", InMemorySessionHistoryService)
SessionHistoryServiceFactory.register_backend(
    "redis", LazyBackend(f"{_PACKAGE}.redis:RedisSessionHistoryService")
)
SessionHistoryServiceFactory.register_backend(
    "dynamodb", LazyBackend(f"{_PACKAGE}.dynamodb:DynamoDBSessionHistoryService")
)


def __getattr__(name: str) -> Any:
    return getattr(session_history, name)


__all__ = [
    "InMemorySessionHistoryService",
    "RedisSessionHistoryService",  # noqa: F822 - imported on first use
    "ServiceFactory",
    "SessionHistoryService",
    "SessionHistoryServiceFactory",
]
