"""CONTRACT §6: the agent protocol models and their helpers."""

from __future__ import annotations

import json
import time

import pytest
from pydantic import ValidationError

from agentscope_serverless.schemas.agent_schemas import (
    AgentRequest,
    AgentResponse,
    Content,
    ContentType,
    DataContent,
    Error,
    FunctionCall,
    ImageContent,
    Message,
    MessageType,
    Role,
    RunStatus,
    TextContent,
    Tool,
    convert_to_openai_messages,
    convert_to_openai_tools,
)
from agentscope_serverless.schemas.session import Session


def test_message_defaults_match_the_protocol() -> None:
    message = Message()
    assert message.id.startswith("msg_")
    assert message.object == "message"
    assert message.type == MessageType.MESSAGE
    assert message.status == RunStatus.Created
    assert Message().id != message.id


def test_content_is_discriminated_by_type() -> None:
    message = Message.model_validate(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hi"},
                {"type": "image", "image_url": "http://x/y.png"},
                {"type": "data", "data": {"k": 1}},
            ],
        }
    )
    assert message.content is not None
    assert [type(c) for c in message.content] == [TextContent, ImageContent, DataContent]


def test_unknown_content_type_is_rejected() -> None:
    with pytest.raises(ValidationError):
        Message.model_validate({"role": "user", "content": [{"type": "video", "url": "x"}]})


def test_unknown_role_is_rejected() -> None:
    with pytest.raises(ValidationError):
        Message(role="robot")  # type: ignore[arg-type]


def test_content_accepts_a_plain_string() -> None:
    message = Message(role=Role.USER, content="hello")  # type: ignore[arg-type]
    assert message.get_text_content() == "hello"


def test_get_text_content_returns_the_first_text_or_none() -> None:
    message = Message(
        content=[ImageContent(image_url="u"), TextContent(text="a"), TextContent(text="b")]
    )
    assert message.get_text_content() == "a"
    assert Message(content=[ImageContent(image_url="u")]).get_text_content() is None
    assert Message().get_text_content() is None
    assert message.get_image_content() == ["u"]


def test_created_at_is_set_when_the_response_is_made() -> None:
    before = int(time.time())
    response = AgentResponse()
    assert before <= response.created_at <= int(time.time())
    assert response.id is not None and response.id.startswith("response_")
    assert AgentResponse().id != response.id


def test_status_setters_return_self() -> None:
    response = AgentResponse()
    assert response.in_progress() is response
    assert response.status == RunStatus.InProgress
    response.completed()
    assert response.status == "completed"
    response.failed(Error(code="E", message="boom"))
    assert response.status == "failed"
    assert response.error == Error(code="E", message="boom")
    assert response.rejected().status == "rejected"
    assert response.canceled().status == "canceled"
    assert response.created().status == "created"


def test_event_json_includes_nulls_like_the_wire_format() -> None:
    data = json.loads(AgentResponse(session_id="s1").model_dump_json())
    assert data["object"] == "response"
    assert data["status"] == "created"
    assert data["completed_at"] is None
    assert data["output"] is None
    assert data["session_id"] == "s1"
    assert "sequence_number" in data and "error" in data


def test_add_delta_content_streams_and_accumulates_text() -> None:
    message = Message(role=Role.ASSISTANT)
    first = message.add_delta_content(TextContent(text="Hel"))
    second = message.add_delta_content(TextContent(text="lo"))
    assert first.delta is True and first.msg_id == message.id and first.index == 0
    assert isinstance(second, TextContent) and second.text == "lo" and second.index == 0
    assert message.status == RunStatus.InProgress
    assert message.get_text_content() == "Hello"
    done = message.content_completed(0)
    assert isinstance(done, TextContent)
    assert done.text == "Hello" and done.delta is None and done.status == "completed"
    assert message.content_completed(5) is None


def test_add_delta_content_starts_a_new_part_after_a_completed_one() -> None:
    message = Message(role=Role.ASSISTANT)
    message.add_delta_content(TextContent(text="one"))
    message.content_completed(0)
    delta = message.add_delta_content(TextContent(text="two"))
    assert delta.index == 1
    assert message.content is not None and len(message.content) == 2


def test_a_delta_whose_index_is_not_a_position_starts_a_new_part() -> None:
    # Before: -1 on an empty message raised IndexError (the run failed as an unknown error),
    # and on a message with parts it was folded into the last one.
    message = Message(role=Role.ASSISTANT)
    first = message.add_delta_content(TextContent(text="a", index=-1))
    second = message.add_delta_content(TextContent(text="b", index=-1))
    assert (first.index, second.index) == (0, 1)
    assert message.content is not None
    assert [part.text for part in message.content if isinstance(part, TextContent)] == ["a", "b"]


def test_add_delta_content_joins_function_call_arguments() -> None:
    message = Message(type=MessageType.FUNCTION_CALL, role=Role.ASSISTANT)
    message.add_delta_content(DataContent(data={"call_id": "c1", "name": "f", "arguments": '{"a'}))
    message.add_delta_content(DataContent(data={"arguments": '": 1}'}))
    assert message.content is not None
    part = message.content[0]
    assert isinstance(part, DataContent)
    assert part.data == {"call_id": "c1", "name": "f", "arguments": '{"a": 1}'}


def test_add_content_appends_a_completed_part() -> None:
    message = Message(role=Role.ASSISTANT)
    part = message.add_content(TextContent(text="whole"))
    assert part.status == "completed" and part.index == 0 and part.msg_id == message.id
    assert message.get_text_content() == "whole"


