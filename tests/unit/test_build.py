"""The shortest ways to build, change and serialize events (``schemas._build``) give what
pydantic's own ways give, and the SSE encoder writes each form of an event."""

from __future__ import annotations

import pytest
from pydantic_core import PydanticSerializationError

from agentscope_serverless.http.sse import encode
from agentscope_serverless.schemas._build import built, json_of, set_field
from agentscope_serverless.schemas.agent_schemas import (
    AgentResponse,
    DataContent,
    Error,
    Event,
    Message,
    TextContent,
)

HOSTILE = '"\\\x00\x1f\x7f\n\r\t\u2028\u2029\ufeff\U0001f642 é </script>'


def events() -> list[Event]:
    message = Message(role="assistant", content=[TextContent(text=HOSTILE)], metadata={"k": [1]})
    response = AgentResponse(session_id=HOSTILE, output=[message])
    return [
        TextContent(text=HOSTILE, delta=True, index=0, msg_id="m", sequence_number=3),
        DataContent(data={"args": {HOSTILE: [1.5, None, True]}}, sequence_number=2**40),
        message,
        response.completed(),
        response.failed(Error(code="AGENT_ERROR", message=HOSTILE)),
    ]


@pytest.mark.parametrize("event", events(), ids=lambda e: type(e).__name__)
def test_json_of_is_model_dump_json(event: Event) -> None:
    assert json_of(event) == event.model_dump_json()


def test_json_of_refuses_what_model_dump_json_refuses() -> None:
    lone = TextContent(text="half a pair: \ud83d")
    with pytest.raises(PydanticSerializationError):
        lone.model_dump_json()
    with pytest.raises(PydanticSerializationError):
        json_of(lone)


def test_set_field_is_assignment_without_validation() -> None:
    assigned, direct = TextContent(text="t"), TextContent(text="t")
    assigned.sequence_number = 5
    set_field(direct, "sequence_number", 5)
    assert direct == assigned
    assert direct.model_fields_set == assigned.model_fields_set == {"text", "sequence_number"}
    assert direct.model_dump(exclude_unset=True) == {"text": "t", "sequence_number": 5}


def test_built_holds_the_fields_given_as_a_validated_model_would() -> None:
    validated = TextContent(text="x", delta=True, index=1)
    fields = dict(validated.__dict__)
    copy = built(TextContent, fields, frozenset(validated.model_fields_set))
    assert copy == validated and copy.model_fields_set == validated.model_fields_set
    assert copy.__dict__ is fields
    assert built(TextContent, dict(fields)).model_fields_set == set(fields)


def test_encode_writes_the_id_and_event_lines_before_the_data() -> None:
    data = '{"a":"\u00e9"}'
    assert encode(data) == b'data: {"a":"\xc3\xa9"}\n\n'
    assert encode(data, id=0) == b'id: 0\ndata: {"a":"\xc3\xa9"}\n\n'
    assert encode(data, id=2**40) == b"id: 1099511627776\ndata: " + data.encode() + b"\n\n"
    assert encode(data, event="e") == b"event: e\ndata: " + data.encode() + b"\n\n"
    assert encode(data, event="e", id=7) == b"id: 7\nevent: e\ndata: " + data.encode() + b"\n\n"
