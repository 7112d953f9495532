"""AgentScope's module path of the session history interface and its in-memory backend."""

from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services.base import ServiceWithLifecycleManager
from agentscope_serverless.services.session_history.base import SessionHistoryService
from agentscope_serverless.services.session_history.in_memory import (
    InMemorySessionHistoryService,
)

__all__ = [
    "InMemorySessionHistoryService",
    "Message",
    "ServiceWithLifecycleManager",
    "Session",
    "SessionHistoryService",
]
