"""Services written for AgentScope Runtime 1.0.5, as its guide suggests ("extend the
SessionHistoryService abstract base class"): subclasses overriding AgentScope's public
methods instantiate and serve an app, whose runner reads them through those methods; what
those methods cannot give is refused naming the method to override."""

from __future__ import annotations

import copy
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import redis.asyncio

from agentscope_serverless import AgentApp
from agentscope_serverless.errors import ConfigurationError, ServiceNotStartedError
from agentscope_serverless.local_stack import RedisServer
from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services.agent_state import RedisStateService, StateService
from agentscope_serverless.services.memory import MemoryService, RedisMemoryService
from agentscope_serverless.services.session_history import (
    InMemorySessionHistoryService,
    RedisSessionHistoryService,
    SessionHistoryService,
)
from tests.support.ported_state import DictStateService


class DictSessionHistoryService(SessionHistoryService):
    """Sessions in a dict, keeping what it is given (dicts too), as AgentScope's did."""

    def __init__(self) -> None:
        self.store: dict[str, dict[str, Session]] = {}

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def health(self) -> bool:
        return True

    async def create_session(self, user_id: str, session_id: str | None = None) -> Session:
        sid = (session_id or "").strip() or str(uuid.uuid4())
        session = Session(id=sid, user_id=user_id)
        return copy.deepcopy(self.store.setdefault(user_id, {}).setdefault(sid, session))

    async def get_session(self, user_id: str, session_id: str) -> Session | None:
        return copy.deepcopy(self.store.get(user_id, {}).get(session_id))

    async def delete_session(self, user_id: str, session_id: str) -> None:
        self.store.get(user_id, {}).pop(session_id, None)

    async def list_sessions(self, user_id: str) -> list[Session]:
        return [Session(id=s.id, user_id=user_id) for s in self.store.get(user_id, {}).values()]

    async def append_message(self, session: Session, message: Any) -> None:
        messages = message if isinstance(message, list) else [message]
        stored = await self.create_session(session.user_id, session.id)
        self.store[session.user_id][stored.id].messages.extend(
            m.model_dump() if isinstance(m, Message) else m for m in messages
        )


class ListMemoryService(MemoryService):
    def __init__(self) -> None:
        self.memories: list[tuple[str, Any]] = []

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def health(self) -> bool:
        return True

    async def add_memory(self, user_id: str, messages: Any, session_id: str | None = None) -> None:
        self.memories += [(user_id, message) for message in messages]

    async def search_memory(
        self, user_id: str, messages: Any, filters: dict[str, Any] | None = None
    ) -> list[Any]:
        return [m for u, m in self.memories if u == user_id][-(filters or {}).get("top_k", 5) :]

    async def list_memory(self, user_id: str, filters: dict[str, Any] | None = None) -> list[Any]:
        return [m for u, m in self.memories if u == user_id]

    async def delete_memory(self, user_id: str, session_id: str | None = None) -> None:
        self.memories = [(u, m) for u, m in self.memories if u != user_id]


def counting_app(history: SessionHistoryService) -> AgentApp:
    app = AgentApp(
        app_name="counter",
        session_history_service=history,
        state_service=DictStateService(),
        memory_service=ListMemoryService(),
    )

    @app.query(framework="text")
    async def query(
        self: Any, msgs: Any, session: Session, memories: list[Message], **kwargs: Any
    ) -> AsyncIterator[str]:
        turns = await self.state_service.save_state(session.user_id, {}, session.id)
        yield f"turn {turns}: {len(session.messages)} in history, {len(memories)} memories"

    return app


async def test_an_app_runs_on_services_written_for_agentscope() -> None:
    history = DictSessionHistoryService()
    app = counting_app(history)
    async with app:
        first = await app.query("hi", user_id="ann", session_id="s1")
        second = await app.query("again", user_id="ann", session_id="s1")
    assert first.status == second.status == "completed", (first.error, second.error)
    assert second.output is not None
    assert second.output[0].get_text_content() == "turn 2: 2 in history, 2 memories"
    stored = history.store["ann"]["s1"].messages
    assert [m["role"] for m in stored] == ["user", "assistant", "user", "assistant"]


async def test_messages_such_a_service_kept_before_ids_were_held_to_more_are_read() -> None:
    # A control character, only whitespace: ids a new message may no longer have.
    old = [{"id": i, "role": "user", "content": i} for i in ("a\x00b", " ")]
    history = DictSessionHistoryService()
    history.store["ann"] = {"s1": Session(id="s1", user_id="ann", messages=old)}
    async with history:
        opened = await history.open_session("ann", "s1", recent=2)
        assert [m.id for m in opened.messages] == ["a\x00b", " "]  # type: ignore[union-attr]
        page = await history.list_messages("ann", "s1")
        assert [m.id for m in page.items] == ["a\x00b", " "]


