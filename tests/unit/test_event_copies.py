"""Deep copies of events (what every service makes of every stored message)."""

from __future__ import annotations

import copy

from agentscope_serverless.schemas.agent_schemas import (
    AgentResponse,
    DataContent,
    Message,
    TextContent,
)


def sample() -> Message:
    return Message(
        role="assistant",
        content=[
            TextContent(text="hello", index=0, status="completed"),
            DataContent(data={"call": {"name": "f", "args": [1, {"x": 2}]}}),
        ],
        metadata={"tags": ["a", "b"]},
        usage={"total_tokens": 3},
    )


def test_a_deep_copy_is_equal_and_shares_nothing_mutable() -> None:
    original = sample()
    copied = original.model_copy(deep=True)
    assert copied == original and copied is not original
    assert copied.model_fields_set == original.model_fields_set
    assert copied.content is not None and original.content is not None
    text = copied.content[0]
    data = copied.content[1]
    assert isinstance(text, TextContent) and isinstance(data, DataContent)
    text.text = "changed"
    assert data.data is not None and copied.metadata is not None
    data.data["call"]["args"][1]["x"] = 99
    copied.metadata["tags"].append("c")
    assert original == sample().model_copy(update={"id": original.id})


def test_copy_deepcopy_of_containers_and_responses() -> None:
    messages = [sample(), sample()]
    copies = copy.deepcopy(messages)
    assert copies == messages and all(a is not b for a, b in zip(copies, messages, strict=True))
    response = AgentResponse(output=messages, session_id="s")
    copied = copy.deepcopy(response)
    assert copied == response and copied.output is not response.output
