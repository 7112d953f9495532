"""Settings of the HTTP app on each backend, for tests that run on all of them."""

from __future__ import annotations

from typing import Any

import pytest

from agentscope_serverless.local_stack import DynamoDBServer, RedisServer

BACKENDS = ("in_memory", "redis", "dynamodb")


def backend_settings(name: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    """Settings putting history, memory and state on ``name`` (memory on Redis for
    ``dynamodb``, which has no memory backend), with the session's servers."""
    if name == "in_memory":
        return {}
    redis: RedisServer = request.getfixturevalue("redis_server")
    if name == "redis":
        return {
            "session_history_backend": "redis",
            "memory_backend": "redis",
            "state_backend": "redis",
            "redis_url": redis.url,
        }
    dynamodb: DynamoDBServer = request.getfixturevalue("dynamodb_server")
    return {
        "session_history_backend": "dynamodb",
        "state_backend": "dynamodb",
        "memory_backend": "redis",
        "redis_url": redis.url,
        "dynamodb_endpoint_url": dynamodb.endpoint_url,
        "aws_region": dynamodb.region,
    }
