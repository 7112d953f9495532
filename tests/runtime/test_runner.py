"""The Runner in process: handler shapes, the event sequence, history, memory and failures."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import types
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from agentscope_serverless import runner as runner_module
from agentscope_serverless.app import AgentApp
from agentscope_serverless.errors import (
    ConfigurationError,
    InvalidInputError,
    ServiceNotStartedError,
    StoreUnavailableError,
)
from agentscope_serverless.local_stack import RedisServer
from agentscope_serverless.log import logger
from agentscope_serverless.recorder import RunRecorder
from agentscope_serverless.runner import GATHERED_TEXT_SECONDS, Runner
from agentscope_serverless.schemas.agent_schemas import (
    AgentRequest,
    AgentResponse,
    Content,
    DataContent,
    Event,
    Message,
    TextContent,
)
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services import _validation as validation
from agentscope_serverless.services.agent_state import InMemoryStateService
from agentscope_serverless.services.manager import ServiceManager
from agentscope_serverless.services.memory import InMemoryMemoryService
from agentscope_serverless.services.memory.redis import RedisMemoryService
from agentscope_serverless.services.runs.in_memory import InMemoryRunsService
from agentscope_serverless.services.session_history import InMemorySessionHistoryService
from agentscope_serverless.settings import load_settings


def request(text: str, session_id: str = "s1", user_id: str = "u1") -> dict[str, Any]:
    return {
        "input": [{"role": "user", "content": text}],
        "session_id": session_id,
        "user_id": user_id,
    }


def services(memory: bool = True) -> ServiceManager:
    manager = ServiceManager().register_service("session_history", InMemorySessionHistoryService())
    if memory:
        manager.register_service("memory", InMemoryMemoryService())
    return manager.register_service("state", InMemoryStateService())


async def run(handler: Callable[..., Any], text: str = "hi", **kwargs: Any) -> list[Event]:
    manager = services()
    async with manager, Runner(handler, services=manager, **kwargs) as runner:
        return [e async for e in runner.stream_query(request(text))]


def shape(events: list[Event]) -> list[str]:
    return [f"{e.object}:{'delta' if getattr(e, 'delta', False) else e.status}" for e in events]


def texts(response: Event) -> list[str | None]:
    assert isinstance(response, AgentResponse)
    return [m.get_text_content() for m in response.output or []]


async def test_text_pieces_stream_as_one_assistant_message() -> None:
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[str]:
        yield "Hello, "
        yield "world"

    events = await run(handler)
    assert shape(events) == [
        "response:created",
        "response:in_progress",
        "message:in_progress",
        "content:delta",
        "content:delta",
        "content:completed",
        "message:completed",
        "response:completed",
    ]
    assert [e.sequence_number for e in events] == list(range(8))
    assert texts(events[-1]) == ["Hello, world"]


async def test_each_text_delta_is_the_model_validation_would_give_and_its_own() -> None:
    class Piece(str):
        pass

    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[str]:
        yield "plain "
        yield Piece("a str subclass ")
        yield "\u00e9\U0001f642\x00\n\u2028"

    events = await run(handler)
    deltas = [e for e in events if isinstance(e, TextContent) and e.delta]
    assert [d.text for d in deltas] == ["plain ", "a str subclass ", "\u00e9\U0001f642\x00\n\u2028"]
    for delta in deltas:
        validated = TextContent.model_validate(
            {name: getattr(delta, name) for name in delta.model_fields_set}
        )
        assert delta == validated
        assert delta.model_fields_set == validated.model_fields_set
        assert delta.model_dump_json() == validated.model_dump_json()
        assert type(delta.text) is str  # as validation gives it: not the subclass
    # Each delta holds fields of its own: changing one changes no other, nor the next run's.
    deltas[0].text, deltas[0].index = "changed", 7
    assert (deltas[1].text, deltas[1].index) == ("a str subclass ", 0)
    again = [e for e in await run(handler) if isinstance(e, TextContent) and e.delta]
    assert [(d.text, d.index) for d in again] == [(d.text, 0) for d in again]
    assert again[0].text == "plain "


async def test_text_that_is_not_valid_unicode_is_streamed_and_kept_with_replacements() -> None:
    # What JSON's \\u escapes give for a model's emoji cut in two: lone surrogates, which
    # UTF-8 cannot carry. Each becomes U+FFFD (a first half once the text ends without its
    # second, in a delta of its own); a pair sent in one piece joins.
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[Any]:
        yield "cut \ude42"
        yield " whole \ud83d\ude42"
        yield TextContent(text=" part \udfff", delta=True)
        yield " end \ud83d"

    manager = services()
    async with manager, Runner(handler, services=manager) as runner:
        events = [e async for e in runner.stream_query(request("go"))]
        session = await runner.session_history_service.get_session("u1", "s1")
        assert runner.memory_service is not None
        memories = await runner.memory_service.search_memory(
            "u1", [Message(role="user", content="whole")]
        )
    assert events[-1].status == "completed"
    deltas = [e.text for e in events if isinstance(e, TextContent) and e.delta]
    assert deltas == ["cut \ufffd", " whole \U0001f642", " part \ufffd", " end ", "\ufffd"]
    reply = "cut \ufffd whole \U0001f642 part \ufffd end \ufffd"
    assert texts(events[-1]) == [reply]
    assert session is not None
    assert [m.get_text_content() for m in session.messages] == ["go", reply]
    assert reply in [m.get_text_content() for m in memories]


@pytest.mark.parametrize("stream", [True, False])
async def test_an_emoji_cut_across_two_pieces_of_text_arrives_whole(stream: bool) -> None:
    # A model's chunks may split a UTF-16 surrogate pair: its first half waits for the next.
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[Any]:
        yield "smile "
        yield "\ud83d"
        yield TextContent(text="\ude00", delta=True)
        yield " done"

    manager = services()
    async with manager, Runner(handler, services=manager) as runner:
        events = [e async for e in runner.stream_query({**request("go"), "stream": stream})]
        session = await runner.session_history_service.get_session("u1", "s1")
    deltas = [e.text for e in events if isinstance(e, TextContent) and e.delta]
    reply = "smile \U0001f600 done"
    assert "".join(d or "" for d in deltas) == reply
    assert all(deltas)
    assert texts(events[-1]) == [reply]
    assert session is not None
    assert [m.get_text_content() for m in session.messages] == ["go", reply]


async def test_yielded_messages_are_separate_messages() -> None:
    call = DataContent(data={"name": "lookup", "arguments": "{}"})

    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[Any]:
        yield "Let me look. "
        yield Message(type="function_call", role="assistant", content=[call])
        yield Message(role="assistant", content="Found it.")

    events = await run(handler)
    done = events[-1]
    assert isinstance(done, AgentResponse)
    assert [m.type for m in done.output or []] == ["message", "function_call", "message"]
    assert texts(done) == ["Let me look. ", None, "Found it."]
    function_call = (done.output or [])[1]
    assert function_call.content is not None and function_call.content[0].status == "completed"


async def test_content_deltas_and_whole_parts() -> None:
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[Any]:
        yield TextContent(text="a", delta=True)
        yield TextContent(text="b", delta=True)
        yield TextContent(text="whole part")
        yield DataContent(data={"k": 1})

    events = await run(handler)
    done = events[-1]
    assert isinstance(done, AgentResponse)
    parts = (done.output or [])[0].content or []
    assert [(p.type, getattr(p, "text", None)) for p in parts] == [
        ("text", "ab"),
        ("text", "whole part"),
        ("data", None),
    ]
    assert all(p.status == "completed" and p.delta in (None, False) for p in parts)


async def test_a_message_streamed_by_the_handler_itself_is_one_message() -> None:
    # AgentScope's protocol: yield msg.in_progress(), the deltas add_delta_content returns,
    # the part content_completed returns, then msg.completed().
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[Any]:
        msg = Message(role="assistant")
        yield msg.in_progress()
        for piece in ("Hel", "lo"):
            delta = msg.add_delta_content(new_content=TextContent(text=piece, delta=True))
            yield delta
        yield msg.content_completed(delta.index or 0)
        msg.add_content(DataContent(data={"k": 1}))
        msg.usage = {"total_tokens": 3}
        yield msg.completed()

    events = await run(handler)
    assert shape(events) == [
        "response:created",
        "response:in_progress",
        "message:in_progress",
        "content:delta",
        "content:delta",
        "content:completed",
        "content:completed",
        "message:completed",
        "response:completed",
    ]
    message_ids = {getattr(e, "id", None) for e in events if isinstance(e, Message)}
    assert len(message_ids) == 1
    done = events[-1]
    assert isinstance(done, AgentResponse) and len(done.output or []) == 1
    [message] = done.output or []
    assert message.id in message_ids and message.usage == {"total_tokens": 3}
    assert [(p.type, getattr(p, "text", None)) for p in message.content or []] == [
        ("text", "Hello"),
        ("data", None),
    ]


async def test_a_message_whose_parts_come_before_it_is_still_one_message() -> None:
    # The message is not yielded in progress first: its parts (a delta add_delta_content
    # returns, a part add_content returns) announce it, and msg.completed() ends it.
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[Any]:
        msg = Message(role="assistant")
        first = msg.add_delta_content(TextContent(text="Hel", delta=True))
        yield first
        yield msg.add_delta_content(TextContent(text="lo", delta=True, index=first.index))
        yield msg.content_completed(first.index or 0)
        yield msg.completed()
        other = Message(role="assistant")
        yield other.add_content(TextContent(text="whole"))
        yield other.completed()

    events = await run(handler)
    done = events[-1]
    assert isinstance(done, AgentResponse) and done.output is not None
    assert [m.get_text_content() for m in done.output] == ["Hello", "whole"]
    opened = [e.id for e in events if isinstance(e, Message) and e.status == "in_progress"]
    assert opened == [m.id for m in done.output]


async def test_messages_the_handler_streams_interleaved_keep_their_own_parts() -> None:
    # AgentScope's protocol lets two messages stream at once (two sub-agents answering):
    # each delta names its message, and lands in it.
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[Any]:
        a, b = Message(role="assistant"), Message(role="assistant")
        yield a.in_progress()
        yield a.add_delta_content(new_content=TextContent(text="A1 ", delta=True))
        yield b.in_progress()
        yield b.add_delta_content(new_content=TextContent(text="B1 ", delta=True))
        yield a.add_delta_content(new_content=TextContent(text="A2", delta=True))
        yield b.completed()
        yield a.completed()

    manager = services()
    async with manager, Runner(handler, services=manager) as runner:
        events = [e async for e in runner.stream_query(request("go"))]
        session = await runner.session_history_service.get_session("u1", "s1")
    opened = [e.id for e in events if isinstance(e, Message) and e.status == "in_progress"]
    a, b = opened
    deltas = [(e.msg_id, e.index, e.text) for e in events if isinstance(e, TextContent) and e.delta]
    assert deltas == [(a, 0, "A1 "), (b, 0, "B1 "), (a, 0, "A2")]
    completed = [e.id for e in events if isinstance(e, Message) and e.status == "completed"]
    assert completed == [b, a]
    done = events[-1]
    assert isinstance(done, AgentResponse)
    assert [(m.id, m.get_text_content()) for m in done.output or []] == [(b, "B1 "), (a, "A1 A2")]
    assert session is not None
    assert [(m.id, m.get_text_content()) for m in session.messages[1:]] == [
        (b, "B1 "),
        (a, "A1 A2"),
    ]


async def test_an_emoji_cut_in_a_message_streamed_interleaved_with_another_arrives_whole() -> None:
    # The first half of the pair, held for the next piece of its message, was ended as
    # U+FFFD when the other message's piece came in between, and its second half after it.
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[Any]:
        a, b = Message(role="assistant"), Message(role="assistant")
        yield a.in_progress()
        yield TextContent(text="A \ud83d", delta=True, msg_id=a.id)
        yield b.in_progress()
        yield TextContent(text="B \ud83d", delta=True, msg_id=b.id)
        yield TextContent(text="\ude00 A", delta=True, msg_id=a.id)
        yield TextContent(text="\ude42 B", delta=True, msg_id=b.id)
        yield a.completed()
        yield b.completed()

    events = await run(handler)
    deltas = "".join(e.text or "" for e in events if isinstance(e, TextContent) and e.delta)
    assert "\ufffd" not in deltas
    assert texts(events[-1]) == ["A \U0001f600 A", "B \U0001f642 B"]


async def test_a_message_the_handler_leaves_open_for_another_ends_with_the_run() -> None:
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[Any]:
        a = Message(role="assistant")
        yield a.in_progress()
        yield a.add_delta_content(new_content=TextContent(text="left open", delta=True))
        yield Message(role="assistant", content="whole")

    events = await run(handler)
    completed = [e for e in events if isinstance(e, Message) and e.status == "completed"]
    assert [m.get_text_content() for m in completed] == ["whole", "left open"]
    assert texts(events[-1]) == ["whole", "left open"]
    assert [e.sequence_number for e in events] == list(range(len(events)))


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ("plain text", ["plain text"]),
        (Message(role="assistant", content="a message"), ["a message"]),
        (None, []),
    ],
)
async def test_a_coroutine_may_return_text_a_message_or_nothing(
    result: Any, expected: list[str]
) -> None:
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> Any:
        return result

    events = await run(handler)
    assert events[-1].status == "completed"
    assert texts(events[-1]) == expected


async def test_a_plain_generator_works_too() -> None:
    def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> Iterator[str]:
        yield "sync "
        yield "pieces"

    assert texts((await run(handler))[-1]) == ["sync pieces"]


class FakeMsg:
    """Duck-typed AgentScope ``Msg``: an id, a role and (cumulative) text."""

    def __init__(
        self,
        name: str,
        content: str,
        role: str,
        msg_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.id = msg_id or f"{name}-{id(self)}"
        self.name, self.content, self.role, self.metadata = name, content, role, metadata

    def get_text_content(self) -> str:
        return self.content


@pytest.fixture
def fake_agentscope(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    package = types.ModuleType("agentscope")
    message = types.ModuleType("agentscope.message")
    message.Msg = FakeMsg  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "agentscope", package)
    monkeypatch.setitem(sys.modules, "agentscope.message", message)
    adapters = "agentscope_serverless.adapters.agentscope."
    before = {name for name in sys.modules if name.startswith(adapters)}
    yield
    # The adapters imported over the stand-in go with it: later tests of this process find
    # them as they are without AgentScope (not importable).
    for name in [n for n in sys.modules if n.startswith(adapters) and n not in before]:
        del sys.modules[name]


async def test_agentscope_pairs_stream_cumulative_text_as_suffixes(fake_agentscope: None) -> None:
    received: list[Any] = []

    async def handler(self: Runner, msgs: list[Any], **kwargs: Any) -> AsyncIterator[Any]:
        received.extend(msgs)
        yield FakeMsg("friday", "Hel", "assistant", "m1"), False
        yield FakeMsg("friday", "Hello", "assistant", "m1"), False
        yield FakeMsg("friday", "Hello there", "assistant", "m1"), True
        yield FakeMsg("friday", "Second", "assistant", "m2"), True

    events = await run(handler, "hi agentscope", framework="agentscope")
    assert isinstance(received[0], FakeMsg)
    assert (received[0].role, received[0].content) == ("user", "hi agentscope")
    deltas = [e.text for e in events if isinstance(e, TextContent) and e.delta]
    assert deltas == ["Hel", "lo", " there", "Second"]
    assert texts(events[-1]) == ["Hello there", "Second"]
    assert shape(events).count("message:completed") == 2


async def test_agentscope_pairs_join_an_emoji_cut_across_two_snapshots(
    fake_agentscope: None,
) -> None:
    async def handler(self: Runner, msgs: list[Any], **kwargs: Any) -> AsyncIterator[Any]:
        yield FakeMsg("friday", "smile \ud83d", "assistant", "m1"), False
        yield FakeMsg("friday", "smile \ud83d\ude00 done", "assistant", "m1"), True

    events = await run(handler, framework="agentscope")
    deltas = [e.text for e in events if isinstance(e, TextContent) and e.delta]
    assert deltas == ["smile ", "\U0001f600 done"]
    assert texts(events[-1]) == ["smile \U0001f600 done"]


async def test_agentscope_media_blocks_are_whole_parts_of_their_message_sent_once(
    fake_agentscope: None,
) -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/c.png"}}
    wav = {"type": "base64", "media_type": "audio/wav", "data": "UklGRg=="}
    audio = {"type": "audio", "source": wav}
    text = {"type": "text", "text": "see"}
    snapshots = [
        [{"type": "text", "text": "se"}],
        [text, image],
        [text, image],
        [text, image, audio],
    ]

    async def handler(self: Runner, msgs: list[Any], **kwargs: Any) -> AsyncIterator[Any]:
        for number, blocks in enumerate(snapshots, 1):
            msg = FakeMsg("friday", "", "assistant", "m1")
            msg.content = blocks  # type: ignore[assignment]
            yield msg, number == len(snapshots)

    manager = services()
    async with manager, Runner(handler, services=manager, framework="agentscope") as runner:
        events = [e async for e in runner.stream_query(request("show me"))]
        session = await runner.session_history_service.get_session("u1", "s1")
    done = events[-1]
    assert isinstance(done, AgentResponse)
    [message] = done.output or []
    parts = [p.model_dump(exclude_none=True) for p in message.content or []]
    assert [(p["type"], p["index"], p["status"]) for p in parts] == [
        ("text", 0, "completed"),
        ("image", 1, "completed"),
        ("audio", 2, "completed"),
    ]
    assert (parts[0]["text"], parts[1]["image_url"]) == ("see", "https://example.com/c.png")
    assert (parts[2]["data"], parts[2]["format"]) == ("UklGRg==", "wav")
    # Streamed as they were kept, each once, whole, in the message they belong to.
    whole = [e for e in events if isinstance(e, Content) and not e.delta]
    assert [e.model_dump(exclude_none=True) for e in whole] == parts
    assert {e.msg_id for e in whole} == {message.id}
    assert session is not None
    assert [p.model_dump(exclude_none=True) for p in session.messages[1].content or []] == parts


async def test_agentscope_without_the_package_fails_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "agentscope", None)

    async def handler(self: Runner, msgs: list[Any], **kwargs: Any) -> str:
        return ""

    with pytest.raises(ConfigurationError, match=r"pip install .*framework=.text."):
        await Runner(handler, framework="agentscope", services=services()).start()


async def test_agentscope_of_another_major_version_fails_at_start_saying_which_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # agentscope 2 (what `pip install agentscope` gave) started, then failed every run: its
    # Msg takes no text content, and its memory module is gone.
    agentscope = types.ModuleType("agentscope")
    agentscope.__version__ = "2.0.11"  # type: ignore[attr-defined]
    message = types.ModuleType("agentscope.message")
    message.Msg = type("Msg", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "agentscope", agentscope)
    monkeypatch.setitem(sys.modules, "agentscope.message", message)

    async def handler(self: Runner, msgs: list[Any], **kwargs: Any) -> str:
        return ""

    said = "agentscope 2.0.11 is installed; framework='agentscope' needs agentscope 1.x"
    with pytest.raises(ConfigurationError, match=re.escape(said)) as refused:
        await Runner(handler, framework="agentscope", services=services()).start()
    assert "pip install 'agentscope>=1.0,<2'" in refused.value.message


async def test_the_handler_gets_the_session_history_and_matching_memories() -> None:
    seen: list[tuple[list[str | None], list[str | None]]] = []

    async def handler(
        self: Runner,
        msgs: list[Message],
        request: Any = None,
        *,
        session: Session,
        memories: list[Message],
        response: AgentResponse,
        **kwargs: Any,
    ) -> str:
        history = [m.get_text_content() for m in session.messages if isinstance(m, Message)]
        seen.append((history, [m.get_text_content() for m in memories]))
        response.usage = {"total_tokens": 3}
        return f"reply to {msgs[-1].get_text_content()}"

    manager = services()
    async with manager, Runner(handler, services=manager) as runner:
        await runner.query(request("I like green tea", session_id="a"))
        done = await runner.query(request("which tea do I like", session_id="b"))
    assert seen[0] == ([], [])
    assert seen[1][0] == []
    assert seen[1][1][0] == "I like green tea"
    assert done.usage == {"total_tokens": 3}


async def test_without_a_memory_service_memories_are_empty() -> None:
    got: list[Any] = []

    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> str:
        got.append(kwargs["memories"])
        return "ok"

    manager = services(memory=False)
    async with manager, Runner(handler, services=manager) as runner:
        await runner.query(request("tea"))
        await runner.query(request("tea"))
        assert runner.memory_service is None
    assert got == [[], []]


async def test_history_and_memory_get_the_input_and_the_reply() -> None:
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> str:
        return "noted"

    manager = services()
    async with manager, Runner(handler, services=manager) as runner:
        await runner.query(request("remember the kiwi"))
        session = await runner.session_history_service.get_session("u1", "s1")
        assert runner.memory_service is not None
        memories = await runner.memory_service.list_memory("u1")
    assert session is not None
    assert [m.get_text_content() for m in session.messages if isinstance(m, Message)] == [
        "remember the kiwi",
        "noted",
    ]
    assert [m.get_text_content() for m in memories] == ["remember the kiwi", "noted"]


async def test_memory_gets_each_message_once_however_often_it_is_sent() -> None:
    # A client resending its conversation with its messages' ids, and a retry of a failed
    # run's input: memory got every earlier message again at each turn.
    calls = 0

    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("the model timed out")
        return f"reply {calls}"

    conversation: list[dict[str, Any]] = []
    manager = services()
    async with manager, Runner(handler, services=manager) as runner:
        for text in ("oolong", "oolong", "sencha", "matcha"):  # the first try fails
            if not conversation or conversation[-1]["role"] == "assistant":
                conversation.append({"id": f"m-{text}", "role": "user", "content": text})
            final = await runner.query({**request(text), "input": conversation})
            if final.status == "completed":
                reply = final.output[-1]
                conversation.append(
                    {"id": reply.id, "role": "assistant", "content": reply.get_text_content()}
                )
        session = await runner.session_history_service.get_session("u1", "s1")
        assert runner.memory_service is not None
        memories = await runner.memory_service.list_memory("u1", {"page_size": 100})
    assert session is not None
    stored = [m.get_text_content() for m in session.messages]
    assert stored == ["oolong", "reply 2", "sencha", "reply 3", "matcha", "reply 4"]
    assert [m.get_text_content() for m in memories] == stored


@pytest.mark.parametrize("recorded", [False, True], ids=["plain", "recorded run"])
async def test_a_turn_is_checked_and_encoded_once_for_history_and_memory(
    recorded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded: list[str | None] = []
    check = validation._encoded

    def counted(item: Any, position: int | None) -> tuple[Message, str]:
        message, raw = check(item, position)
        encoded.append(message.get_text_content())
        return message, raw

    monkeypatch.setattr(validation, "_encoded", counted)

    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> str:
        return "noted"

    manager, runs = services(), InMemoryRunsService()
    async with manager, runs, Runner(handler, services=manager) as runner:
        if recorded:
            run = await RunRecorder(runs).start(runner.stream_query(request("kiwi")), user_id="u1")
            await run.final()
        else:
            await runner.query(request("kiwi"))
        session = await runner.session_history_service.get_session("u1", "s1")
        assert runner.memory_service is not None
        memories = await runner.memory_service.list_memory("u1")
    # Once each, for both stores (each encoded its own copy before).
    assert encoded == ["kiwi", "noted"]
    assert session is not None
    assert [m.get_text_content() for m in session.messages] == ["kiwi", "noted"]
    assert [m.get_text_content() for m in memories] == ["kiwi", "noted"]


@pytest.mark.parametrize("outcome", ["completed", "failed"])
async def test_input_for_the_turn_alone_reaches_the_handler_and_is_not_stored(
    outcome: str,
) -> None:
    seen: list[list[str | None]] = []

    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> str:
        seen.append([m.get_text_content() for m in msgs])
        if outcome == "failed":
            raise RuntimeError("no")
        return "noted"

    body = request("remember the kiwi")
    body["input"].insert(
        0, {"role": "system", "content": "be brief", "metadata": {"turn_only": True}}
    )
    # Only exactly true marks a message: anything else is an ordinary one.
    body["input"].insert(1, {"role": "system", "content": "kept", "metadata": {"turn_only": 1}})
    manager = services()
    async with manager, Runner(handler, services=manager) as runner:
        await runner.query(body)
        session = await runner.session_history_service.get_session("u1", "s1")
        assert runner.memory_service is not None
        memories = await runner.memory_service.list_memory("u1")
    assert seen == [["be brief", "kept", "remember the kiwi"]]
    assert session is not None
    reply = ["noted"] if outcome == "completed" else []
    stored = [m.get_text_content() for m in session.messages if isinstance(m, Message)]
    assert stored == ["kept", "remember the kiwi", *reply]
    assert [m.get_text_content() for m in memories] == ["kept", "remember the kiwi", *reply]


async def test_an_agent_exception_fails_the_run_with_its_text_less_secrets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Made when the test runs: a traceback's source lines would quote literals.
    secrets = ["sk-" + "secret", "sk-" + "\\" + "quoted"]

    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[str]:
        yield "half an answer"
        raise ValueError(f'token {secrets[0]} rejected, and "{secrets[1]}" too')

    manager = services()
    level = logger.level
    logger.setLevel("ERROR")  # the tests log nothing below CRITICAL
    try:
        async with manager, Runner(handler, services=manager, secrets=secrets) as runner:
            events = [e async for e in runner.stream_query(request("go"))]
            session = await runner.session_history_service.get_session("u1", "s1")
    finally:
        logger.setLevel(level)
    # The log line of the failure, its traceback included, names none of them either: the
    # client's error hid the key while the log quoted it.
    logged = capsys.readouterr().out
    assert "the agent failed" in logged and "ValueError" in logged
    assert "sk-secret" not in logged and "quoted" not in logged, logged
    failed = events[-1]
    assert isinstance(failed, AgentResponse) and failed.status == "failed"
    assert failed.error is not None
    assert failed.error.code == "AGENT_UNKNOWN_ERROR"
    assert failed.error.message == (
        'Unknown agent error: ValueError: token *** rejected, and "***" too'
    )
    assert failed.completed_at is None
    assert session is not None
    assert [m.get_text_content() for m in session.messages if isinstance(m, Message)] == ["go"]


async def test_an_agent_failing_with_a_cancellation_of_its_own_fails_its_run() -> None:
    # A step it awaited was cancelled apart from it: the run ended "canceled", as if its
    # client had stopped it (a chat completion answered RUN_CANCELED, not to be retried).
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[str]:
        yield "half an answer"
        step = asyncio.ensure_future(asyncio.sleep(10))
        step.cancel()
        await asyncio.gather(step)

    events = await run(handler)
    failed = events[-1]
    assert isinstance(failed, AgentResponse) and failed.status == "failed"
    assert failed.error is not None
    assert failed.error.message == "Unknown agent error: CancelledError: "


class _OwnBaseException(BaseException):
    """An exception of a library's own that is no ``Exception``."""


