"""Messages read again are built from what was kept of them, and still belong to each read."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentscope_serverless.schemas.agent_schemas import (
    DataContent,
    ImageContent,
    Message,
    TextContent,
)
from agentscope_serverless.services import _stored
from agentscope_serverless.services._stored import decode_messages, encode_message, stored_session


@pytest.fixture(autouse=True)
def nothing_kept() -> None:
    _stored._KNOWN.clear()
    _stored._known_length = 0


def text_message(text: str, **fields: Any) -> Message:
    return Message(role="user", content=[TextContent(text=text)], **fields)


def no_parsing(raws: Any) -> list[Any]:
    raise AssertionError("a message read again was parsed again")


def test_a_message_read_again_is_built_without_parsing_and_equals_the_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    messages = [text_message("hi"), Message(role="assistant", content=None)]
    raws = [encode_message(m) for m in messages]
    first = decode_messages(raws, keep=True)
    monkeypatch.setattr(_stored, "_parse", no_parsing)
    again = decode_messages(raws, keep=True)
    assert again == first == messages
    # The same fields, in the same order, as a model made the usual way.
    assert [list(dict(m)) for m in again] == [list(dict(m)) for m in messages]
    assert again[0].model_fields_set == first[0].model_fields_set


def test_changing_a_message_read_changes_no_later_read() -> None:
    raw = encode_message(text_message("hi"))
    first = decode_messages([raw], keep=True)[0]
    assert first.content is not None
    first.content[0].text = "changed"  # type: ignore[union-attr]
    first.content.append(TextContent(text="more"))
    first.role = "assistant"
    first.model_fields_set.clear()
    first.content[0].model_fields_set.clear()
    again = decode_messages([raw], keep=True)[0]
    assert again.get_text_content() == "hi"
    assert again.role == "user"
    assert again.model_fields_set == set(Message.model_fields)
    assert again.content[0].model_fields_set == set(TextContent.model_fields)  # type: ignore[index]
    assert again.content is not None and len(again.content) == 1
    assert again.content[0] is not first.content[0]


@pytest.mark.parametrize(
    "message",
    [
        text_message("hi", metadata={"tags": ["a"]}),
        Message(role="assistant", content=[DataContent(data={"call": {"args": [1]}})]),
        Message(role="assistant", usage={"input_tokens": 3}),
    ],
    ids=["metadata", "data part", "usage"],
)
def test_a_message_holding_mutable_values_is_decoded_anew_each_time(message: Message) -> None:
    raw = encode_message(message)
    first = decode_messages([raw], keep=True)[0]
    assert raw not in _stored._KNOWN
    before = first.model_dump()

    def mutate(model: Any) -> None:
        """Change every dict and list ``model`` holds, and those inside them."""
        for name in type(model).model_fields:
            value = getattr(model, name)
            if isinstance(value, dict):
                value["injected"] = True
                for inner in value.values():
                    if isinstance(inner, list):
                        inner.append("injected")
                    elif isinstance(inner, dict):
                        inner.clear()
            elif isinstance(value, list):
                for item in value:
                    mutate(item)

    mutate(first)
    again = decode_messages([raw], keep=True)[0]
    assert again == message
    assert again.model_dump() == before


def test_what_is_kept_is_bounded_and_the_oldest_goes_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_stored, "KNOWN_MESSAGES", 10)
    raws = [encode_message(text_message(f"m{i}")) for i in range(25)]
    for raw in raws:
        decode_messages([raw], keep=True)
    assert len(_stored._KNOWN) == 10
    assert list(_stored._KNOWN) == raws[-10:]
    assert [m.get_text_content() for m in decode_messages(raws, keep=True)] == [
        f"m{i}" for i in range(25)
    ]


def test_what_is_kept_is_bounded_by_length_too_and_long_messages_are_not_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 2,048 messages of 1 MB each were kept (and their parsed fields): 4 GB of a warm
    # process's memory for one user's long messages.
    monkeypatch.setattr(_stored, "KNOWN_LENGTH", 1000)
    monkeypatch.setattr(_stored, "KNOWN_MESSAGE_LENGTH", 500)
    raws = [encode_message(text_message(f"{i:02}" + "x" * 100)) for i in range(20)]
    for raw in raws:
        decode_messages([raw], keep=True)
    kept = list(_stored._KNOWN)
    assert kept == raws[-len(kept) :] and sum(map(len, kept)) <= 1000
    assert sum(map(len, kept)) + len(raws[0]) > 1000  # as many as fit
    long = encode_message(text_message("y" * 600))
    assert decode_messages([long], keep=True)[0].get_text_content() == "y" * 600
    assert long not in _stored._KNOWN and list(_stored._KNOWN) == kept
    # Read again, a kept message stays where it is, counted once.
    decode_messages(kept[:1], keep=True)
    assert list(_stored._KNOWN) == kept and _stored._known_length == sum(map(len, kept))


def test_a_batch_mixing_kept_new_and_foreign_messages_keeps_its_order() -> None:
    kept = encode_message(text_message("kept"))
    decode_messages([kept], keep=True)
    foreign = json.dumps({"role": "user", "content": [{"type": "text", "text": "by hand"}]})
    image = encode_message(Message(role="user", content=[ImageContent(image_url="https://x/y")]))
    new = encode_message(text_message("new"))
    got = decode_messages([new, kept, foreign, image, kept], keep=True)
    assert [m.get_text_content() for m in got] == ["new", "kept", "by hand", None, "kept"]
    assert isinstance(got[3].content[0], ImageContent)  # type: ignore[index]
    assert got[1] is not got[4]
    assert foreign not in _stored._KNOWN  # not written by a store: validated each time


def test_bytes_and_text_of_the_same_message_both_decode() -> None:
    message = text_message("hi")
    raw = encode_message(message)
    assert decode_messages([raw, raw], keep=True) == [message, message]
    assert decode_messages([raw.encode(), raw.encode()], keep=True) == [message, message]


def test_empty_dicts_and_lists_are_kept_and_each_read_gets_new_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What the runner stores for every reply: metadata={}.
    message = Message(role="assistant", content=[TextContent(text="hi")], metadata={})
    raw = encode_message(message)
    first = decode_messages([raw], keep=True)[0]
    monkeypatch.setattr(_stored, "_parse", no_parsing)
    second = decode_messages([raw], keep=True)[0]
    assert first.metadata is not None and first.metadata is not second.metadata
    first.metadata["injected"] = True
    assert decode_messages([raw], keep=True) == [message]


def test_only_reads_that_come_again_keep_what_they_decode() -> None:
    raws = [encode_message(text_message(f"m{i}")) for i in range(3)]
    # Search results and pages are read once: nothing of them is kept.
    assert [m.get_text_content() for m in decode_messages(raws)] == ["m0", "m1", "m2"]
    assert not _stored._KNOWN
    # A session's window is read again at the next turn.
    window = stored_session("u1", "s1", raws)
    assert [m.get_text_content() for m in window.messages] == ["m0", "m1", "m2"]  # type: ignore[union-attr]
    assert list(_stored._KNOWN) == raws
    # What a window kept serves any later read.
    assert decode_messages(raws[:1]) == window.messages[:1]
