"""The seeds' import path: ``services.agent_state.state_service``."""

from agentscope_serverless.services.agent_state.base import StateService
from agentscope_serverless.services.agent_state.in_memory import InMemoryStateService

__all__ = ["InMemoryStateService", "StateService"]