@pytest.mark.parametrize(
    "raised",
    [KeyboardInterrupt("stop"), GeneratorExit("closed"), _OwnBaseException("its own")],
    ids=lambda raised: type(raised).__name__,
)
@pytest.mark.parametrize("plain", [False, True], ids=["async", "plain"])
async def test_an_agent_raising_what_is_no_exception_fails_its_run(
    raised: BaseException, plain: bool
) -> None:
    # A KeyboardInterrupt left the run, and ended the server serving it; the others ended
    # the run with no end of its own.
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[str]:
        yield "half an answer"
        raise raised

    def plain_handler(self: Runner, msgs: list[Message], **kwargs: Any) -> Iterator[str]:
        yield "half an answer"
        raise raised

    try:
        events = await run(plain_handler if plain else handler)
    except BaseException as exc:
        pytest.fail(f"the run raised {exc!r}")
    failed = events[-1]
    assert isinstance(failed, AgentResponse) and failed.status == "failed"
    assert failed.error is not None and failed.error.code == "AGENT_UNKNOWN_ERROR"
    assert failed.error.message == f"Unknown agent error: {type(raised).__name__}: {raised}"


async def test_a_project_error_keeps_its_code() -> None:
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> str:
        raise StoreUnavailableError("dynamodb", "throttled")

    events = await run(handler)
    error = events[-1].error
    assert error is not None
    assert (error.code, error.message) == (
        "STORE_UNAVAILABLE",
        "dynamodb is unavailable: throttled",
    )


