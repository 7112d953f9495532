"""Deleting everything of a user, on every backend: ``delete_user_sessions``,
``delete_user_memory``, ``delete_user_state``; other users keep everything, and a
concurrent writer never leaves part of the user's data behind."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from agentscope_serverless.services.agent_state import StateService
from agentscope_serverless.services.memory import MemoryService
from agentscope_serverless.services.session_history import SessionHistoryService

TRICKY_SESSIONS = ["s1", "with space", "a:b{c}*", "ünï_%", "s" * 200]


async def test_delete_user_sessions_removes_every_session_and_message(
    history: SessionHistoryService, user_id: str
) -> None:
    other = f"{user_id}:other"
    for sid in TRICKY_SESSIONS:
        session = await history.create_session(user_id, sid)
        await history.append_message(session, [{"role": "user", "content": f"hi {sid}"}] * 3)
    kept = await history.create_session(other, "s1")
    await history.append_message(kept, {"role": "user", "content": "mine"})
    await history.delete_user_sessions(user_id)
    assert await history.list_sessions(user_id) == []
    for sid in TRICKY_SESSIONS:
        assert await history.get_session(user_id, sid) is None
    survivor = await history.get_session(other, "s1")
    assert survivor is not None and [m.get_text_content() for m in survivor.messages] == ["mine"]
    # The user can start again from nothing.
    again = await history.create_session(user_id, "s1")
    assert again.messages == []
    await history.delete_user_sessions(f"{user_id}-nobody")


async def test_a_message_id_of_an_erased_session_is_new_again(
    history: SessionHistoryService, user_id: str
) -> None:
    before = await history.create_session(user_id, "s1")
    await history.append_message(before, {"id": "m1", "role": "user", "content": "old"})
    await history.append_message(before, {"id": "m2", "role": "user", "content": "old"})
    await history.delete_user_sessions(user_id)
    after = await history.create_session(user_id, "s1")
    await history.append_message(after, {"id": "m2", "role": "user", "content": "new"})
    await history.append_message(after, {"id": "m1", "role": "user", "content": "newer"})
    stored = await history.get_session(user_id, "s1")
    assert stored is not None
    assert [(m.id, m.get_text_content()) for m in stored.messages] == [
        ("m2", "new"),
        ("m1", "newer"),
    ]


async def test_delete_user_sessions_races_with_appends_and_creates(
    history: SessionHistoryService, user_id: str
) -> None:
    for i in range(5):
        await history.create_session(user_id, f"s{i}")

    async def writer(i: int) -> None:
        session = await history.create_session(user_id, f"new{i}")
        await history.append_message(session, {"role": "user", "content": "x"})

    await asyncio.gather(history.delete_user_sessions(user_id), *(writer(i) for i in range(5)))
    # What existed before is gone; what was written concurrently is whole or absent.
    for i in range(5):
        assert await history.get_session(user_id, f"s{i}") is None
    for session in await history.list_sessions(user_id):
        stored = await history.get_session(user_id, session.id)
        assert stored is not None and len(stored.messages) in (0, 1)


async def test_delete_user_memory_forgets_every_session(
    memory: MemoryService, user_id: str
) -> None:
    other = f"{user_id}:other"
    for sid in TRICKY_SESSIONS:
        await memory.add_memory(user_id, [{"role": "user", "content": "green tea"}], sid)
    await memory.add_memory(other, [{"role": "user", "content": "green tea"}], "s1")
    await memory.delete_user_memory(user_id)
    query = [{"role": "user", "content": "tea"}]
    assert await memory.search_memory(user_id, query) == []
    assert await memory.list_memory(user_id) == []
    assert len(await memory.search_memory(other, query)) == 1


async def test_clear_all_memory_forgets_every_user(memory: MemoryService, user_id: str) -> None:
    others = [f"{user_id}-{i}" for i in range(3)]
    for user in [user_id, *others]:
        await memory.add_memory(user, [{"role": "user", "content": "green tea"}])
    await memory.clear_all_memory()
    for user in [user_id, *others]:
        assert await memory.list_memory(user) == []


async def test_get_query_text_is_the_messages_text(memory: MemoryService) -> None:
    from agentscope_serverless.schemas.agent_schemas import Message, TextContent

    message = Message(role="user", content=[TextContent(text="green tea")])
    assert await memory.get_query_text(message) == "green tea"


async def test_delete_user_state_removes_every_session(state: StateService, user_id: str) -> None:
    other = f"{user_id}:other"
    for sid in TRICKY_SESSIONS:
        await state.save_state(user_id, {"sid": sid}, session_id=sid)
        await state.save_state(user_id, {"sid": sid, "round": 2}, session_id=sid)
    await state.save_state(user_id, {"v": 1}, session_id=None, round_id=7)
    await state.save_state(other, {"v": "mine"}, session_id="s1")
    await state.delete_user_state(user_id)
    for sid in [*TRICKY_SESSIONS, None]:
        assert await state.export_state(user_id, session_id=sid) is None
        assert await state.list_rounds(user_id, session_id=sid) == []
    assert await state.export_state(other, session_id="s1") == {"v": "mine"}
    # Saving again starts from round 1.
    assert await state.save_state(user_id, {"v": 2}, session_id="s1") == 1
    await state.delete_user_state(f"{user_id}-nobody")


async def test_a_second_delete_user_state_removes_what_saves_racing_the_first_made(
    state_factory: Callable[[], StateService], user_id: str
) -> None:
    async with state_factory() as writer, state_factory() as deleter:
        for i in range(3):
            await writer.save_state(user_id, {"v": 0}, session_id=f"s{i}")

        async def save(k: int) -> None:
            await asyncio.sleep(0)
            await writer.save_state(user_id, {"v": k}, session_id=f"s{k % 3}")

        await asyncio.gather(deleter.delete_user_state(user_id), *(save(k) for k in range(12)))
        await deleter.delete_user_state(user_id)
        for i in range(3):
            assert await writer.export_state(user_id, session_id=f"s{i}") is None
            assert await writer.list_rounds(user_id, session_id=f"s{i}") == []
