"""The backends every contract test runs against.

Each service kind has a list of backend names; a backend joins the suite by adding its
name to the list and defining a fixture ``<kind>_<backend>_factory`` that returns a
callable building a fresh, **not started** service on a shared store (so a second object
sees what the first stored). A session history factory takes the options every backend
takes (``max_messages_per_session``) as keywords.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import aioboto3
import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from agentscope_serverless.local_stack import (
    LOCAL_AWS_CREDENTIALS,
    DynamoDBServer,
    RedisClusterServer,
    RedisServer,
)
from agentscope_serverless.services._dynamodb import id_hash, now
from agentscope_serverless.services._redis import glob_escape, user_key_prefix
from agentscope_serverless.services.agent_state import InMemoryStateService, StateService
from agentscope_serverless.services.agent_state.dynamodb import DynamoDBStateService
from agentscope_serverless.services.agent_state.redis import RedisStateService
from agentscope_serverless.services.memory import InMemoryMemoryService, MemoryService
from agentscope_serverless.services.memory.redis import RedisMemoryService
from agentscope_serverless.services.runs import InMemoryRunsService, RunsService
from agentscope_serverless.services.runs.dynamodb import DynamoDBRunsService
from agentscope_serverless.services.runs.redis import RedisRunsService
from agentscope_serverless.services.session_history import (
    InMemorySessionHistoryService,
    SessionHistoryService,
)
from agentscope_serverless.services.session_history.dynamodb import (
    DynamoDBSessionHistoryService,
)
from agentscope_serverless.services.session_history.redis import RedisSessionHistoryService

SESSION_HISTORY_BACKENDS = ["in_memory", "redis", "redis_cluster", "dynamodb"]
MEMORY_BACKENDS = ["in_memory", "redis", "redis_cluster"]
STATE_BACKENDS = ["in_memory", "redis", "redis_cluster", "dynamodb"]
RUNS_BACKENDS = ["in_memory", "redis", "redis_cluster", "dynamodb"]

SessionHistoryFactory = Callable[..., SessionHistoryService]
# What a runs store still holds of a user (see ``runs_leftovers``).
RunsLeftovers = Callable[[str], Awaitable[list[str]]]
# Lets seconds pass for what a runs store holds of a user (see ``runs_aging``).
RunsAging = Callable[[RunsService, str, int], Awaitable[None]]
# How long every runs store of the suite keeps a run after its last write.
RUNS_TTL_SECONDS = 3600


def _shared(instance: object) -> Callable[[], object]:
    # In-memory data lives in the object, so "another object on the same store" is the same one.
    return lambda: instance


@pytest.fixture
def session_history_in_memory_factory() -> SessionHistoryFactory:
    shared = InMemorySessionHistoryService()

    def factory(**options: int | None) -> SessionHistoryService:
        # Options make a service of its own: in memory, the store is the object.
        return InMemorySessionHistoryService(**options) if options else shared

    return factory


@pytest.fixture
def memory_in_memory_factory() -> Callable[[], MemoryService]:
    return _shared(InMemoryMemoryService())  # type: ignore[return-value]


@pytest.fixture
def state_in_memory_factory() -> Callable[[], StateService]:
    return _shared(InMemoryStateService())  # type: ignore[return-value]


@pytest.fixture
def session_history_redis_factory(redis_server: RedisServer) -> SessionHistoryFactory:
    return lambda **options: RedisSessionHistoryService(redis_url=redis_server.url, **options)


@pytest.fixture
def session_history_redis_cluster_factory(
    redis_cluster_server: RedisClusterServer,
) -> SessionHistoryFactory:
    return lambda **options: RedisSessionHistoryService(
        redis_url=redis_cluster_server.url, cluster=True, **options
    )


@pytest.fixture
def memory_redis_factory(redis_server: RedisServer) -> Callable[[], MemoryService]:
    return lambda: RedisMemoryService(redis_url=redis_server.url)


@pytest.fixture
def memory_redis_cluster_factory(
    redis_cluster_server: RedisClusterServer,
) -> Callable[[], MemoryService]:
    return lambda: RedisMemoryService(redis_url=redis_cluster_server.url, cluster=True)


@pytest.fixture
def state_redis_factory(redis_server: RedisServer) -> Callable[[], StateService]:
    return lambda: RedisStateService(redis_url=redis_server.url)


@pytest.fixture
def state_redis_cluster_factory(
    redis_cluster_server: RedisClusterServer,
) -> Callable[[], StateService]:
    return lambda: RedisStateService(redis_url=redis_cluster_server.url, cluster=True)


@pytest.fixture
def session_history_dynamodb_factory(dynamodb_server: DynamoDBServer) -> SessionHistoryFactory:
    return lambda **options: DynamoDBSessionHistoryService(
        dynamodb_server.sessions_table,
        endpoint_url=dynamodb_server.endpoint_url,
        region_name=dynamodb_server.region,
        **LOCAL_AWS_CREDENTIALS,
        **options,
    )


@pytest.fixture
def state_dynamodb_factory(dynamodb_server: DynamoDBServer) -> Callable[[], StateService]:
    return lambda: DynamoDBStateService(
        dynamodb_server.state_table,
        endpoint_url=dynamodb_server.endpoint_url,
        region_name=dynamodb_server.region,
        **LOCAL_AWS_CREDENTIALS,
    )


@pytest.fixture
def runs_in_memory_factory() -> Callable[[], RunsService]:
    return _shared(InMemoryRunsService(ttl_seconds=RUNS_TTL_SECONDS))  # type: ignore[return-value]


@pytest.fixture
def runs_redis_factory(redis_server: RedisServer) -> Callable[[], RunsService]:
    return lambda: RedisRunsService(redis_url=redis_server.url, ttl_seconds=RUNS_TTL_SECONDS)


@pytest.fixture
def runs_redis_cluster_factory(
    redis_cluster_server: RedisClusterServer,
) -> Callable[[], RunsService]:
    return lambda: RedisRunsService(
        redis_url=redis_cluster_server.url, cluster=True, ttl_seconds=RUNS_TTL_SECONDS
    )


@pytest.fixture
def runs_dynamodb_factory(dynamodb_server: DynamoDBServer) -> Callable[[], RunsService]:
    return lambda: DynamoDBRunsService(
        dynamodb_server.runs_table,
        endpoint_url=dynamodb_server.endpoint_url,
        region_name=dynamodb_server.region,
        ttl_seconds=RUNS_TTL_SECONDS,
        **LOCAL_AWS_CREDENTIALS,
    )


@pytest.fixture(params=RUNS_BACKENDS)
def runs_factory(request: pytest.FixtureRequest) -> Callable[[], RunsService]:
    factory: Callable[[], RunsService] = request.getfixturevalue(f"runs_{request.param}_factory")
    return factory


@pytest.fixture
def runs_leftovers(
    request: pytest.FixtureRequest, runs_factory: Callable[[], RunsService]
) -> RunsLeftovers:
    """What the store of ``runs_factory`` still holds of a user, whether readable or not:
    every DynamoDB item (runs, events, index entries) or Redis key of the user, or the
    runs the in-memory store keeps of them."""
    backend = request.node.callspec.params["runs_factory"]
    if backend == "dynamodb":
        server: DynamoDBServer = request.getfixturevalue("dynamodb_server")

        async def dynamodb_items(user_id: str) -> list[str]:
            session = aioboto3.Session(region_name=server.region, **LOCAL_AWS_CREDENTIALS)
            user = id_hash(user_id)
            found: list[str] = []
            async with session.client("dynamodb", endpoint_url=server.endpoint_url) as client:
                paginator = client.get_paginator("scan")
                async for page in paginator.paginate(TableName=server.runs_table):
                    found += [
                        f"{item['pk']['S']} {item['sk']['S']}"
                        for item in page["Items"]
                        if user in item["pk"]["S"]
                    ]
            return found

        return dynamodb_items
    if backend in ("redis", "redis_cluster"):
        cluster = backend == "redis_cluster"
        url = request.getfixturevalue(f"{backend}_server").url

        async def redis_keys(user_id: str) -> list[str]:
            client = RedisCluster.from_url(url) if cluster else Redis.from_url(url)
            prefix = glob_escape(user_key_prefix("agentscope", "run", user_id))
            try:
                return sorted([key.decode() async for key in client.scan_iter(match=f"{prefix}*")])
            finally:
                await client.aclose()

        return redis_keys
    service = runs_factory()
    assert isinstance(service, InMemoryRunsService)

    async def runs_in_memory(user_id: str) -> list[str]:
        return list(service._runs.get(user_id, {}))

    return runs_in_memory


@pytest.fixture
def runs_aging(
    request: pytest.FixtureRequest, runs_factory: Callable[[], RunsService]
) -> RunsAging:
    """Lets ``seconds`` pass for what the store of ``runs_factory`` holds of a user: each
    expiry of theirs comes that much closer, and what has expired then is gone, as the
    store's expiry removes it (DynamoDB's TTL deletes an expired item, in its own time)."""
    backend = request.node.callspec.params["runs_factory"]
    if backend == "dynamodb":
        server: DynamoDBServer = request.getfixturevalue("dynamodb_server")

        async def age_items(service: RunsService, user_id: str, seconds: int) -> None:
            session = aioboto3.Session(region_name=server.region, **LOCAL_AWS_CREDENTIALS)
            user, table = id_hash(user_id), server.runs_table
            async with session.client("dynamodb", endpoint_url=server.endpoint_url) as client:
                paginator = client.get_paginator("scan")
                async for page in paginator.paginate(TableName=table):
                    for item in page["Items"]:
                        if user not in item["pk"]["S"] or "expires_at" not in item:
                            continue
                        key = {"pk": item["pk"], "sk": item["sk"]}
                        expiry = int(item["expires_at"]["N"]) - seconds
                        if expiry < now():
                            await client.delete_item(TableName=table, Key=key)
                            continue
                        # Times ahead (an expiry, how far a run's events are stamped) come
                        # closer alike.
                        times = {
                            name: {"N": str(int(item[name]["N"]) - seconds)}
                            for name in ("expires_at", "stamped_until")
                            if name in item
                        }
                        await client.put_item(TableName=table, Item=item | times)

        return age_items
    if backend in ("redis", "redis_cluster"):
        cluster = backend == "redis_cluster"
        url = request.getfixturevalue(f"{backend}_server").url

        async def age_keys(service: RunsService, user_id: str, seconds: int) -> None:
            client = RedisCluster.from_url(url) if cluster else Redis.from_url(url)
            prefix = glob_escape(user_key_prefix("agentscope", "run", user_id))
            try:
                async for key in client.scan_iter(match=f"{prefix}*"):
                    left = await client.pttl(key)
                    if left > seconds * 1000:
                        await client.pexpire(key, left - seconds * 1000)
                    elif left >= 0:
                        await client.delete(key)
            finally:
                await client.aclose()

        return age_keys

    async def age_runs(service: RunsService, user_id: str, seconds: int) -> None:
        assert isinstance(service, InMemoryRunsService)
        for run in service._runs.get(user_id, {}).values():
            run.touched -= seconds

    return age_runs


@pytest.fixture(params=SESSION_HISTORY_BACKENDS)
def session_history_factory(request: pytest.FixtureRequest) -> SessionHistoryFactory:
    factory: SessionHistoryFactory = request.getfixturevalue(
        f"session_history_{request.param}_factory"
    )
    return factory


@pytest.fixture(params=MEMORY_BACKENDS)
def memory_factory(request: pytest.FixtureRequest) -> Callable[[], MemoryService]:
    factory: Callable[[], MemoryService] = request.getfixturevalue(
        f"memory_{request.param}_factory"
    )
    return factory


@pytest.fixture(params=STATE_BACKENDS)
def state_factory(request: pytest.FixtureRequest) -> Callable[[], StateService]:
    factory: Callable[[], StateService] = request.getfixturevalue(f"state_{request.param}_factory")
    return factory


@pytest.fixture
async def history(
    session_history_factory: SessionHistoryFactory,
) -> AsyncIterator[SessionHistoryService]:
    async with session_history_factory() as service:
        yield service


@pytest.fixture
async def memory(memory_factory: Callable[[], MemoryService]) -> AsyncIterator[MemoryService]:
    async with memory_factory() as service:
        yield service


@pytest.fixture
async def state(state_factory: Callable[[], StateService]) -> AsyncIterator[StateService]:
    async with state_factory() as service:
        yield service
