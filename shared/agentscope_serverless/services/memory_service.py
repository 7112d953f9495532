"""The seeds' API-reference import path: ``services.memory_service``."""

from agentscope_serverless.services.memory import InMemoryMemoryService, MemoryService

__all__ = ["InMemoryMemoryService", "MemoryService"]