async def test_an_unsupported_value_fails_the_run_saying_what_a_handler_gives() -> None:
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[Any]:
        yield {"text": "an OpenAI-style dict"}

    error = (await run(handler))[-1].error
    assert error is not None and error.code == "AGENT_ERROR"
    assert error.message == (
        "the agent produced a value of unsupported type dict: a handler yields (or returns) "
        "text, Messages or content (TextContent...), or AgentScope (msg, last) pairs"
    )


async def test_a_pair_of_text_and_a_flag_fails_the_run_naming_its_types() -> None:
    # Taken for an AgentScope (msg, last) pair: the run completed with no output.
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[Any]:
        yield ("Hello ", False)
        yield ("world", True)

    error = (await run(handler))[-1].error
    assert error is not None and error.code == "AGENT_ERROR"
    assert error.message.startswith("the agent produced a value of unsupported type (str, bool): ")


@pytest.mark.usefixtures("warnings_logged")
async def test_a_handler_giving_nothing_completes_and_warns_naming_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> None:
        msgs[-1].get_text_content()  # the reply made, and not returned

    final = (await run(handler))[-1]
    assert isinstance(final, AgentResponse) and final.status == "completed" and not final.output
    warned = [
        json.loads(line) for line in capsys.readouterr().out.splitlines() if '"WARNING"' in line
    ]
    assert [line["message"] for line in warned] == [
        f"the query handler {__name__}.{handler.__qualname__} yielded or returned nothing: "
        "the reply is empty (said once; next times at DEBUG)"
    ]