async def test_beyond_agentscopes_methods_the_base_reads_through_them() -> None:
    history = DictSessionHistoryService()
    async with history:
        for sid in ("s1", "s2", "s3"):
            session = await history.create_session("ann", sid)
            await history.append_message(session, {"role": "user", "content": sid})
        opened = await history.open_session("ann", "s2", recent=1)
        assert [m.get_text_content() for m in opened.messages] == ["s2"]
        page = await history.list_sessions_page("ann", limit=2)
        assert [s.id for s in page.items] == ["s1", "s2"] and page.next_cursor is not None
        rest = await history.list_sessions_page("ann", limit=2, cursor=page.next_cursor)
        assert [s.id for s in rest.items] == ["s3"] and rest.next_cursor is None
        messages = await history.list_messages("ann", "s3")
        assert [m.get_text_content() for m in messages.items] == ["s3"]
        await history.delete_user_sessions("ann")
        assert await history.list_sessions("ann") == []


async def test_what_agentscopes_methods_cannot_give_is_refused_naming_the_method() -> None:
    state = DictStateService()
    with pytest.raises(NotImplementedError, match=r"override list_rounds\(\)"):
        await state.list_rounds("ann", "s1")
    with pytest.raises(NotImplementedError, match=r"override clear_all_memory\(\)"):
        await ListMemoryService().clear_all_memory()


async def test_a_history_without_append_message_is_refused_naming_it() -> None:
    # AgentScope's base made append_message a no-op that dropped every message.
    class ReadOnlyHistory(DictSessionHistoryService):
        append_message = SessionHistoryService.append_message  # type: ignore[assignment]

    history = ReadOnlyHistory()
    session = await history.create_session("ann", "s1")
    with pytest.raises(NotImplementedError, match=r"override append_message\(\)"):
        await history.append_message(session, {"role": "user", "content": "hi"})


class SuperCallingHistory(SessionHistoryService):
    """Calls the base's methods first, as AgentScope's base allowed (its ``append_message``
    was a no-op, the others abstract)."""

    def __init__(self) -> None:
        self.sessions: dict[tuple[str, str], list[Any]] = {}

    async def create_session(self, user_id: str, session_id: str | None = None) -> Session:
        assert await super().create_session(user_id, session_id) is None
        sid = session_id or str(uuid.uuid4())
        self.sessions.setdefault((user_id, sid), [])
        return Session(id=sid, user_id=user_id)

    async def get_session(self, user_id: str, session_id: str) -> Session | None:
        assert await super().get_session(user_id, session_id) is None
        messages = self.sessions.get((user_id, session_id))
        return (
            None if messages is None else Session(id=session_id, user_id=user_id, messages=messages)
        )

    async def delete_session(self, user_id: str, session_id: str) -> None:
        await super().delete_session(user_id, session_id)
        self.sessions.pop((user_id, session_id), None)

    async def list_sessions(self, user_id: str) -> list[Session]:
        assert await super().list_sessions(user_id) is None
        return [Session(id=s, user_id=u) for u, s in self.sessions if u == user_id]

    async def append_message(self, session: Session, message: Any) -> None:
        await super().append_message(session, message)
        messages = message if isinstance(message, list) else [message]
        self.sessions.setdefault((session.user_id, session.id), []).extend(messages)


async def test_super_calls_of_agentscopes_methods_do_nothing_as_its_base_did() -> None:
    history = SuperCallingHistory()
    session = await history.create_session("ann", "s1")
    await history.append_message(session, {"role": "user", "content": "hi"})
    assert session.messages == []  # AgentScope's base did not touch the object either
    messages = await history.list_messages("ann", "s1")
    assert [m.get_text_content() for m in messages.items] == ["hi"]
    assert [s.id for s in await history.list_sessions("ann")] == ["s1"]
    await history.delete_session("ann", "s1")
    assert await history.get_session("ann", "s1") is None

    class SuperState(StateService):
        def __init__(self) -> None:
            self.saved: dict[str, Any] = {}

        async def save_state(
            self,
            user_id: str,
            state: dict[str, Any],
            session_id: str | None = None,
            round_id: int | None = None,
        ) -> int:
            assert await super().save_state(user_id, state, session_id, round_id) is None
            self.saved[user_id] = state
            return 1

        async def export_state(
            self, user_id: str, session_id: str | None = None, round_id: int | None = None
        ) -> dict[str, Any] | None:
            assert await super().export_state(user_id, session_id, round_id) is None
            return self.saved.get(user_id)

    class SuperMemory(ListMemoryService):
        async def add_memory(self, user_id: str, messages: Any, session_id: Any = None) -> None:
            await MemoryService.add_memory(self, user_id, messages, session_id)
            await super().add_memory(user_id, messages, session_id)

    state, memory = SuperState(), SuperMemory()
    assert await state.save_state("ann", {"a": 1}, session_id="s1") == 1
    assert await state.export_state("ann", session_id="s1", round_id=1) == {"a": 1}
    await memory.add_memory("ann", [{"role": "user", "content": "tea"}])
    assert len(await memory.list_memory("ann")) == 1


