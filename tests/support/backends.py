"""Settings of the HTTP app, and idempotency stores, on each backend, for tests that run on all
of them."""

from __future__ import annotations

from typing import Any

import pytest

from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS, DynamoDBServer, RedisServer
from agentscope_serverless.services.idempotency import IdempotencyStore, InMemoryIdempotencyStore
from agentscope_serverless.services.idempotency.dynamodb import DynamoDBIdempotencyStore
from agentscope_serverless.services.idempotency.redis import RedisIdempotencyStore

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


def idempotency_store(
    name: str, request: pytest.FixtureRequest, **options: Any
) -> IdempotencyStore:
    """An idempotency store on ``name``, with the session's servers (not started)."""
    if name == "in_memory":
        return InMemoryIdempotencyStore(**options)
    if name == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")
        return RedisIdempotencyStore(redis_url=redis.url, **options)
    dynamodb: DynamoDBServer = request.getfixturevalue("dynamodb_server")
    return DynamoDBIdempotencyStore(
        dynamodb.sessions_table,
        endpoint_url=dynamodb.endpoint_url,
        region_name=dynamodb.region,
        **LOCAL_AWS_CREDENTIALS,
        **options,
    )