@pytest.mark.usefixtures("warnings_logged")
async def test_empty_replies_warn_once(capsys: pytest.CaptureFixture[str]) -> None:
    # Every empty reply was a WARNING: an agent meaning some filled the log with them.
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> None:
        return None

    manager = services()
    async with manager, Runner(handler, services=manager) as runner:
        for _ in range(3):
            events = [event async for event in runner.stream_query(request("hi"))]
            assert events[-1].status == "completed"
    warned = [line for line in capsys.readouterr().out.splitlines() if '"WARNING"' in line]
    assert len(warned) == 1 and "yielded or returned nothing" in warned[0]


async def test_a_message_made_invalid_by_assignment_fails_the_run_naming_it() -> None:
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[Message]:
        message = Message(role="assistant", content=[TextContent(text="hi")])
        message.role = "bot"  # not validated on assignment
        yield message

    error = (await run(handler))[-1].error
    assert error is not None and error.code == "AGENT_ERROR"
    assert error.message == (
        "the Message the agent yielded is not valid: role: Input should be 'assistant', "
        "'system', 'user' or 'tool'"
    )


@pytest.mark.usefixtures("warnings_logged")
async def test_a_message_made_invalid_is_logged_naming_where_the_handler_yielded_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[Message]:
        message = Message(role="assistant", content=[TextContent(text="hi")])
        message.role = "bot"  # not validated on assignment
        yield message

    def plain(self: Runner, msgs: list[Message], **kwargs: Any) -> Iterator[tuple[str, str]]:
        yield ("not", "supported")

    for function, offset in ((handler, 3), (plain, 0)):
        assert (await run(function))[-1].status == "failed"
        logged = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        failed = next(entry for entry in logged if entry["message"] == "the agent failed")
        # The traceback's frames were the runtime's alone.
        code = function.__code__
        assert (
            failed["exception"]
            .rstrip()
            .endswith(
                f"given by the query handler {__name__}.{function.__qualname__} at "
                f"{code.co_filename}:{code.co_firstlineno + offset}"
            )
        )