def test_from_openai_message_text() -> None:
    message = Message.from_openai_message({"role": "assistant", "content": "hi there"})
    assert message.role == "assistant"
    assert message.get_text_content() == "hi there"


def test_from_openai_message_parts() -> None:
    message = Message.from_openai_message(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
            ],
        }
    )
    assert message.get_text_content() == "look"
    assert message.get_image_content() == ["data:image/png;base64,AA"]


def test_from_openai_message_takes_a_protocol_message_as_it_is() -> None:
    # As AgentScope Runtime's: code normalising a mix of OpenAI messages and Messages (or
    # Messages dumped to dicts) keeps the Messages whole, their ids and parts included.
    message = Message(
        type=MessageType.FUNCTION_CALL,
        role=Role.ASSISTANT,
        content=[DataContent(data={"call_id": "c1", "name": "f", "arguments": "{}"})],
    )
    assert Message.from_openai_message(message) is message
    dumped = Message(
        role=Role.USER,
        content=[TextContent(text="look"), ImageContent(image_url="https://example.com/a.png")],
    )
    assert Message.from_openai_message(dumped.model_dump()) == dumped
    assert Message.from_openai_message(message.model_dump(mode="json")) == message


def test_files_audio_and_refusals_go_to_openai_and_back() -> None:
    message = Message.from_openai_message(
        {
            "role": "user",
            "content": [
                {"type": "file", "file": {"file_id": "file-1", "filename": "a.pdf"}},
                {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}},
                {"type": "refusal", "refusal": "no"},
            ],
        }
    )
    assert [part.type for part in message.content or []] == ["file", "audio", "refusal"]
    (converted,) = convert_to_openai_messages([message])
    assert converted["content"] == [
        {"type": "file", "file": {"file_id": "file-1", "filename": "a.pdf"}},
        {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}},
        {"type": "text", "text": "no"},
    ]


def test_from_openai_message_tool_calls_and_outputs_round_trip() -> None:
    call = Message.from_openai_message(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        }
    )
    assert call.type == MessageType.FUNCTION_CALL
    output = Message.from_openai_message({"role": "tool", "tool_call_id": "c1", "content": "42"})
    assert output.type == MessageType.FUNCTION_CALL_OUTPUT
    converted = convert_to_openai_messages([call, output])
    assert converted == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]


def test_convert_to_openai_messages_text() -> None:
    messages = [
        Message(role=Role.SYSTEM, content=[TextContent(text="be brief")]),
        Message(role=Role.USER, content=[TextContent(text="hi")]),
    ]
    assert convert_to_openai_messages(messages) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]


def test_from_chat_completion_chunk() -> None:
    text = Content.from_chat_completion_chunk({"choices": [{"delta": {"content": "Hi"}}]})
    assert isinstance(text, TextContent) and text.text == "Hi" and text.delta is True
    call = Content.from_chat_completion_chunk(
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{"}}]
                    }
                }
            ]
        }
    )
    assert isinstance(call, DataContent)
    assert FunctionCall.model_validate(call.data).name == "f"
    assert Content.from_chat_completion_chunk({"choices": []}) is None


def test_agent_request_defaults_and_extra_fields() -> None:
    request = AgentRequest.model_validate(
        {"input": [{"role": "user", "content": "hi"}], "custom": {"trace": 1}}
    )
    assert request.stream is True
    assert request.n == 1
    assert request.session_id is None
    assert request.model_extra == {"custom": {"trace": 1}}


@pytest.mark.parametrize("n", [0, 6])
def test_agent_request_bounds_n(n: int) -> None:
    with pytest.raises(ValidationError):
        AgentRequest.model_validate({"input": [], "n": n})


def test_agent_request_requires_input() -> None:
    with pytest.raises(ValidationError) as raised:
        AgentRequest.model_validate({"stream": True})
    assert raised.value.errors()[0]["loc"] == ("input",)


def test_add_new_message_replaces_by_id() -> None:
    response = AgentResponse()
    message = Message(role=Role.ASSISTANT, content=[TextContent(text="draft")])
    response.add_new_message(message)
    final = message.model_copy(update={"content": [TextContent(text="final")]})
    response.add_new_message(final)
    assert response.output is not None and len(response.output) == 1
    assert response.output[0].get_text_content() == "final"


def test_tools_convert_to_openai_tools() -> None:
    tool = Tool.model_validate(
        {"function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
    )
    assert convert_to_openai_tools([tool]) == [
        {
            "type": "function",
            "function": {"name": "f", "description": "d", "parameters": {"type": "object"}},
        }
    ]
    assert convert_to_openai_tools(None) is None


def test_session_holds_messages_and_dicts() -> None:
    session = Session(
        id="session_123",
        user_id="user_456",
        messages=[
            Message(role=Role.USER, content=[TextContent(type="text", text="Hello")]),
            Message(role=Role.ASSISTANT, content=[TextContent(type="text", text="Hi there!")]),
        ],
    )
    assert len(session.messages) == 2
    assert Session(id="a", user_id="b").messages == []


def test_constant_classes_expose_the_protocol_values() -> None:
    assert ContentType.TEXT == "text" and ContentType.IMAGE == "image"
    assert Role.TOOL == "tool"
    assert "heartbeat" in MessageType.all_values()
    assert RunStatus.Failed == "failed"
