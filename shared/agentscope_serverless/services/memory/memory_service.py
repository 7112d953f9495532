"""AgentScope's module path of the memory interface and its in-memory backend."""

from agentscope_serverless.schemas.agent_schemas import Message, MessageType
from agentscope_serverless.services.base import ServiceWithLifecycleManager
from agentscope_serverless.services.memory.base import MemoryService
from agentscope_serverless.services.memory.in_memory import InMemoryMemoryService

__all__ = [
    "InMemoryMemoryService",
    "MemoryService",
    "Message",
    "MessageType",
    "ServiceWithLifecycleManager",
]
