"""AgentScope's module path of the Redis state service."""

from agentscope_serverless.services.agent_state.base import StateService
from agentscope_serverless.services.agent_state.redis import RedisStateService

__all__ = ["RedisStateService", "StateService"]
