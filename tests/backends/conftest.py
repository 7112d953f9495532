"""Fixtures for the tests of individual backends against real servers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aioboto3
import pytest
from redis.asyncio import Redis
from types_aiobotocore_dynamodb import DynamoDBClient

from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS, DynamoDBServer, RedisServer


@pytest.fixture
def own_redis_server() -> Iterator[RedisServer]:
    """A Redis of the test's own, for tests that stop and restart it."""
    with RedisServer() as server:
        yield server


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[Redis]:
    """A plain client on the shared Redis, to look at keys directly."""
    client = Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
def own_dynamodb_server() -> Iterator[DynamoDBServer]:
    """A moto server of the test's own, for tests that stop and restart it."""
    with DynamoDBServer() as server:
        yield server


@pytest.fixture
async def dynamodb_client(dynamodb_server: DynamoDBServer) -> AsyncIterator[DynamoDBClient]:
    """A plain aioboto3 client on the shared moto server, to look at items directly."""
    session = aioboto3.Session(region_name=dynamodb_server.region, **LOCAL_AWS_CREDENTIALS)
    async with session.client("dynamodb", endpoint_url=dynamodb_server.endpoint_url) as client:
        yield client
