"""Backends are selected and configured by settings (environment variables)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from redis.asyncio import Redis

from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS, DynamoDBServer, RedisServer
from agentscope_serverless.schemas.agent_schemas import Message, TextContent
from agentscope_serverless.services.factory import (
    create_memory_service,
    create_service_manager,
    create_session_history_service,
    create_state_service,
)
from agentscope_serverless.settings import load_settings


def msg(text: str) -> Message:
    return Message(role="user", content=[TextContent(text=text)])


@pytest.mark.parametrize(
    ("backend", "history", "state"),
    [
        ("in_memory", "InMemorySessionHistoryService", "InMemoryStateService"),
        ("redis", "RedisSessionHistoryService", "RedisStateService"),
        ("dynamodb", "DynamoDBSessionHistoryService", "DynamoDBStateService"),
    ],
)
def test_the_backend_setting_picks_the_class(backend: str, history: str, state: str) -> None:
    settings = load_settings(session_history_backend=backend, state_backend=backend)
    assert type(create_session_history_service(settings)).__name__ == history
    assert type(create_state_service(settings)).__name__ == state


@pytest.mark.parametrize(
    ("backend", "memory"),
    [("in_memory", "InMemoryMemoryService"), ("redis", "RedisMemoryService")],
)
def test_the_memory_backend_setting_picks_the_class(backend: str, memory: str) -> None:
    assert type(create_memory_service(load_settings(memory_backend=backend))).__name__ == memory


@pytest.mark.parametrize(
    "overrides",
    [
        {"memory_backend": "dynamodb"},
        {"session_history_backend": "mongo"},
        {"redis_key_prefix": "a{b}"},
        {"redis_key_prefix": "has space"},
        {"session_ttl_seconds": 0},
        {"max_messages_per_session": "many"},
    ],
)
def test_bad_settings_fail_at_start_up(overrides: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        load_settings(**overrides)


def test_importing_the_services_imports_no_store_client() -> None:
    code = (
        "import sys\n"
        "import agentscope_serverless.services.factory\n"
        "import agentscope_serverless.services.session_history\n"
        "import agentscope_serverless.services.memory\n"
        "import agentscope_serverless.services.agent_state\n"
        "assert not {'redis', 'aioboto3', 'botocore'} & set(sys.modules), sys.modules.keys()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_redis_settings_reach_every_redis_service(
    redis_server: RedisServer, user_id: str
) -> None:
    settings = load_settings(
        session_history_backend="redis",
        memory_backend="redis",
        state_backend="redis",
        redis_url=redis_server.url,
        redis_key_prefix="custom",
        session_ttl_seconds=60,
        max_messages_per_session=2,
    )
    async with create_service_manager(settings) as manager:
        history = manager.session_history
        session = await history.create_session(user_id, "s1")
        await history.append_message(session, [msg("a"), msg("b"), msg("c")])
        stored = await history.get_session(user_id, "s1")
        assert [m.get_text_content() for m in stored.messages] == ["b", "c"]  # type: ignore[union-attr]
        await manager.memory.add_memory(user_id, [msg("remember this")])
        await manager.state.save_state(user_id, {"v": 1})
        assert all((await manager.health_check()).values())

    client = Redis.from_url(redis_server.url, decode_responses=True)
    assert 0 < await client.ttl(f"custom:session:{{{user_id}}}:s:s1:messages") <= 60
    assert await client.ttl(f"custom:memory:{{{user_id}}}:docs") == -1
    assert await client.ttl(f"custom:state:{{{user_id}}}:s:default:states") == -1
    await client.aclose()


async def test_the_message_limit_reaches_the_in_memory_history(user_id: str) -> None:
    settings = load_settings(max_messages_per_session=2)
    async with create_session_history_service(settings) as history:
        session = await history.create_session(user_id, "s1")
        await history.append_message(session, [msg("a"), msg("b"), msg("c")])
        stored = await history.get_session(user_id, "s1")
        assert [m.get_text_content() for m in stored.messages] == ["b", "c"]  # type: ignore[union-attr]


async def test_dynamodb_settings_reach_the_dynamodb_services(
    dynamodb_server: DynamoDBServer, user_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", LOCAL_AWS_CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_AWS_CREDENTIALS["aws_secret_access_key"])
    monkeypatch.setenv("DYNAMODB_ENDPOINT_URL", dynamodb_server.endpoint_url)
    monkeypatch.setenv("SESSION_HISTORY_BACKEND", "dynamodb")
    monkeypatch.setenv("STATE_BACKEND", "dynamodb")
    settings = load_settings()
    async with create_service_manager(settings) as manager:
        assert all((await manager.health_check()).values())
        session = await manager.session_history.create_session(user_id, "s1")
        await manager.session_history.append_message(session, msg("hello"))
        assert await manager.state.save_state(user_id, {"v": 1}) == 1
        assert (await manager.session_history.get_session(user_id, "s1")) is not None
