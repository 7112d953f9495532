"""``StateServiceFactory``: backends ``in_memory``, ``redis`` and ``dynamodb``::

service = await StateServiceFactory.create("dynamodb", table_name="agentscope-state")
"""

from __future__ import annotations

from typing import Any, ClassVar

from agentscope_serverless.services import agent_state
from agentscope_serverless.services.agent_state.base import StateService
from agentscope_serverless.services.agent_state.in_memory import InMemoryStateService
from agentscope_serverless.services.service_factory import LazyBackend, ServiceFactory


class StateServiceFactory(ServiceFactory[StateService]):
    """Builds agent state services; environment prefix ``STATE_``."""

    _env_prefix: ClassVar[str] = "STATE_"


_PACKAGE = "agentscope_serverless.services.agent_state"
StateServiceFactory.register_backend("in_memory", InMemoryStateService)
StateServiceFactory.register_backend("redis", LazyBackend(f"{_PACKAGE}.redis:RedisStateService"))
StateServiceFactory.register_backend(
    "dynamodb", LazyBackend(f"{_PACKAGE}.dynamodb:DynamoDBStateService")
)


def __getattr__(name: str) -> Any:
    return getattr(agent_state, name)


__all__ = [
    "InMemoryStateService",
    "RedisStateService",  # noqa: F822 - imported on first use
    "ServiceFactory",
    "StateService",
    "StateServiceFactory",
]
