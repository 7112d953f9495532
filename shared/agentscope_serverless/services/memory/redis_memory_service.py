"""AgentScope's module path of the Redis memory service."""

from agentscope_serverless.schemas.agent_schemas import Message, MessageType
from agentscope_serverless.services.memory.base import MemoryService
from agentscope_serverless.services.memory.redis import RedisMemoryService

__all__ = ["MemoryService", "Message", "MessageType", "RedisMemoryService"]
