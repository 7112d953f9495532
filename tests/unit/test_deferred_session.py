"""A session whose messages a store decodes on first use behaves like any other session."""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

import pytest

from agentscope_serverless.schemas.agent_schemas import AgentRequest, Message, TextContent
from agentscope_serverless.schemas.pagination import Page
from agentscope_serverless.schemas.session import Session, extend_messages
from agentscope_serverless.services import _stored
from agentscope_serverless.services._stored import encode_message, stored_session

STORED = [
    encode_message(Message(id="m1", role="user", content=[TextContent(text="hi")])),
    encode_message(Message(id="m2", role="assistant", content=[TextContent(text="hello")])),
]


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many messages the stores decoded so far."""
    counts: list[int] = []
    decode = _stored.decode_messages

    def counting(raws: Any, **options: Any) -> list[Message]:
        counts.append(len(raws))
        return decode(raws, **options)

    monkeypatch.setattr(_stored, "decode_messages", counting)
    return counts


def eager() -> Session:
    return Session(id="s1", user_id="u1", messages=list(_stored.decode_messages(STORED)))


def test_nothing_is_decoded_until_the_messages_are_used(decoded: list[int]) -> None:
    session = stored_session("u1", "s1", STORED)
    assert (session.id, session.user_id) == ("s1", "u1")
    assert decoded == []
    assert [m.id for m in session.messages] == ["m1", "m2"]  # type: ignore[union-attr]
    assert len(session.messages) == 2
    assert decoded == [2]


def test_the_messages_are_a_plain_list_of_messages() -> None:
    messages = stored_session("u1", "s1", STORED).messages
    assert type(messages) is list
    assert all(type(m) is Message for m in messages)
    assert messages == eager().messages


def test_the_messages_can_be_handed_to_another_model() -> None:
    request = AgentRequest(input=stored_session("u1", "s1", STORED).messages)  # type: ignore[arg-type]
    assert [m.id for m in request.input] == ["m1", "m2"]


@pytest.mark.parametrize("mode", ["python", "json"])
def test_it_serializes_like_a_session_built_by_hand(mode: str) -> None:
    dumped = stored_session("u1", "s1", STORED).model_dump(mode=mode)  # type: ignore[arg-type]
    assert dumped == eager().model_dump(mode=mode)  # type: ignore[arg-type]
    assert json.loads(stored_session("u1", "s1", STORED).model_dump_json()) == json.loads(
        eager().model_dump_json()
    )


def test_serializing_a_list_of_sessions_serializes_their_messages() -> None:
    page = Page[Session](items=[stored_session("u1", "s1", STORED)], next_cursor=None)
    assert page.model_dump()["items"][0]["messages"] == eager().model_dump()["messages"]


def test_it_compares_and_prints_like_a_session_built_by_hand() -> None:
    assert stored_session("u1", "s1", STORED) == eager()
    assert eager() == stored_session("u1", "s1", STORED)
    assert stored_session("u1", "s1", STORED) == stored_session("u1", "s1", STORED)
    assert stored_session("u1", "s1", STORED[:1]) != eager()
    assert repr(stored_session("u1", "s1", STORED)) == repr(eager())
    assert dict(stored_session("u1", "s1", STORED)) == dict(eager())


def test_a_shallow_copy_shares_the_list_and_a_deep_copy_does_not() -> None:
    session = stored_session("u1", "s1", STORED)
    shallow = session.model_copy()
    deep = session.model_copy(deep=True)
    assert shallow.messages is session.messages
    assert deep.messages == session.messages
    assert deep.messages is not session.messages
    assert deep.messages[0] is not session.messages[0]
    assert copy.deepcopy(stored_session("u1", "s1", STORED)).messages == eager().messages


def test_it_pickles_with_its_messages() -> None:
    restored = pickle.loads(pickle.dumps(stored_session("u1", "s1", STORED)))
    assert restored == eager()
    assert type(restored.messages) is list


def test_setting_the_messages_replaces_the_deferred_ones(decoded: list[int]) -> None:
    session = stored_session("u1", "s1", STORED)
    session.messages = []
    assert session.messages == []
    assert session.model_dump()["messages"] == []
    assert decoded == []


def test_extending_the_messages_before_their_use_decodes_none(decoded: list[int]) -> None:
    session = stored_session("u1", "s1", STORED)
    shallow = session.model_copy()
    extend_messages(session, [Message(id="m3", role="user")])
    extend_messages(session, [Message(id="m4", role="assistant")])
    assert decoded == []
    assert [m.id for m in session.messages] == ["m1", "m2", "m3", "m4"]  # type: ignore[union-attr]
    assert decoded == [2]
    assert shallow.messages is session.messages  # shared, as a list would be
    extend_messages(session, [Message(id="m5", role="user")])
    assert [m.id for m in shallow.messages] == ["m1", "m2", "m3", "m4", "m5"]  # type: ignore[union-attr]


def test_extending_a_plain_session_extends_its_list() -> None:
    session = eager()
    messages = session.messages
    extend_messages(session, [Message(id="m3", role="user")])
    assert session.messages is messages
    assert [m.id for m in messages] == ["m1", "m2", "m3"]  # type: ignore[union-attr]


def test_messages_written_by_another_version_are_validated_on_use() -> None:
    by_hand = json.dumps({"id": "m1", "role": "user", "content": "typed by hand", "extra": 1})
    message = stored_session("u1", "s1", [by_hand]).messages[0]
    assert isinstance(message, Message)
    assert message == Message.model_validate_json(by_hand)
    assert message.get_text_content() == "typed by hand"


def test_the_schema_of_a_session_is_that_of_its_fields() -> None:
    schema = Session.model_json_schema(mode="serialization")
    assert schema == Session.model_json_schema(mode="validation")
    assert schema["properties"]["messages"]["type"] == "array"


def test_a_subclass_keeps_the_messages_field() -> None:
    class Tagged(Session):
        tag: str = ""

    tagged = Tagged(id="s1", user_id="u1", messages=[Message(id="m9")], tag="t")
    assert [m.id for m in tagged.messages] == ["m9"]  # type: ignore[union-attr]
    assert Tagged(id="s1", user_id="u1").messages == []