def logged(backend: type[Any]) -> type[Any]:
    """A wrapper of a backend, overriding AgentScope's methods to call ``super()``."""

    class Logged(backend):  # type: ignore[misc]
        calls: list[str] = []

        async def create_session(self, user_id: str, session_id: str | None = None) -> Session:
            self.calls.append("create_session")
            return await super().create_session(user_id, session_id)  # type: ignore[no-any-return]

        async def get_session(self, user_id: str, session_id: str) -> Session | None:
            return await super().get_session(user_id, session_id)  # type: ignore[no-any-return]

        async def delete_session(self, user_id: str, session_id: str) -> None:
            await super().delete_session(user_id, session_id)

        async def list_sessions(self, user_id: str) -> list[Session]:
            return await super().list_sessions(user_id)  # type: ignore[no-any-return]

        async def append_message(self, session: Session, message: Any) -> None:
            self.calls.append("append_message")
            await super().append_message(session, message)

    return Logged


async def test_a_wrapper_of_a_backend_keeps_its_started_check_and_storage(
    redis_server: RedisServer,
) -> None:
    for history in (
        logged(InMemorySessionHistoryService)(),
        logged(RedisSessionHistoryService)(redis_server.url),
    ):
        with pytest.raises(ServiceNotStartedError):
            await history.create_session("ann", "s1")
        async with history:
            session = await history.create_session("ann", "s1")
            await history.append_message(session, {"role": "user", "content": "hi"})
            opened = await history.open_session("ann", "s1", recent=5)
            assert [m.get_text_content() for m in opened.messages] == ["hi"]
            assert [m.get_text_content() for m in session.messages] == ["hi"]
            await history.delete_session("ann", "s1")
        assert history.calls == ["create_session", "create_session", "append_message"]
        with pytest.raises(ServiceNotStartedError):
            await history.create_session("ann", "s1")

    class LoggedState(RedisStateService):
        async def save_state(
            self,
            user_id: str,
            state: dict[str, Any],
            session_id: str | None = None,
            round_id: int | None = None,
        ) -> int:
            return await super().save_state(user_id, state, session_id, round_id)

        async def export_state(
            self, user_id: str, session_id: str | None = None, round_id: int | None = None
        ) -> dict[str, Any] | None:
            return await super().export_state(user_id, session_id, round_id)

    state = LoggedState(redis_server.url)
    with pytest.raises(ServiceNotStartedError):
        await state.save_state("ann", {"a": 1})
    async with state:
        round_id = await state.save_state("ann", {"a": 1}, session_id=uuid.uuid4().hex)
        assert round_id == 1


@pytest.mark.parametrize(
    "service", [RedisSessionHistoryService, RedisMemoryService, RedisStateService]
)
def test_a_redis_client_that_is_not_an_asyncio_one_is_refused_naming_it(service: Any) -> None:
    # AgentScope takes a redis.asyncio client; given redis.Redis (the sync client), the
    # service failed at its first call: "object list can't be used in 'await' expression".
    with pytest.raises(TypeError, match=r"redis\.asyncio.*redis\.client\.Redis"):
        service(redis_client=redis.Redis())
    with pytest.raises(TypeError, match="got str"):
        service(redis_client="redis://localhost:6379/0")
    service(redis_client=redis.asyncio.Redis())


@pytest.mark.parametrize(
    "service", [RedisSessionHistoryService, RedisMemoryService, RedisStateService]
)
def test_a_redis_url_that_is_not_text_is_refused_naming_it(service: Any) -> None:
    # redis_url=os.environ.get("REDIS_URL") with the variable unset failed at start with
    # "argument of type 'NoneType' is not iterable".
    with pytest.raises(ConfigurationError, match=r"redis_url must be a Redis URL.*got None"):
        service(redis_url=None)
    with pytest.raises(ConfigurationError, match="got bytes"):
        service(redis_url=b"redis://localhost:6379/0")
