"""AgentScope's module path of the Redis session history service."""

from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services.session_history.base import SessionHistoryService
from agentscope_serverless.services.session_history.redis import RedisSessionHistoryService

__all__ = ["Message", "RedisSessionHistoryService", "Session", "SessionHistoryService"]
