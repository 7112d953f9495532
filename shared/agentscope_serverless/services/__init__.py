"""Services an agent needs: session history, long-term memory, agent state, sandboxes.

Each concern is a package with an abstract ``base`` and its backends; build services from
settings with :mod:`agentscope_serverless.services.factory`.
"""

from agentscope_serverless.services.base import (
    Service,
    ServiceLifecycleManagerMixin,
    ServiceWithLifecycleManager,
)
from agentscope_serverless.services.manager import ServiceManager

__all__ = [
    "Service",
    "ServiceLifecycleManagerMixin",
    "ServiceManager",
    "ServiceWithLifecycleManager",
]
