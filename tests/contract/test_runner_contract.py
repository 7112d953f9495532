"""The runner's turns on every session history backend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from agentscope_serverless.runner import Runner
from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.services.manager import ServiceManager
from agentscope_serverless.services.memory import MemoryService

from .conftest import SessionHistoryFactory


async def test_an_input_sent_twice_at_once_goes_into_memory_once(
    session_history_factory: SessionHistoryFactory,
    memory_redis_factory: Callable[[], MemoryService],
    user_id: str,
) -> None:
    # Both runs found the input's ids not in the session yet, and both added it to memory
    # after one of them stored it: a client's retry racing its first try doubled the
    # user's memories of it. (Memory on Redis: each run waits for its search there, so the
    # other looks the ids up meanwhile, whatever the history's store.)
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> str:
        return "noted"

    given = {
        "input": [{"id": "m-kiwi", "role": "user", "content": "remember the kiwi"}],
        "session_id": "s1",
        "user_id": user_id,
    }
    manager = (
        ServiceManager()
        .register_service("session_history", session_history_factory())
        .register_service("memory", memory_redis_factory())
    )
    async with manager, Runner(handler, services=manager) as runner:
        finals = await asyncio.gather(runner.query(given), runner.query(given))
        assert [final.status for final in finals] == ["completed", "completed"]
        session = await runner.session_history_service.get_session(user_id, "s1")
        assert runner.memory_service is not None
        memories = await runner.memory_service.list_memory(user_id, {"page_size": 100})
    assert session is not None
    stored = [m.get_text_content() for m in session.messages if isinstance(m, Message)]
    assert stored == ["remember the kiwi", "noted", "noted"]
    assert sorted(m.get_text_content() or "" for m in memories) == [
        "noted",
        "noted",
        "remember the kiwi",
    ]