async def test_a_run_abandoned_midway_keeps_the_input_and_the_partial_reply() -> None:
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[str]:
        yield "first"
        await asyncio.sleep(10)
        yield "never"

    manager = services()
    async with manager, Runner(handler, services=manager) as runner:
        events = runner.stream_query(request("abandon"))
        async for event in events:
            if isinstance(event, TextContent):
                break
        await events.aclose()
        session = await runner.session_history_service.get_session("u1", "s1")
    assert session is not None
    kept = [m.get_text_content() for m in session.messages if isinstance(m, Message)]
    assert kept == ["abandon", "first"]


async def test_a_session_id_and_user_default_sensibly() -> None:
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> str:
        return kwargs["session"].user_id

    manager = services()
    async with manager, Runner(handler, services=manager) as runner:
        done = await runner.query({"input": [{"role": "user", "content": "hi"}]})
        named = await runner.query({"input": [{"role": "user", "content": "hi"}]}, user_id="zed")
    assert done.session_id and texts(done) == [done.session_id]
    assert texts(named) == ["zed"]


async def test_a_session_id_given_by_keyword_names_the_session() -> None:
    # A handler taking no **kwargs, as AgentScope's examples write them.
    async def handler(self: Runner, msgs: list[Message], request: AgentRequest) -> str:
        return f"{request.user_id} {request.session_id}"

    manager = services()
    async with manager, Runner(handler, services=manager) as runner:
        # It went to the handler: "got an unexpected keyword argument 'session_id'", or
        # Runner.query refused it with a TypeError.
        queried = await runner.query({"input": [{"role": "user", "content": "hi"}]}, session_id="k")
        streamed = [
            event
            async for event in runner.stream_query(
                {"input": [{"role": "user", "content": "hi"}]}, user_id="zed", session_id="j"
            )
        ]
        session = await runner.session_history_service.get_session("zed", "j")
    assert texts(queried) == ["k k"]
    assert texts(streamed[-1]) == ["zed j"]
    assert session is not None and len(session.messages) == 2


