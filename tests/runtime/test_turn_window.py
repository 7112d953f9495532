"""A turn reads a bounded window of the session, whatever its length, on every backend.

The items read are counted at the store's edge: the messages the in-memory backend decodes,
the strings in Redis' replies (a client that counts what it parses), the items in DynamoDB's
Query replies (a botocore event hook on the client).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aioboto3
import pytest
from redis.asyncio import Redis

from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS, DynamoDBServer, RedisServer
from agentscope_serverless.runner import Runner
from agentscope_serverless.schemas.agent_schemas import Message, TextContent
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services import _stored as stored_messages
from agentscope_serverless.services.manager import ServiceManager
from agentscope_serverless.services.session_history import (
    InMemorySessionHistoryService,
    SessionHistoryService,
)
from agentscope_serverless.services.session_history.dynamodb import (
    DynamoDBSessionHistoryService,
)
from agentscope_serverless.services.session_history.redis import RedisSessionHistoryService
from agentscope_serverless.settings import load_settings

HISTORY = 5000
WINDOW = 40


class ItemCounter:
    """How many stored items a backend has read since the last reset."""

    def __init__(self) -> None:
        self.items = 0


def _strings(reply: Any) -> int:
    if isinstance(reply, list):
        return sum(_strings(item) for item in reply)
    return 1 if isinstance(reply, bytes | str) else 0


class CountingRedis(Redis):
    """A real Redis client that counts the strings in every reply it parses."""

    counter = ItemCounter()

    async def parse_response(self, connection: Any, command_name: Any, **options: Any) -> Any:
        reply = await super().parse_response(connection, command_name, **options)
        self.counter.items += _strings(reply)
        return reply


@pytest.fixture(params=["in_memory", "redis", "dynamodb"])
async def counted_history(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    redis_server: RedisServer,
    dynamodb_server: DynamoDBServer,
) -> AsyncIterator[tuple[SessionHistoryService, ItemCounter]]:
    counter = ItemCounter()
    if request.param == "in_memory":
        # Every decoded message is built by one of these: from its parsed JSON, or from
        # the fields kept of a message read before.
        for builder in ("_message", "_from_known"):
            monkeypatch.setattr(stored_messages, builder, counting(counter, builder))
        async with InMemorySessionHistoryService() as service:
            yield service, counter
    elif request.param == "redis":
        client = CountingRedis.from_url(redis_server.url)
        client.counter = counter
        try:
            async with RedisSessionHistoryService(redis_client=client) as service:
                yield service, counter
        finally:
            await client.aclose()
    else:

        def count_items(parsed: dict[str, Any], **_: Any) -> None:
            counter.items += len(parsed.get("Items", []))

        session = aioboto3.Session(region_name=dynamodb_server.region, **LOCAL_AWS_CREDENTIALS)
        async with session.client("dynamodb", endpoint_url=dynamodb_server.endpoint_url) as client:
            client.meta.events.register("after-call.dynamodb.Query", count_items)
            async with DynamoDBSessionHistoryService(
                dynamodb_server.sessions_table, client=client
            ) as service:
                yield service, counter


def counting(counter: ItemCounter, builder: str) -> Callable[[Any], Message]:
    build = getattr(stored_messages, builder)

    def counted(data: Any) -> Message:
        counter.items += 1
        message: Message = build(data)
        return message

    return counted


def text_message(text: str) -> Message:
    return Message(role="user", content=[TextContent(text=text)])  # type: ignore[arg-type]


async def long_session(history: SessionHistoryService, user_id: str) -> Session:
    session = await history.create_session(user_id, "long")
    for start in range(0, HISTORY, 500):
        await history.append_message(
            session, [text_message(f"m{i}") for i in range(start, start + 500)]
        )
    return session


async def test_a_turn_on_a_long_session_reads_at_most_the_window(
    counted_history: tuple[SessionHistoryService, ItemCounter], user_id: str
) -> None:
    history, counter = counted_history
    await long_session(history, user_id)
    seen: list[str | None] = []

    async def handler(self: Runner, msgs: Any, session: Session, **kwargs: Any) -> str:
        seen.extend(m.get_text_content() for m in session.messages if isinstance(m, Message))
        return "ok"

    services = ServiceManager().register_service("session_history", history)
    async with Runner(handler, services=services, history_window=WINDOW) as runner:
        counter.items = 0
        response = await runner.query(
            {"input": [{"role": "user", "content": "next"}], "session_id": "long"},
            user_id=user_id,
        )
    assert response.error is None
    assert seen == [f"m{i}" for i in range(HISTORY - WINDOW, HISTORY)]
    # The window, and a few counters, ids or copies of the turn's own two messages at most.
    assert counter.items <= WINDOW + 5
    page = await history.list_messages(user_id, "long", limit=3)
    assert [m.get_text_content() for m in page.items] == ["m0", "m1", "m2"]


async def test_a_turn_whose_agent_ignores_the_history_decodes_none_of_it(
    monkeypatch: pytest.MonkeyPatch, user_id: str
) -> None:
    """Storing a turn extends its session without making the window's messages: on a long
    session, a turn that never reads ``session.messages`` decodes none of them."""
    counter = ItemCounter()
    for builder in ("_message", "_from_known"):
        monkeypatch.setattr(stored_messages, builder, counting(counter, builder))
    async with InMemorySessionHistoryService() as history:
        await long_session(history, user_id)
        services = ServiceManager().register_service("session_history", history)
        handler: Callable[..., Any] = lambda self, msgs, **kwargs: "ok"  # noqa: E731
        async with Runner(handler, services=services, history_window=WINDOW) as runner:
            counter.items = 0
            response = await runner.query(
                {"input": [{"role": "user", "content": "next"}], "session_id": "long"},
                user_id=user_id,
            )
        assert response.error is None
        assert counter.items == 0
        page = await history.list_messages(user_id, "long", limit=3, cursor=None)
        assert page.items[0].get_text_content() == "m0"
        session = await history.open_session(user_id, "long", recent=2)
        assert [m.get_text_content() for m in session.messages] == ["next", "ok"]


async def test_a_turn_on_a_new_session_reads_no_message(
    counted_history: tuple[SessionHistoryService, ItemCounter], user_id: str
) -> None:
    history, counter = counted_history
    services = ServiceManager().register_service("session_history", history)
    handler: Callable[..., Any] = lambda self, msgs, **kwargs: "ok"  # noqa: E731
    async with Runner(handler, services=services, history_window=WINDOW) as runner:
        counter.items = 0
        response = await runner.query(
            {"input": [{"role": "user", "content": "hi"}], "session_id": "fresh"},
            user_id=user_id,
        )
    assert response.error is None
    assert counter.items <= 5


async def test_the_app_window_wins_over_the_setting(user_id: str) -> None:
    from agentscope_serverless.app import AgentApp

    seen: list[int] = []
    app = AgentApp(app_name="windowed", history_window=3)

    @app.query(framework="text")
    async def query(self: Runner, msgs: Any, session: Session, **kwargs: Any) -> str:
        seen.append(len(session.messages))
        return "ok"

    async with InMemorySessionHistoryService() as history:
        services = ServiceManager().register_service("session_history", history)
        settings = load_settings(agent_history_window=50)
        async with app.create_runner(services, settings=settings) as runner:
            for _ in range(4):
                await runner.query({"input": [{"role": "user", "content": "hi"}]}, user_id=user_id)
                await runner.query(
                    {"input": [{"role": "user", "content": "hi"}], "session_id": "s"},
                    user_id=user_id,
                )
    assert seen == [0, 0, 0, 2, 0, 3, 0, 3]


def test_the_setting_reaches_the_runner_of_the_http_app() -> None:
    from agentscope_serverless.app import AgentApp
    from agentscope_serverless.http import create_app
    from agentscope_serverless.settings import load_settings

    app = AgentApp(app_name="plain")
    app.query(framework="text")(lambda self, msgs, **kwargs: "ok")
    web = create_app(["process"], settings=load_settings(agent_history_window=7), agent_app=app)
    assert web.state.context.runner.history_window == 7


@pytest.mark.parametrize("window", [-1, 1001, 2.5, True])
def test_a_bad_app_window_is_refused(window: object) -> None:
    from agentscope_serverless.app import AgentApp

    with pytest.raises(ValueError, match="history_window"):
        AgentApp(history_window=window)  # type: ignore[arg-type]
