"""AgentScope's service factories: ``create(backend_type, **kwargs)`` and ``register_backend``."""

from __future__ import annotations

from typing import Any

import pytest

from agentscope_serverless.local_stack import DynamoDBServer, RedisServer
from agentscope_serverless.services.agent_state import (
    InMemoryStateService,
    StateService,
    StateServiceFactory,
)
from agentscope_serverless.services.agent_state.dynamodb import DynamoDBStateService
from agentscope_serverless.services.memory import MemoryServiceFactory
from agentscope_serverless.services.memory.redis import RedisMemoryService
from agentscope_serverless.services.sandbox import SandboxService, SandboxServiceFactory
from agentscope_serverless.services.session_history import SessionHistoryServiceFactory
from agentscope_serverless.services.session_history.redis import RedisSessionHistoryService


def test_every_factory_has_our_backends() -> None:
    assert SessionHistoryServiceFactory.backends() == ["dynamodb", "in_memory", "redis"]
    assert MemoryServiceFactory.backends() == ["in_memory", "redis"]
    assert StateServiceFactory.backends() == ["dynamodb", "in_memory", "redis"]
    assert SandboxServiceFactory.backends() == ["default"]


async def test_create_builds_a_service_that_is_not_started(
    redis_server: RedisServer, user_id: str
) -> None:
    history = await SessionHistoryServiceFactory.create(
        "REDIS", redis_url=redis_server.url, not_a_parameter=1
    )
    assert isinstance(history, RedisSessionHistoryService)
    with pytest.raises(RuntimeError):
        await history.get_session(user_id, "s1")
    async with history:
        session = await history.create_session(user_id, "s1")
        assert session.id == "s1"


async def test_environment_picks_the_backend_and_typed_arguments(
    monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer, user_id: str
) -> None:
    monkeypatch.setenv("MEMORY_BACKEND", "redis")
    monkeypatch.setenv("MEMORY_REDIS_REDIS_URL", redis_server.url)
    monkeypatch.setenv("MEMORY_REDIS_TTL_SECONDS", "60")
    memory = await MemoryServiceFactory.create()
    assert isinstance(memory, RedisMemoryService)
    async with memory:
        await memory.add_memory(user_id, [{"role": "user", "content": "green tea"}])
        assert len(await memory.search_memory(user_id, [{"role": "user", "content": "tea"}])) == 1
    monkeypatch.setenv("MEMORY_REDIS_TTL_SECONDS", "soon")
    with pytest.raises(ValueError, match="ttl_seconds must be an integer"):
        await MemoryServiceFactory.create()
    monkeypatch.setenv("MEMORY_REDIS_TTL_SECONDS", "60")
    # AgentScope's string from the environment failed on the first add (a TypeError).
    monkeypatch.setenv("MEMORY_REDIS_MAX_MESSAGES_PER_SESSION", "1")
    async with await MemoryServiceFactory.create() as capped:
        await capped.add_memory(user_id, [{"role": "user", "content": "black tea"}], "s")
        await capped.add_memory(user_id, [{"role": "user", "content": "white tea"}], "s")
        found = await capped.search_memory(user_id, [{"role": "user", "content": "tea"}])
        assert [m.get_text_content() for m in found] == ["white tea", "green tea"]


async def test_dynamodb_state_from_the_factory(dynamodb_server: DynamoDBServer) -> None:
    state = await StateServiceFactory.create(
        "dynamodb",
        table_name=dynamodb_server.state_table,
        endpoint_url=dynamodb_server.endpoint_url,
        region_name=dynamodb_server.region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    assert isinstance(state, DynamoDBStateService)


async def test_unknown_backends_are_refused_and_new_ones_registered() -> None:
    with pytest.raises(ValueError, match="Unsupported backend type: 'mongo'"):
        await StateServiceFactory.create("mongo")

    class CountingStateService(InMemoryStateService):
        def __init__(self, start_round: int = 0, **options: Any) -> None:
            super().__init__()
            self.options = options

    StateServiceFactory.register_backend("counting", CountingStateService)
    try:
        service: StateService = await StateServiceFactory.create("counting", extra=1)
        assert isinstance(service, CountingStateService) and service.options == {"extra": 1}
        assert "counting" not in SessionHistoryServiceFactory.backends()
    finally:
        StateServiceFactory._registry.pop("counting")


async def test_sandbox_factory_builds_a_remote_sandbox_service() -> None:
    service = await SandboxServiceFactory.create(base_url="http://127.0.0.1:9", bearer_token="t")
    assert isinstance(service, SandboxService)
