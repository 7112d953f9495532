"""Runs: each run's status and events, stored so it can be resumed and cancelled.

Backends are imported on first use: ``redis`` and ``dynamodb`` need their clients.
"""

from __future__ import annotations

from typing import Any

from agentscope_serverless.services.runs.base import FINISHED, RunRecord, RunsService
from agentscope_serverless.services.runs.in_memory import InMemoryRunsService

_LAZY = {
    "RedisRunsService": "agentscope_serverless.services.runs.redis",
    "DynamoDBRunsService": "agentscope_serverless.services.runs.dynamodb",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


__all__ = [
    "FINISHED",
    "DynamoDBRunsService",
    "InMemoryRunsService",
    "RunRecord",
    "RunsService",
]