async def test_the_runner_must_be_started_and_requests_valid() -> None:
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> str:
        return "ok"

    runner = Runner(handler, services=services())
    with pytest.raises(ServiceNotStartedError):
        await runner.query(request("hi"))
    async with runner:
        with pytest.raises(InvalidInputError) as bad:
            await runner.query({"session_id": "s"})
    assert bad.value.errors[0]["loc"] == ["input"]


async def test_init_and_shutdown_handlers_run_and_owned_services_are_built() -> None:
    calls: list[str] = []

    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> str:
        return "ok"

    runner = Runner(
        handler,
        init_handler=lambda self: calls.append("init"),
        shutdown_handler=lambda self: calls.append("shutdown"),
    )
    async with runner:
        assert calls == ["init"]
        assert runner.state_service is not None
        assert (await runner.query(request("hi"))).status == "completed"
    assert calls == ["init", "shutdown"]


async def test_a_shutdown_handler_that_hangs_is_cut_off_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # It was awaited without limit: a stopped server waited for it as long as it hung.
    monkeypatch.setattr(runner_module, "SHUTDOWN_HANDLER_SECONDS", 0.2)

    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> str:
        return "ok"

    async def close_connections(self: Runner) -> None:
        await asyncio.sleep(60)

    runner = Runner(handler, shutdown_handler=close_connections)
    level = logger.level
    logger.setLevel("WARNING")
    try:
        await runner.start()
        await asyncio.wait_for(runner.stop(), 5)
    finally:
        logger.setLevel(level)
    logged = capsys.readouterr().out
    assert "WARNING" in logged and "close_connections() did not end within 0.2 s" in logged


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(ValueError, match="framework"):
        Runner(framework="langgraph")
    with pytest.raises(ConfigurationError, match="session_history"):
        Runner(services=ServiceManager())


