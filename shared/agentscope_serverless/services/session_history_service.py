"""The seeds' API-reference import path: ``services.session_history_service``."""

from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services.session_history import (
    InMemorySessionHistoryService,
    SessionHistoryService,
)

__all__ = ["InMemorySessionHistoryService", "Session", "SessionHistoryService"]
