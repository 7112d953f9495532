"""AgentScope's module path of the state interface and its in-memory backend."""

from agentscope_serverless.services.agent_state.base import StateService
from agentscope_serverless.services.agent_state.in_memory import InMemoryStateService
from agentscope_serverless.services.base import ServiceWithLifecycleManager

__all__ = ["InMemoryStateService", "ServiceWithLifecycleManager", "StateService"]