@pytest.mark.parametrize("top_k", [0, -1, 1001, True, "5"])
def test_a_number_of_memories_a_search_cannot_take_is_refused_as_the_runner_is_built(
    top_k: Any,
) -> None:
    # Taken, every run failed at its memory search, answered over HTTP as the client's 422.
    said = f"memory_top_k must be an integer from 1 to 1000 (as AGENT_MEMORY_TOP_K), got {top_k!r}"
    with pytest.raises(ConfigurationError, match=re.escape(said)):
        Runner(services=services(), memory_top_k=top_k)
    with pytest.raises(ConfigurationError, match=re.escape(said)):
        Runner().use_settings(load_settings(), memory_top_k=top_k)
    with pytest.raises(ConfigurationError, match=re.escape(said)):
        AgentApp().create_runner(services(), settings=load_settings(), memory_top_k=top_k)


@pytest.mark.parametrize("top_k", [1, 1000])
async def test_the_runner_recalls_as_many_memories_as_it_is_given(
    redis_server: RedisServer, user_id: str, top_k: int
) -> None:
    recalled: list[int] = []

    async def handler(self: Runner, msgs: Any, memories: list[Message], **kwargs: Any) -> str:
        recalled.append(len(memories))
        return "noted"

    memory = RedisMemoryService(redis_url=redis_server.url)
    manager = (
        ServiceManager()
        .register_service("session_history", InMemorySessionHistoryService())
        .register_service("memory", memory)
    )
    async with manager, Runner(handler, services=manager, memory_top_k=top_k) as runner:
        for text in ("green tea", "black tea", "which tea"):
            await runner.query(request(text, user_id=user_id))
    assert recalled == [0, 1, min(top_k, 2)]


async def test_an_agent_storing_its_own_turn_is_not_stored_twice() -> None:
    # An agent written for AgentScope Runtime keeps its turn itself (its runner stores
    # nothing): each turn was stored twice, and the agent saw its history doubled.
    seen: list[int] = []

    async def handler(self: Runner, msgs: Any, session: Session, **kwargs: Any) -> Any:
        history = self.session_history_service
        await history.append_message(session, msgs)
        stored = await history.get_session(session.user_id, session.id)
        assert stored is not None
        seen.append(len(stored.messages))
        reply = Message(role="assistant", content=f"seen {seen[-1]}")
        await history.append_message(session, reply)
        await self.memory_service.add_memory(session.user_id, msgs, session_id=session.id)
        yield reply

    manager = services()
    async with manager, Runner(handler, services=manager) as runner:
        for text in ("one", "two"):
            events = [e async for e in runner.stream_query(request(text))]
            assert events[-1].status == "completed"
        stored = await runner.session_history_service.get_session("u1", "s1")
        memories = await runner.memory_service.list_memory("u1")
    assert seen == [1, 3]
    assert stored is not None and len(stored.messages) == 4
    assert [m.get_text_content() for m in memories] == ["one", "two"]


async def test_a_failing_agent_that_stored_its_input_keeps_it_once() -> None:
    async def handler(self: Runner, msgs: Any, session: Session, **kwargs: Any) -> Any:
        await self.session_history_service.append_message(session, msgs)
        raise RuntimeError("the model is down")
        yield  # an async generator

    manager = services()
    async with manager, Runner(handler, services=manager) as runner:
        events = [e async for e in runner.stream_query(request("hello"))]
        stored = await runner.session_history_service.get_session("u1", "s1")
        memories = await runner.memory_service.list_memory("u1")
    assert events[-1].status == "failed"
    assert stored is not None and [m.get_text_content() for m in stored.messages] == ["hello"]
    # It left memory to the runner: the input is remembered, as for any failed run.
    assert [m.get_text_content() for m in memories] == ["hello"]


async def test_an_agent_writing_another_session_still_has_its_turn_stored() -> None:
    async def handler(self: Runner, msgs: Any, session: Session, **kwargs: Any) -> Any:
        notes = Session(id="notes", user_id=session.user_id)
        await self.session_history_service.append_message(notes, msgs)
        yield "noted"

    manager = services()
    async with manager, Runner(handler, services=manager) as runner:
        [e async for e in runner.stream_query(request("remember this"))]
        turn = await runner.session_history_service.get_session("u1", "s1")
        notes = await runner.session_history_service.get_session("u1", "notes")
    assert turn is not None and [m.role for m in turn.messages] == ["user", "assistant"]
    assert notes is not None and len(notes.messages) == 1


async def test_a_run_not_streamed_sends_its_pieces_of_text_as_one_delta() -> None:
    # Its client reads only the final response: a delta per piece (per token, for a model)
    # was made, encoded and stored for nobody.
    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[str]:
        yield "Hello, "
        yield "world"

    manager = services()
    async with manager, Runner(handler, services=manager) as runner:
        events = [e async for e in runner.stream_query({**request("hi"), "stream": False})]
    assert shape(events) == [
        "response:created",
        "response:in_progress",
        "message:in_progress",
        "content:delta",
        "content:completed",
        "message:completed",
        "response:completed",
    ]
    assert [e.sequence_number for e in events] == list(range(7))
    assert [e.text for e in events if isinstance(e, TextContent)] == ["Hello, world"] * 2
    assert texts(events[-1]) == ["Hello, world"]


async def test_gathered_text_is_sent_before_any_other_event_and_within_its_time() -> None:
    call = DataContent(data={"name": "lookup", "arguments": "{}"})

    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[Any]:
        yield "a"
        await asyncio.sleep(GATHERED_TEXT_SECONDS + 0.1)  # a follower sees "a" by "b"
        yield "b"
        yield "c"
        yield Message(type="function_call", role="assistant", content=[call])
        yield "d"

    manager = services()
    async with manager, Runner(handler, services=manager) as runner:
        events = [e async for e in runner.stream_query({**request("hi"), "stream": False})]
    steps = [
        e.text if isinstance(e, TextContent) and e.delta else f"{e.object}:{e.status}"
        for e in events
    ]
    assert steps[2:] == [
        "message:in_progress",
        "ab",
        "c",
        "content:completed",
        "message:completed",
        "message:in_progress",
        "content:completed",
        "message:completed",
        "message:in_progress",
        "d",
        "content:completed",
        "message:completed",
        "response:completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert texts(events[-1]) == ["abc", None, "d"]


async def test_a_run_not_streamed_canceled_keeps_the_text_gathered_so_far() -> None:
    gathered = asyncio.Event()

    async def handler(self: Runner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[str]:
        yield "one "
        yield "two "
        gathered.set()
        await asyncio.Event().wait()
        yield "never"

    manager = services()
    runs = InMemoryRunsService()
    async with manager, runs, Runner(handler, services=manager) as runner:
        run = await RunRecorder(runs).start(
            runner.stream_query({**request("go"), "stream": False}), user_id="u1"
        )
        await gathered.wait()
        run.cancel()
        final = await run.final()
        session = await runner.session_history_service.get_session("u1", "s1")
        stored = [json.loads(raw) for _, raw in await runs.read_events("u1", run.run_id)]
    assert final.status == "canceled"
    assert texts(final) == ["one two "]
    # A follower of the run saw the text too, as the run's client would have, streamed.
    assert [e["text"] for e in stored if e.get("delta")] == ["one two "]
    assert stored[-1]["status"] == "canceled"
    assert session is not None
    assert [m.get_text_content() for m in session.messages] == ["go", "one two "]
