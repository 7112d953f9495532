"""/compatible-mode/v1 as OpenAI client libraries use it: the requests LangChain
(``langchain-openai`` ChatOpenAI), LiteLLM and the ``openai`` SDK send, byte for byte as
captured from them, and the answers and errors those libraries read."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest

from agentscope_serverless.app import AgentApp
from agentscope_serverless.http import create_app
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS
from agentscope_serverless.settings import load_settings
from tests.http.conftest import scenario_app
from tests.http.test_llm_agent import (
    ANSWER,
    FOLLOW_UP,
    THINKING,
    ScriptedLLM,
    llm_agent_server,
)
from tests.support.backends import BACKENDS, backend_settings
from tests.support.http import Keys, bearer, running, stream
from tests.support.slow_agent import PIECES
from tests.support.slow_agent import app as slow_app

CHAT = "/compatible-mode/v1/chat/completions"
RESPONSES = "/compatible-mode/v1/responses"
PERSON = {
    "properties": {
        "name": {"title": "Name", "type": "string"},
        "age": {"title": "Age", "type": "integer"},
    },
    "required": ["name", "age"],
    "title": "Person",
    "type": "object",
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather.",
        "parameters": {
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "type": "object",
        },
    },
}
# What ChatOpenAI sends by default, then with the common options set; what LiteLLM sends.
LANGCHAIN_INVOKE = {
    "model": "m",
    "stream": False,
    "messages": [{"content": "be nice", "role": "system"}, {"content": "hi", "role": "user"}],
}
LANGCHAIN_OPTIONS = {
    "model": "m",
    "stream": False,
    "messages": [{"content": "hi", "role": "user"}],
    "max_completion_tokens": 10,
    "seed": 3,
    "stop": ["x"],
    "temperature": 0.1,
    "user": "alice",
}
LITELLM_OPTIONS = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "temperature": 0.2,
    "stop": ["x"],
    "max_tokens": 5,
    "seed": 1,
}
LANGCHAIN_TOOL_HISTORY = {
    "model": "m",
    "stream": False,
    "messages": [
        {"content": "weather?", "role": "user"},
        {
            "content": None,
            "role": "assistant",
            "tool_calls": [
                {
                    "type": "function",
                    "id": "call_1",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"content": "sunny", "role": "tool", "tool_call_id": "call_1"},
    ],
}
ASK = [{"content": "Alice is 30", "role": "user"}]


@pytest.fixture
def scenario(scenario_url: str, keys: Keys) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=scenario_url, headers=bearer(keys.alice), timeout=30) as client:
        yield client


@pytest.fixture
def sdk(scenario_url: str, keys: Keys) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{scenario_url}/compatible-mode/v1", api_key=keys.alice, max_retries=0
    ) as client:
        yield client


def history(client: httpx.Client, session: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.get(f"/sessions/{session}/messages").json()["items"]
    return items


def runs_of(client: httpx.Client, session: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.get("/runs", params={"session_id": session}).json()[
        "items"
    ]
    return items


@pytest.mark.parametrize(
    "body", [LANGCHAIN_INVOKE, LANGCHAIN_OPTIONS, LITELLM_OPTIONS, LANGCHAIN_TOOL_HISTORY]
)
def test_what_langchain_and_litellm_send_by_default_is_answered(
    scenario: httpx.Client, body: dict[str, Any]
) -> None:
    response = scenario.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    completion = openai.types.chat.ChatCompletion.model_validate(response.json())
    assert completion.choices[0].message.content.startswith("echo: ")  # type: ignore[union-attr]


def test_langchains_stream_with_usage_ends_with_a_usage_chunk(scenario: httpx.Client) -> None:
    body = {**LANGCHAIN_INVOKE, "stream": True, "stream_options": {"include_usage": True}}
    response, sse = stream(scenario, CHAT, json=body)
    assert response.status_code == 200
    assert sse.data[-1] == "[DONE]"
    chunks = [openai.types.chat.ChatCompletionChunk.model_validate(d) for d in sse.data[:-1]]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "echo: hi"
    assert chunks[-1].choices == [] and chunks[-2].choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        # bind_tools
        ({"tools": [WEATHER_TOOL]}, "tools"),
        # with_structured_output(method="function_calling")
        (
            {
                "parallel_tool_calls": False,
                "tool_choice": {"type": "function", "function": {"name": "Person"}},
                "tools": [WEATHER_TOOL],
            },
            "tools",
        ),
        ({"tools": [WEATHER_TOOL], "tool_choice": "required"}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"functions": [WEATHER_TOOL["function"]]}, "functions"),
        # with_structured_output() (json_schema, the default), and method="json_mode"
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": PERSON, "name": "Person", "strict": True},
                }
            },
            "response_format",
        ),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
        ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ],
)
def test_what_an_agent_cannot_give_is_a_400_naming_the_parameter(
    scenario: httpx.Client, sdk: openai.OpenAI, extra: dict[str, Any], param: str
) -> None:
    """Client tools, JSON formats, logprobs and audio were ignored: LangChain's
    with_structured_output got text it could not parse, or None, and bind_tools never a
    tool call. Refused, the SDK raises a BadRequestError naming the parameter."""
    session = f"refused-{uuid.uuid4()}"
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(
            model="m",
            messages=ASK,  # type: ignore[arg-type]
            extra_body=extra,
            extra_headers={"X-Session-Id": session},
        )
    assert (refused.value.code, refused.value.type) == (
        "UNSUPPORTED_PARAMETER",
        "invalid_request_error",
    )
    assert refused.value.param == param
    assert refused.value.message.startswith(f"Error code: 400 - {param} is not supported: ")
    assert scenario.get(f"/sessions/{session}").status_code == 404  # nothing stored


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": []},
        {"tools": [WEATHER_TOOL], "tool_choice": "none"},
        {"tool_choice": "auto"},
        {"response_format": {"type": "text"}},
        {"logprobs": False},
        {"modalities": ["text"]},
        # Options that only tune an answer, and parameters of other servers, are taken.
        {"parallel_tool_calls": False, "reasoning_effort": "low", "top_k": 3, "store": True},
    ],
)
def test_what_asks_nothing_of_an_agent_is_taken(sdk: openai.OpenAI, extra: dict[str, Any]) -> None:
    completion = sdk.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        extra_body=extra,
    )
    assert completion.choices[0].message.content == "echo: hi"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        # ChatOpenAI(use_responses_api=True).with_structured_output(Person)
        (
            {
                "text": {
                    "format": {
                        "type": "json_schema",
                        "strict": True,
                        "name": "Person",
                        "schema": PERSON,
                    }
                }
            },
            "text.format",
        ),
        ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"background": True}, "background"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        # Mutually exclusive at OpenAI; here the conversation won, unsaid.
        ({"conversation": "conv-1", "previous_response_id": "resp_1"}, "previous_response_id"),
    ],
)
def test_what_an_agent_cannot_give_in_a_response_is_a_400_naming_it(
    sdk: openai.OpenAI, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model="m", input=ASK, extra_body=extra)  # type: ignore[arg-type]
    assert refused.value.param == param


@pytest.mark.parametrize("text_format", ["json_object", ["text"], 5])
def test_a_response_format_that_is_no_object_is_a_400_naming_it(
    sdk: openai.OpenAI, text_format: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as invalid:
        sdk.responses.create(model="m", input="hi", extra_body={"text": {"format": text_format}})
    assert invalid.value.param == "text.format"


# Invalid requests, as the SDK sends them (the body the SDK would build, or bytes as given).
_INVALID_CHATS: list[tuple[dict[str, Any] | bytes, str | None]] = [
    ({"model": "m"}, "messages"),  # missing
    ({"model": "m", "messages": []}, "messages"),
    ({"model": "m", "messages": "hi"}, "messages"),  # wrong type
    ({"model": "m", "messages": ASK, "temperature": 3}, "temperature"),  # out of range
    ({"model": "m", "messages": ASK, "temperature": "hot"}, "temperature"),
    ({"model": "m", "messages": ASK, "max_tokens": 0}, "max_tokens"),
    ({"model": "m", "messages": ASK, "n": 2}, "n"),
    ({"model": "m", "messages": ASK, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"model": "m", "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    # Text that is not Unicode: a lone surrogate (the SDK cannot send one, a JSON text can).
    (
        b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
        "messages[0].content",
    ),
    (b'{"model": "m",}', "body"),  # not JSON
    (b'{"model": "m", "messages": [{"role": "user", "content": "\xff"}]}', "body"),  # not UTF-8
]


@pytest.mark.parametrize(("body", "param"), _INVALID_CHATS)
def test_an_invalid_chat_completion_is_a_400_as_openai_answers_it(
    sdk: openai.OpenAI, body: dict[str, Any] | bytes, param: str
) -> None:
    """It was a 422: the SDK raised UnprocessableEntityError, which code written against
    OpenAI (``except openai.BadRequestError``) does not catch."""
    sent = {"content": body} if isinstance(body, bytes) else {"body": body}
    with pytest.raises(openai.BadRequestError) as invalid:
        sdk.post(
            "/chat/completions",
            cast_to=httpx.Response,
            options={"headers": {"Content-Type": "application/json"}},
            **sent,  # type: ignore[arg-type]
        )
    assert invalid.value.status_code == 400
    assert (invalid.value.type, invalid.value.param) == ("invalid_request_error", param)
    assert isinstance(invalid.value.body, dict) and invalid.value.body["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        ({"model": "m", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": "hi", "top_p": 2}, "top_p"),
        ({"model": "m", "input": "hi", "text": {"format": "json_object"}}, "text.format"),
        ({"model": "m", "input": "hi", "previous_response_id": "resp_"}, "previous_response_id"),
    ],
)
def test_an_invalid_response_request_is_a_400_as_openai_answers_it(
    sdk: openai.OpenAI, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as invalid:
        sdk.post("/responses", cast_to=httpx.Response, body=body)
    assert (invalid.value.type, invalid.value.param) == ("invalid_request_error", param)


# Numbers as the SDK sends what it is given: a boolean or a numeric string is no number
# (taken for one, ``max_tokens=True`` cut the agent's reply to one token), nor a float a count.
ASKED_BY = {
    "chat": lambda sdk, **options: sdk.chat.completions.create(model="m", messages=ASK, **options),
    "responses": lambda sdk, **options: sdk.responses.create(model="m", input="hi", **options),
}


@pytest.mark.parametrize(
    ("call", "option"),
    [
        ("chat", {"max_tokens": True}),
        ("chat", {"max_tokens": "5"}),
        ("chat", {"max_tokens": 5.0}),
        ("chat", {"max_completion_tokens": "5"}),
        ("chat", {"temperature": True}),
        ("chat", {"temperature": "0.5"}),
        ("chat", {"top_p": "1"}),
        ("chat", {"seed": False}),
        ("chat", {"seed": "7"}),
        ("chat", {"n": True}),
        ("chat", {"frequency_penalty": False}),
        ("chat", {"presence_penalty": "0"}),
        ("chat", {"top_logprobs": False}),
        ("responses", {"max_output_tokens": True}),
        ("responses", {"max_output_tokens": "5"}),
        ("responses", {"temperature": "1"}),
        ("responses", {"top_p": True}),
        ("responses", {"top_logprobs": False}),
    ],
)
def test_a_number_sent_as_a_boolean_or_a_string_is_a_400_naming_it(
    sdk: openai.OpenAI, scenario: httpx.Client, call: str, option: dict[str, Any]
) -> None:
    session = f"numbers-{uuid.uuid4().hex[:8]}"
    with pytest.raises(openai.BadRequestError) as refused:
        ASKED_BY[call](sdk, extra_headers={"X-Session-Id": session}, **option)
    (param,) = option
    assert (refused.value.type, refused.value.param) == ("invalid_request_error", param)
    assert scenario.get(f"/sessions/{session}").status_code == 404


def test_an_unknown_response_or_model_and_a_wrong_key_are_the_sdks_errors(
    scenario_url: str, sdk: openai.OpenAI
) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.responses.retrieve("resp_0a_aGk")
    assert missing.value.type == "not_found_error"
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("no-such-model")
    with pytest.raises(openai.NotFoundError) as no_route:
        sdk.embeddings.create(model="m", input="hi")
    assert no_route.value.type == "not_found_error"
    with (
        openai.OpenAI(
            base_url=f"{scenario_url}/compatible-mode/v1", api_key="ask_wrong", max_retries=0
        ) as stranger,
        pytest.raises(openai.AuthenticationError) as unauthenticated,
    ):
        stranger.responses.create(model="m", input="hi")
    assert unauthenticated.value.type == "authentication_error"


def test_the_projects_own_routes_keep_their_422(scenario: httpx.Client) -> None:
    response = scenario.post("/process", json={"input": "hi"})
    assert response.status_code == 422
    assert response.json()["error"]["param"] == "input"


def test_a_body_that_is_not_json_is_a_400_saying_where(scenario: httpx.Client) -> None:
    # It said "invalid request: body.14: JSON decode error", with the param "[14]".
    response = scenario.post(
        CHAT, content=b'{"model": "m",}', headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "body"
    assert error["message"] == (
        "the body is not valid JSON: Expecting property name enclosed in double quotes at "
        "line 1, column 15 (JSON takes double quotes, and no comma after a last item)"
    )


def test_every_error_has_the_shape_the_sdk_reads(
    scenario_url: str, sdk: openai.OpenAI, keys: Keys
) -> None:
    with (
        openai.OpenAI(
            base_url=f"{scenario_url}/compatible-mode/v1", api_key="ask_wrong", max_retries=0
        ) as stranger,
        pytest.raises(openai.AuthenticationError) as unauthenticated,
    ):
        stranger.chat.completions.create(model="m", messages=ASK)  # type: ignore[arg-type]
    assert (unauthenticated.value.code, unauthenticated.value.type) == (
        "UNAUTHENTICATED",
        "authentication_error",
    )
    with pytest.raises(openai.PermissionDeniedError) as denied:
        sdk.chat.completions.create(model="m", messages=ASK, user="bob")  # type: ignore[arg-type]
    assert denied.value.type == "permission_error"
    with pytest.raises(openai.BadRequestError) as invalid:
        sdk.chat.completions.create(
            model="m",
            messages=[{"role": "robot", "content": "hi"}],  # type: ignore[list-item]
        )
    assert (invalid.value.type, invalid.value.param) == (
        "invalid_request_error",
        "messages[0].role",
    )
    with pytest.raises(openai.InternalServerError) as failed:
        sdk.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "fail"}],
        )
    assert (failed.value.code, failed.value.type) == ("AGENT_UNKNOWN_ERROR", "server_error")
    with pytest.raises(openai.APIError) as failed_stream:
        list(
            sdk.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "fail"}], stream=True
            )
        )
    assert (failed_stream.value.code, failed_stream.value.type) == (
        "AGENT_UNKNOWN_ERROR",
        "server_error",
    )


def test_a_response_repeats_its_instructions_options_and_metadata(sdk: openai.OpenAI) -> None:
    first = sdk.responses.create(
        model="m",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
        instructions="Be terse.",
        temperature=0.2,
        top_p=0.9,
        max_output_tokens=64,
        metadata={"app": "tests"},
    )
    assert (first.instructions, first.temperature, first.top_p, first.max_output_tokens) == (
        "Be terse.",
        0.2,
        0.9,
        64,
    )
    assert first.metadata == {"app": "tests", "session_id": first.metadata["session_id"]}  # type: ignore[index]
    with sdk.responses.stream(
        model="m", input="again", previous_response_id=first.id, temperature=0.5
    ) as events:
        second = events.get_final_response()
    assert (second.previous_response_id, second.temperature, second.instructions) == (
        first.id,
        0.5,
        None,
    )
    assert second.metadata == {"session_id": first.metadata["session_id"]}  # type: ignore[index]


def test_typed_message_items_and_a_replayed_output_are_taken_as_input(
    sdk: openai.OpenAI, scenario: httpx.Client
) -> None:
    # The items as the SDK types them ("type": "message"), and a response's output sent
    # back as the next input (a client keeping the conversation itself).
    said = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    first = sdk.responses.create(model="m", input=[said])  # type: ignore[list-item]
    replayed = [item.model_dump(exclude_none=True) for item in first.output]
    again = {**said, "content": [{"type": "input_text", "text": "hello"}]}
    second = sdk.responses.create(
        model="m",
        input=[said, *replayed, again],  # type: ignore[list-item]
        metadata={"session_id": "replayed-output"},
    )
    assert (first.status, second.status) == ("completed", "completed")
    stored = history(scenario, "replayed-output")
    texts = [part.get("text") for item in stored[:3] for part in item["content"]]
    assert texts == ["hi", first.output_text, "hello"]


def test_a_reply_with_an_image_before_its_text_streams_as_the_sdk_reads_it(
    sdk: openai.OpenAI,
) -> None:
    # The text's content_index was its place among all the message's parts (1, after the
    # image), while the output item holds its text parts alone: the SDK's stream failed
    # with an IndexError.
    with sdk.responses.stream(model="m", input="draw") as events:
        indexes = {e.content_index for e in events if e.type == "response.output_text.delta"}
        final = events.get_final_response()
    assert indexes == {0}
    assert final.output_text == "A cat."


@pytest.mark.parametrize("asked", ["refuse", "half refuse", "draw"])
def test_a_reply_given_whole_streams_all_the_completion_not_streamed_holds_once(
    sdk: openai.OpenAI, asked: str
) -> None:
    # Only deltas were streamed: a refusal in a message given whole never was, and the
    # streamed reply of an agent refusing looked empty.
    ask = [{"role": "user", "content": asked}]
    message = sdk.chat.completions.create(model="m", messages=ask).choices[0].message
    chunks = sdk.chat.completions.create(model="m", messages=ask, stream=True)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    content = "".join(d.content or "" for d in deltas) or None
    refusal = "".join(d.refusal or "" for d in deltas) or None
    assert (content, refusal) == (message.content, message.refusal)
    assert message.refusal or message.content


@pytest.mark.parametrize("asked", ["refuse", "half refuse"])
def test_a_refusal_given_whole_streams_its_delta_before_its_done_as_openais(
    sdk: openai.OpenAI, asked: str
) -> None:
    # A refusal in a message given whole sent response.refusal.done alone: a client building
    # the reply from the deltas showed nothing.
    with sdk.responses.stream(model="m", input=asked) as events:
        deltas = [
            e for e in events if e.type in ("response.refusal.delta", "response.refusal.done")
        ]
        final = events.get_final_response()
    refused = [p.refusal for item in final.output for p in item.content if p.type == "refusal"]  # type: ignore[union-attr]
    assert [e.type for e in deltas] == ["response.refusal.delta", "response.refusal.done"]
    assert [deltas[0].delta] == [deltas[1].refusal] == refused  # type: ignore[union-attr]


@dataclass
class Snapshot:
    """An AgentScope ``Msg`` as an agent streams it: its blocks so far."""

    content: list[dict[str, str]]
    id: str = "msg-1"
    role: str = "assistant"
    metadata: dict[str, Any] = field(default_factory=dict)


def snapshots_app(snapshots: list[list[dict[str, str]]]) -> AgentApp:
    """An AgentScope agent streaming one ``Msg`` as ``snapshots`` of its blocks."""
    app = AgentApp(app_name="snapshots")

    @app.query(framework="text")
    async def query(
        self: Any, msgs: list[Any], request: Any = None, **kwargs: Any
    ) -> AsyncIterator[tuple[Snapshot, bool]]:
        for number, blocks in enumerate(snapshots, 1):
            yield Snapshot(blocks), number == len(snapshots)

    return app


def thinking_between_texts_app() -> AgentApp:
    """An AgentScope agent whose one ``Msg`` thinks, answers, thinks again, answers on."""
    blocks = [
        {"type": "thinking", "thinking": "First, "},
        {"type": "text", "text": "Paris"},
        {"type": "thinking", "thinking": "then the river."},
        {"type": "text", "text": "on the Seine."},
    ]
    return snapshots_app([blocks[:grown] for grown in range(1, len(blocks) + 1)])


@contextmanager
def serving(agent_app: AgentApp) -> Iterator[tuple[openai.OpenAI, httpx.Client]]:
    """``agent_app`` served alone, with the SDK and an httpx client of one of its users."""
    keys = Keys.make()
    web = create_app(settings=load_settings(), agent_app=agent_app, key_store=keys.store)
    with (
        running(web) as served,
        openai.OpenAI(
            base_url=f"{served}/compatible-mode/v1", api_key=keys.alice, max_retries=0
        ) as sdk,
        httpx.Client(base_url=served, headers=bearer(keys.alice), timeout=30) as rest,
    ):
        yield sdk, rest


def test_text_of_a_msg_that_thinks_again_after_it_began_answering_is_sent_once() -> None:
    # Each message opened again for the Msg streamed its text from the start: the client read
    # "Paris\n\nParison the Seine." and the session kept "Paris" twice for the model.
    with serving(thinking_between_texts_app()) as (sdk, rest):
        ask = [{"role": "user", "content": "Where?"}]
        answer = sdk.chat.completions.with_raw_response.create(model="m", messages=ask)
        chunks = sdk.chat.completions.create(model="m", messages=ask, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        given = sdk.responses.create(model="m", input="Where?")
        kept = history(rest, answer.headers["X-Session-Id"])
    assert answer.parse().choices[0].message.content == streamed == "Paris\n\non the Seine."
    assert given.output_text == "Parison the Seine."  # the SDK joins the output items
    assert [(m["type"], "".join(p.get("text", "") for p in m["content"])) for m in kept] == [
        ("message", "Where?"),
        ("reasoning", "First, "),
        ("message", "Paris"),
        ("reasoning", "then the river."),
        ("message", "on the Seine."),
    ]


def test_a_msg_whose_text_is_rewritten_ends_with_its_new_text_alone() -> None:
    # The text before the rewrite and the one after were both kept, one after the other:
    # the reply said "Hello worGoodbye world.".
    texts = ["Hello wor", "Goodbye", "Goodbye world."]  # rewritten, then grown
    rewriting = snapshots_app([[{"type": "text", "text": text}] for text in texts])
    with serving(rewriting) as (sdk, rest):
        ask = [{"role": "user", "content": "Hi"}]
        answer = sdk.chat.completions.with_raw_response.create(model="m", messages=ask)
        chunks = sdk.chat.completions.create(model="m", messages=ask, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        with sdk.responses.stream(model="m", input="Hi") as events:
            done = [e.text for e in events if e.type == "response.output_text.done"]
            given = events.get_final_response()
        kept = history(rest, answer.headers["X-Session-Id"])
    assert answer.parse().choices[0].message.content == "Goodbye world."
    assert given.output_text == "".join(done) == "Goodbye world."
    assert "".join(p["text"] for p in kept[1]["content"]) == "Goodbye world."
    # A stream cannot take back what it sent: what it sent stays, no piece of the new text
    # out of place is added.
    assert streamed == "Hello wor world."


def test_a_thinking_models_reasoning_reaches_openai_clients_as_reasoning_servers_send_it() -> None:
    # The reasoning of the LLM agent's model never reached the OpenAI routes: a chat client
    # or a responses client saw the answer alone.
    keys = Keys.make()  # (the server stops its key store as it stops)
    thought = "The user greets. Answer briefly."
    with (
        llm_agent_server(keys, ScriptedLLM([THINKING]), []) as url,
        openai.OpenAI(base_url=f"{url}/compatible-mode/v1", api_key=keys.alice) as sdk,
    ):
        ask = [{"role": "user", "content": "hi"}]
        message = sdk.chat.completions.create(model="m", messages=ask).choices[0].message
        chunks = sdk.chat.completions.create(model="m", messages=ask, stream=True)
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        with sdk.responses.stream(model="m", input="hi") as events:
            kinds = [e.type for e in events]
            final = events.get_final_response()
        with sdk.responses.stream(model="m", input="hi") as events:
            summary = [e for e in events if e.type.startswith("response.reasoning_summary")]
        replayed = [item.model_dump(exclude_none=True) for item in final.output]
        resent = [*replayed, {"role": "user", "content": "so?"}]
        again = sdk.responses.create(model="m", input=resent)  # type: ignore[arg-type]
    assert (message.content, message.model_extra) == (
        "Hello there.",
        {"reasoning_content": thought},
    )
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == thought
    assert "".join(d.content or "" for d in deltas) == "Hello there."
    # The reasoning streams before the answer, as a reasoning item with one summary part.
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert [part.text for part in final.output[0].summary] == [thought]  # type: ignore[union-attr]
    assert final.output_text == "Hello there."
    assert kinds.index("response.reasoning_summary_text.done") < kinds.index(
        "response.output_text.delta"
    )
    assert [e.type for e in summary] == [
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
    ]
    assert "".join(getattr(e, "delta", "") for e in summary) == summary[3].text == thought  # type: ignore[union-attr]
    # Its output sent back whole (reasoning item and all) is taken as the next input.
    assert again.status == "completed"


def test_a_response_is_read_again_by_its_id_as_it_was_given(sdk: openai.OpenAI) -> None:
    given = sdk.responses.create(
        model="m", input="hello", instructions="Be terse.", metadata={"app": "tests"}
    )
    assert sdk.responses.retrieve(given.id) == given
    with sdk.responses.stream(
        model="other", input="again", previous_response_id=given.id, temperature=0.5
    ) as events:
        streamed = events.get_final_response()
    again = sdk.responses.retrieve(streamed.id)
    # (the stream's final response is the SDK's parsed kind: its text parts have more fields)
    assert again.model_dump(exclude={"output"}) == streamed.model_dump(exclude={"output"})
    assert (again.model, again.temperature, again.output_text) == ("other", 0.5, "echo: again")
    failed = sdk.responses.create(model="m", input="fail after a word")
    assert sdk.responses.retrieve(failed.id) == failed
    unkept = sdk.responses.create(model="m", input="forget it", store=False)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(unkept.id)


def test_a_response_still_going_is_read_in_progress(sdk: openai.OpenAI) -> None:
    with sdk.responses.stream(model="m", input="sleep 1") as events:
        created = next(iter(events))
        assert created.type == "response.created"
        going = sdk.responses.retrieve(created.response.id)
        assert (going.status, going.output) == ("in_progress", [])
        done = events.get_final_response()
    again = sdk.responses.retrieve(done.id)
    assert again.model_dump(exclude={"output"}) == done.model_dump(exclude={"output"})
    assert (again.status, again.output_text) == ("completed", "echo: sleep 1")


def test_a_response_stream_is_resumed_by_its_id_where_it_broke(sdk: openai.OpenAI) -> None:
    with sdk.responses.stream(model="m", input="sleep 0.5") as events:
        created = next(iter(events))
    # The client left (its run goes on): the SDK reads the rest of the stream by its id.
    response_id = created.response.id
    with sdk.responses.stream(response_id=response_id, starting_after=0) as resumed:
        rest = [(event.type, event.sequence_number) for event in resumed]
        final = resumed.get_final_response()
    assert rest[0] == ("response.in_progress", 1)
    assert rest[-1] == ("response.completed", len(rest))
    assert (final.status, final.output_text) == ("completed", "echo: sleep 0.5")
    assert final.model_dump(exclude={"output"}) == (
        sdk.responses.retrieve(response_id).model_dump(exclude={"output"})
    )
    for starting_after in (0, 3):
        after = sdk.responses.retrieve(response_id, stream=True, starting_after=starting_after)
        assert [(event.type, event.sequence_number) for event in after] == rest[starting_after:]
    unkept = sdk.responses.create(model="m", input="forget it", store=False)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(unkept.id, stream=True)


def test_a_response_still_going_is_cancelled_with_the_sdk(sdk: openai.OpenAI) -> None:
    # Its run goes on when its client leaves, and responses.cancel was a 404 "Not Found".
    going = sdk.responses.create(model="m", input="sleep 30", stream=True)
    created = next(iter(going))
    assert created.type == "response.created"
    cancelled = sdk.responses.cancel(created.response.id)
    assert (cancelled.id, cancelled.status) == (created.response.id, "cancelled")
    assert [event.type for event in going][-1] == "response.incomplete"
    assert sdk.responses.retrieve(cancelled.id).status == "cancelled"
    finished = sdk.responses.create(model="m", input="hi")
    assert sdk.responses.cancel(finished.id) == finished  # (it had ended: as it was)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.cancel("resp_0123_c2Vzc2lvbg")


def test_a_deleted_response_is_gone_and_no_later_response_continues_it(
    scenario_url: str, sdk: openai.OpenAI, keys: Keys
) -> None:
    # responses.delete was a 405 "Method Not Allowed".
    given = sdk.responses.create(model="m", input="keep me", instructions="Be terse.")
    later = sdk.responses.create(model="m", input="me too", previous_response_id=given.id)
    with (
        openai.OpenAI(
            base_url=f"{scenario_url}/compatible-mode/v1", api_key=keys.bob, max_retries=0
        ) as bob,
        pytest.raises(openai.NotFoundError),
    ):
        bob.responses.delete(given.id)
    sdk.responses.delete(given.id)
    for gone in (sdk.responses.retrieve, sdk.responses.delete, sdk.responses.input_items.list):
        with pytest.raises(openai.NotFoundError):
            gone(given.id)
    with pytest.raises(openai.NotFoundError) as refused:
        sdk.responses.create(model="m", input="and now?", previous_response_id=given.id)
    assert "deleted" in refused.value.message
    assert sdk.responses.retrieve(later.id).output_text == "echo: me too"
    going = sdk.responses.create(model="m", input="sleep 30", stream=True)
    created = next(iter(going))
    with pytest.raises(openai.ConflictError) as still_going:
        sdk.responses.delete(created.response.id)
    assert "in progress" in still_going.value.message
    # Without it the SDKs retried, and the retry could delete the response once it ended.
    assert still_going.value.response.headers["X-Should-Retry"] == "false"
    sdk.responses.cancel(created.response.id)
    going.close()


def test_a_response_whose_session_was_deleted_is_continued_by_no_later_response(
    sdk: openai.OpenAI, scenario: httpx.Client
) -> None:
    # The turn went to a new session of the same id, holding none of the conversation.
    given = sdk.responses.create(model="m", input="remember this")
    session = str((given.metadata or {})["session_id"])
    assert scenario.delete(f"/sessions/{session}").status_code == 204
    with pytest.raises(openai.NotFoundError) as refused:
        sdk.responses.create(model="m", input="and now?", previous_response_id=given.id)
    assert "it was deleted" in refused.value.message
    assert scenario.get(f"/sessions/{session}").status_code == 404
    # A session named besides it is the one continued.
    named = sdk.responses.create(
        model="m", input="here", previous_response_id=given.id, metadata={"session_id": "x"}
    )
    assert (named.metadata or {})["session_id"] == "x"


def test_a_responses_input_items_are_listed_as_given(sdk: openai.OpenAI) -> None:
    # responses.input_items.list was a 404 "Not Found".
    given = sdk.responses.create(model="m", input="hello", instructions="Be terse.")
    (item,) = sdk.responses.input_items.list(given.id)
    assert (item.type, item.role, item.content[0].text) == (  # type: ignore[union-attr]
        "message",
        "user",
        "hello",
    )
    conversation: list[Any] = [
        {"role": "user", "content": f"ask {i}"}
        if i % 2 == 0
        else {"role": "assistant", "content": f"answer {i}"}
        for i in range(25)
    ]
    whole = sdk.responses.create(model="m", input=conversation)
    listed = list(sdk.responses.input_items.list(whole.id, limit=10, order="asc"))
    assert [item.content[0].text for item in listed] == [  # type: ignore[union-attr]
        m["content"] for m in conversation
    ]
    newest = sdk.responses.input_items.list(whole.id, limit=2)
    assert [item.content[0].text for item in newest.data] == ["ask 24", "answer 23"]  # type: ignore[union-attr]
    assert newest.has_more
    unkept = sdk.responses.create(model="m", input="forget it", store=False)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.input_items.list(unkept.id)


def test_input_items_whose_ids_could_not_be_paged_are_refused(sdk: openai.OpenAI) -> None:
    # Items sharing an id were taken, and input_items paged after it served the same page
    # forever (has_more true); an id over 256 characters was taken, and paging after it
    # was refused (after is at most 256 characters).
    def item(item_id: str, text: str) -> Any:
        return {"type": "message", "role": "user", "id": item_id, "content": text}

    repeated = [item("x", "1"), item("a", "2"), item("y", "3"), item("a", "4"), item("z", "5")]
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model="m", input=repeated)
    assert refused.value.param == "input[3].id"
    assert "repeats the id of input[1]" in refused.value.message
    too_long = [item("first", "1"), item("msg_" + "a" * 253, "2")]
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model="m", input=too_long)
    assert refused.value.param == "input[1].id"
    longest = [item("first", "1"), item("msg_" + "a" * 252, "2"), item("third", "3")]
    given = sdk.responses.create(model="m", input=longest)
    listed = list(sdk.responses.input_items.list(given.id, limit=2, order="asc"))
    assert [i.content[0].text for i in listed] == ["1", "2", "3"]  # type: ignore[union-attr]


def test_only_its_user_reads_a_response_again(
    scenario_url: str, sdk: openai.OpenAI, keys: Keys
) -> None:
    given = sdk.responses.create(model="m", input="mine")
    run, _, session = given.id.removeprefix("resp_").partition("_")
    with (
        openai.OpenAI(
            base_url=f"{scenario_url}/compatible-mode/v1", api_key=keys.bob, max_retries=0
        ) as bob,
        pytest.raises(openai.NotFoundError) as not_bobs,
    ):
        bob.responses.retrieve(given.id)
    assert not_bobs.value.code == "RESPONSE_NOT_FOUND"
    chat = sdk.chat.completions.with_raw_response.create(model="m", messages=ASK)  # type: ignore[arg-type]
    chat_run = chat.headers["X-Run-Id"].removeprefix("response_").replace("-", "")
    forged = [
        f"resp_{run}_b3RoZXI",  # another session's name on the same run
        f"resp_{chat_run}_{session}",  # a chat completion's run
        f"resp_{run}",
        "resp_zz_" + session,
        "nothing",
    ]
    for response_id in forged:
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(response_id)


def test_without_a_runs_store_no_response_is_read_again() -> None:
    keys = Keys.make()  # (the server stops its key store as it stops)
    settings = load_settings(runs_backend="none")
    web = create_app(settings=settings, agent_app=slow_app, key_store=keys.store)
    with (
        running(web) as served,
        openai.OpenAI(
            base_url=f"{served}/compatible-mode/v1", api_key=keys.alice, max_retries=0
        ) as sdk,
    ):
        given = sdk.responses.create(model="m", input="hi", extra_body={"stream": False})
        with pytest.raises(openai.NotFoundError) as missing:
            sdk.responses.retrieve(given.id)
    assert "stores no runs" in missing.value.message


def test_instructions_sent_with_every_response_are_not_piled_up_in_the_session(
    sdk: openai.OpenAI, scenario: httpx.Client
) -> None:
    first = sdk.responses.create(model="m", input="one", instructions="Be terse.")
    second = sdk.responses.create(
        model="m", input="two", instructions="Be terse.", previous_response_id=first.id
    )
    session = str((second.metadata or {})["session_id"])
    assert [(m["role"], m["content"][0]["text"]) for m in history(scenario, session)] == [
        ("user", "one"),
        ("assistant", "echo: one"),
        ("user", "two"),
        ("assistant", "echo: two"),
    ]


def test_a_client_that_names_no_session_leaves_its_conversation_in_memory_once(
    sdk: openai.OpenAI, scenario: httpx.Client
) -> None:
    # A chat client resends its whole conversation with every call and names no session (its
    # calls continue one session, found again from what they resend). Each call used to give
    # memory every message again, so a search found the first message once per call since.
    marker = uuid.uuid4().hex
    conversation: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": f"first {marker}"},
    ]
    sessions = []
    for text in (f"second {marker}", f"third {marker}", None):
        raw = sdk.chat.completions.with_raw_response.create(model="m", messages=conversation)
        sessions.append(raw.headers["X-Session-Id"])
        answer = raw.parse().choices[0].message.content
        conversation.append({"role": "assistant", "content": answer})
        if text is not None:
            conversation.append({"role": "user", "content": text})
    assert len(set(sessions)) == 1
    # The session holds the whole conversation, each message once, in order.
    stored = history(scenario, sessions[-1])
    assert [(m["role"], m["content"][0]["text"]) for m in stored] == [
        (m["role"], m["content"]) for m in conversation
    ]
    found = scenario.post("/memory/search", json={"query": marker, "top_k": 50})
    remembered = Counter(m["content"][0]["text"] for m in found.json()["items"])
    assert remembered == Counter(m["content"] for m in conversation if m["role"] != "system")


def test_instructions_reach_the_agent_with_a_conversation_sent_whole() -> None:
    # OpenAI's Agents SDK sends its instructions with the whole conversation every turn. In a
    # session only what follows the last assistant message is new: the instructions, put
    # before the conversation, were cut off with the turns already stored.
    keys = Keys.make()  # (the server stops its key store as it stops)
    llm = ScriptedLLM([ANSWER, FOLLOW_UP])
    session = {"session_id": "sent-whole"}
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    with (
        llm_agent_server(keys, llm, []) as url,
        openai.OpenAI(base_url=f"{url}/compatible-mode/v1", api_key=keys.alice) as llm_sdk,
    ):
        first = llm_sdk.responses.create(
            model="llm", input=ask, instructions="Answer in French.", metadata=session
        )
        conversation = [
            *ask,
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And now?"},
        ]
        llm_sdk.responses.create(
            model="llm", input=conversation, instructions="Answer in French.", metadata=session
        )
        with httpx.Client(base_url=url, headers=bearer(keys.alice)) as client:
            stored = history(client, "sent-whole")
    for request in llm.requests:
        assert {"role": "system", "content": "Answer in French."} in request["body"]["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant", "user", "assistant"]


def test_blank_instructions_are_as_if_not_sent() -> None:
    # They reached the model as a system message of whitespace.
    keys = Keys.make()  # (the server stops its key store as it stops)
    llm = ScriptedLLM([ANSWER])
    with (
        llm_agent_server(keys, llm, []) as url,
        openai.OpenAI(base_url=f"{url}/compatible-mode/v1", api_key=keys.alice) as llm_sdk,
    ):
        given = llm_sdk.responses.create(model="llm", input="hi", instructions=" \n ")
    assert given.instructions is None
    (request,) = llm.requests
    assert [m["role"] for m in request["body"]["messages"] if not m["content"].strip()] == []


def test_a_failed_response_keeps_the_reply_it_had_streamed(sdk: openai.OpenAI) -> None:
    failed = sdk.responses.create(model="m", input="fail after a word")
    assert failed.status == "failed" and failed.error is not None
    assert [(item.type, item.status) for item in failed.output] == [("message", "incomplete")]
    assert failed.output_text == "partial "
    events = list(sdk.responses.create(model="m", input="fail after a word", stream=True))
    assert events[-1].type == "response.failed"
    assert events[-1].response.output_text == "partial "  # type: ignore[union-attr]


def test_function_call_items_of_a_responses_input_reach_the_session(
    sdk: openai.OpenAI, scenario: httpx.Client
) -> None:
    # The items after the last assistant's are input; without a session, those before it
    # are the new session's history.
    answer = sdk.responses.create(
        model="m",
        input=[
            {"role": "user", "content": "weather?"},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ],
    )
    assert answer.status == "completed"
    stored = history(scenario, answer.metadata["session_id"])  # type: ignore[index]
    assert [(m["type"], m["role"]) for m in stored] == [
        ("message", "user"),
        ("function_call", "assistant"),
        ("function_call_output", "tool"),
        ("message", "assistant"),
    ]
    assert stored[1]["content"][0]["data"]["name"] == "get_weather"
    assert stored[2]["content"][0]["data"] == {"call_id": "call_1", "name": None, "output": "sunny"}
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(
            model="m",
            input=[
                {"role": "user", "content": "hi"},
                {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            ],
        )
    assert refused.value.param == "input[1].type"
    assert "items taken are messages, function_call, function_call_output and reasoning" in (
        refused.value.message
    )


WEATHER_CALL = {"type": "function", "id": "call_1", "function": {"name": "get_weather"}}


@pytest.mark.parametrize(
    ("field", "message", "param"),
    [
        (
            "messages",
            {"role": "assistant", "tool_calls": [{**WEATHER_CALL, "id": None}]},
            "messages[1].tool_calls[0].id",
        ),
        (
            "messages",
            {"role": "assistant", "tool_calls": [{**WEATHER_CALL, "function": {}}]},
            "messages[1].tool_calls[0].function.name",
        ),
        ("messages", {"role": "tool", "content": "sunny"}, "messages[1].tool_call_id"),
        ("input", {"type": "function_call", "call_id": "call_1"}, "input[1].name"),
        (
            "messages",
            {"role": "tool", "tool_call_id": "call_1", "content": {"sky": "clear"}},
            "messages[1].content",
        ),
        (
            "input",
            {"type": "function_call_output", "call_id": "call_1", "output": {"sky": "clear"}},
            "input[1].output",
        ),
        (
            "input",
            {
                "type": "function_call_output",
                "call_id": "call_1",
                "output": [{"type": "input_image", "image_url": "https://example.com/sky.png"}],
            },
            "input[1].output",
        ),
    ],
)
def test_a_tool_call_without_its_id_or_name_or_a_text_output_is_refused_and_not_stored(
    sdk: openai.OpenAI,
    scenario: httpx.Client,
    field: str,
    message: dict[str, Any],
    param: str,
) -> None:
    # Stored, the call would reach the model on every later turn of the session, and a chat
    # API refuses a tool call without them: the session could never be answered again. An
    # output that is not text would reach it empty, as if the tool had said nothing.
    session = f"tool-call-{uuid.uuid4()}"
    sent = [{"role": "user", "content": "weather?"}, message]
    with pytest.raises(openai.BadRequestError) as refused:
        if field == "messages":
            sdk.chat.completions.create(
                model="m", messages=sent, extra_headers={"X-Session-Id": session}
            )
        else:
            sdk.responses.create(model="m", input=sent, metadata={"session_id": session})
    assert refused.value.param == param
    assert scenario.get(f"/sessions/{session}").status_code == 404


def test_a_file_sent_by_url_reaches_the_llm_agents_model_as_a_mention_it_takes() -> None:
    # Chat APIs take a file by id or by data only: it reached the model as a file of neither,
    # which it refused, on this turn and every later one of the session.
    keys = Keys.make()  # (the server stops its key store as it stops)
    llm = ScriptedLLM([ANSWER, FOLLOW_UP])
    document = {"type": "input_file", "file_url": "https://example.com/a.pdf", "filename": "a.pdf"}
    with (
        llm_agent_server(keys, llm, []) as url,
        openai.OpenAI(base_url=f"{url}/compatible-mode/v1", api_key=keys.alice) as llm_sdk,
    ):
        first = llm_sdk.responses.create(
            model="llm",
            input=[
                {"role": "user", "content": [{"type": "input_text", "text": "Sum up"}, document]}
            ],
        )
        llm_sdk.responses.create(model="llm", input="And now?", previous_response_id=first.id)
    for request in llm.requests:
        (asked,) = [m for m in request["body"]["messages"] if isinstance(m["content"], list)]
        assert asked["content"] == [
            {"type": "text", "text": "Sum up"},
            {"type": "text", "text": "[file a.pdf: https://example.com/a.pdf]"},
        ]


def test_a_clients_sampling_options_reach_the_llm_agents_model_under_the_name_it_gave() -> None:
    # They were taken, checked, and left out of the model's call: a client's max_tokens did
    # not bound the answer, nor its temperature, stop or seed tune it.
    keys = Keys.make()  # (the server stops its key store as it stops)
    llm = ScriptedLLM([ANSWER])
    ask: Any = [{"role": "user", "content": "hi"}]
    tuning = {"temperature": 0.3, "top_p": 0.9, "seed": 7, "stop": ["END"]}
    penalties = {"frequency_penalty": 0.5, "presence_penalty": -0.5}
    with (
        llm_agent_server(keys, llm, []) as url,
        openai.OpenAI(base_url=f"{url}/compatible-mode/v1", api_key=keys.alice) as llm_sdk,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client,
    ):
        llm_sdk.chat.completions.create(
            model="llm", messages=ask, max_completion_tokens=50, **tuning, **penalties
        )
        llm_sdk.chat.completions.create(model="llm", messages=ask, max_tokens=40)
        llm_sdk.responses.create(model="llm", input="hi", max_output_tokens=30, temperature=1)
        body = {"input": [{"role": "user", "content": "hi"}], "max_tokens": 20, "stream": False}
        assert client.post("/process", json=body).status_code == 200
        llm_sdk.chat.completions.create(model="llm", messages=ask)
    sent = [request["body"] for request in llm.requests]
    given = {**tuning, **penalties, "max_completion_tokens": 50}
    assert {option: sent[0].get(option) for option in given} == given
    assert "max_tokens" not in sent[0]
    assert (sent[1]["max_tokens"], sent[2]["max_tokens"], sent[3]["max_tokens"]) == (40, 30, 20)
    assert sent[2]["temperature"] == 1
    options = [*tuning, *penalties, "max_tokens", "max_completion_tokens"]
    assert not set(options) & set(sent[4])


def test_parallel_function_calls_of_a_responses_input_reach_the_model_with_their_outputs() -> None:
    # The responses API gives each of parallel calls an item of its own, their outputs after
    # them all: each call was kept alone, and the model was told the first one had no result.
    keys = Keys.make()  # (the server stops its key store as it stops)
    llm = ScriptedLLM([ANSWER])
    calls = [
        {"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": city}
        for call_id, city in (("call_1", '{"city": "Paris"}'), ("call_2", '{"city": "Rome"}'))
    ]
    outputs = [
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": "rainy"},
    ]
    with (
        llm_agent_server(keys, llm, []) as url,
        openai.OpenAI(base_url=f"{url}/compatible-mode/v1", api_key=keys.alice) as llm_sdk,
    ):
        llm_sdk.responses.create(
            model="llm",
            input=[{"role": "user", "content": "Paris and Rome?"}, *calls, *outputs],  # type: ignore[list-item]
        )
    sent = llm.requests[0]["body"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "tool"]
    assert [call["id"] for call in sent[2]["tool_calls"]] == ["call_1", "call_2"]
    assert [(m["tool_call_id"], m["content"]) for m in sent[3:]] == [
        ("call_1", "sunny"),
        ("call_2", "rainy"),
    ]


# --- retries -------------------------------------------------------------------------------


def test_an_sdk_retry_after_a_timeout_joins_the_run_instead_of_running_it_again(
    scenario_url: str, scenario: httpx.Client
) -> None:
    """The SDK gave up on a slow run after its timeout, and retried twice: the agent ran
    three times and the turn was stored three times. Each retry now waits for the first
    try's run, and the last one gets its answer."""
    session = f"retried-{uuid.uuid4()}"
    with openai.OpenAI(
        base_url=f"{scenario_url}/compatible-mode/v1",
        api_key=str(scenario.headers["Authorization"]).removeprefix("Bearer "),
        timeout=0.5,
        max_retries=3,
    ) as client:
        completion = client.chat.completions.with_raw_response.create(
            model="m",
            messages=[{"role": "user", "content": "sleep 1.2"}],
            extra_headers={"X-Session-Id": session},
        )
        response = client.responses.create(
            model="m", input="sleep 1.2", metadata={"session_id": session}
        )
    assert completion.parse().choices[0].message.content == "echo: sleep 1.2"
    assert completion.retries_taken > 0  # the answer came to a retry
    assert response.output_text == "echo: sleep 1.2"
    assert [run["status"] for run in runs_of(scenario, session)] == ["completed", "completed"]
    assert [m["role"] for m in history(scenario, session)] == ["user", "assistant"] * 2


def retry_of(count: int, **headers: str) -> dict[str, str]:
    """The headers of an SDK's try: the first (0), or a retry."""
    return {"X-Stainless-Retry-Count": str(count), "X-Stainless-Read-Timeout": "600", **headers}


@pytest.mark.parametrize("asked", ["hi", "half refuse"])
@pytest.mark.parametrize("path", [CHAT, RESPONSES])
def test_a_retry_of_a_stream_replays_the_run_of_its_first_try(
    scenario: httpx.Client, path: str, asked: str
) -> None:
    # The replay read the run's text alone: a refusal the first try streamed was lost.
    session = f"retried-{uuid.uuid4()}"
    if path == CHAT:
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": asked}]}
    else:
        body = {"model": "m", "input": asked}
    body["stream"] = True
    headers = {"X-Session-Id": session}
    first, first_events = stream(scenario, path, json=body, headers=retry_of(0, **headers))
    again, again_events = stream(scenario, path, json=body, headers=retry_of(1, **headers))
    assert again.headers["X-Run-Id"] == first.headers["X-Run-Id"]
    assert again_events.data == first_events.data
    assert len(runs_of(scenario, session)) == 1


def test_a_repeat_that_is_no_retry_runs_again(scenario: httpx.Client) -> None:
    session = f"repeated-{uuid.uuid4()}"
    body = {"model": "m", "messages": [{"role": "user", "content": "continue"}]}
    headers = {"X-Session-Id": session}
    first = scenario.post(CHAT, json=body, headers=retry_of(0, **headers))
    again = scenario.post(CHAT, json=body, headers=retry_of(0, **headers))
    other = scenario.post(
        CHAT,
        json={**body, "temperature": 0.5},  # another request: a retry of it finds no run
        headers=retry_of(1, **headers),
    )
    keyed = scenario.post(  # a retry with an Idempotency-Key is the key's to answer
        CHAT, json=body, headers=retry_of(1, **headers, **{"Idempotency-Key": "k1"})
    )
    run_ids = {r.headers["X-Run-Id"] for r in (first, again, other, keyed)}
    assert len(run_ids) == 4
    assert len(runs_of(scenario, session)) == 4


def test_a_retry_waits_for_the_run_still_going_and_answers_with_it(
    scenario: httpx.Client,
) -> None:
    # The first try's client left (a gateway's timeout); its run goes on.
    session = f"retried-{uuid.uuid4()}"
    body = {"model": "m", "messages": [{"role": "user", "content": "sleep 0.6"}]}
    headers = {"X-Session-Id": session}
    first: list[httpx.Response] = []
    thread = threading.Thread(
        target=lambda: first.append(scenario.post(CHAT, json=body, headers=retry_of(0, **headers)))
    )
    thread.start()
    while not runs_of(scenario, session):
        time.sleep(0.02)
    retried = scenario.post(CHAT, json=body, headers=retry_of(2, **headers))
    thread.join()
    assert retried.status_code == 200
    assert retried.json()["choices"] == first[0].json()["choices"]
    assert retried.headers["X-Run-Id"] == first[0].headers["X-Run-Id"]
    assert len(runs_of(scenario, session)) == 1


def test_a_retry_of_a_stream_whose_run_stopped_with_its_client_runs_again(
    scenario: httpx.Client,
) -> None:
    # The first try's connection broke, which stopped its run (a streamed chat completion
    # ends with its client): its retry joined the canceled run, and got its role chunk then
    # a RUN_CANCELED error instead of an answer.
    session = f"retried-{uuid.uuid4()}"
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "sleep 1"}]}
    headers = {"X-Session-Id": session}
    with scenario.stream("POST", CHAT, json=body, headers=retry_of(0, **headers)) as broken:
        first_run = broken.headers["X-Run-Id"]
    deadline = time.monotonic() + 30
    while [run["status"] for run in runs_of(scenario, session)] != ["canceled"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    retried, events = stream(scenario, CHAT, json=body, headers=retry_of(1, **headers))
    assert retried.status_code == 200
    assert retried.headers["X-Run-Id"] != first_run
    chunks = [chunk for chunk in events.data if isinstance(chunk, dict)]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == (
        "echo: sleep 1"
    )
    assert [run["status"] for run in runs_of(scenario, session)] == ["canceled", "completed"]


def canceled_try(client: httpx.Client, path: str, body: dict[str, Any], count: int) -> None:
    """Try ``count`` of ``body``, whose run is canceled: a chat completion's stream broken
    (its run stops with it), a response canceled by its user through the runs API."""
    session = body["metadata"]["session_id"]
    with client.stream("POST", path, json=body, headers=retry_of(count)) as broken:
        if path == RESPONSES:  # (its run goes on when its client leaves)
            assert client.post(f"/runs/{broken.headers['X-Run-Id']}/cancel").is_success
    deadline = time.monotonic() + 30
    while [run["status"] for run in runs_of(client, session)][count:] != ["canceled"]:
        assert time.monotonic() < deadline, runs_of(client, session)
        time.sleep(0.05)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", [CHAT, RESPONSES])
def test_a_retry_running_a_canceled_call_again_stores_its_input_once(
    backend: str, path: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The canceled run had stored the input, and each retry running the call again stored
    # it once more: the user's message stood three times in the session.
    session = f"retried-{uuid.uuid4()}"
    body: dict[str, Any] = {"model": "m", "metadata": {"session_id": session}}
    if path == CHAT:
        body.update(stream=True, messages=[{"role": "user", "content": "sleep 1"}])
    else:
        body.update(stream=True, input="sleep 1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", LOCAL_AWS_CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_AWS_CREDENTIALS["aws_secret_access_key"])
    settings = load_settings(**backend_settings(backend, request))
    keys = Keys.make()  # (the server stops its key store as it stops)
    web = create_app(settings=settings, agent_app=scenario_app(), key_store=keys.store)
    with (
        running(web) as served,
        httpx.Client(base_url=served, headers=bearer(keys.alice), timeout=30) as client,
    ):
        canceled_try(client, path, body, 0)
        canceled_try(client, path, body, 1)
        retried = client.post(path, json=body, headers=retry_of(2))
        assert retried.status_code == 200, retried.text
        assert [m["role"] for m in history(client, session)] == ["user", "assistant"]
        # The same text sent again is another turn: stored again.
        assert client.post(path, json=body, headers=retry_of(0)).status_code == 200
        texts = [m["content"][0]["text"] for m in history(client, session)]
        assert texts == ["sleep 1", "echo: sleep 1"] * 2
        assert [run["status"] for run in runs_of(client, session)] == [
            "canceled",
            "canceled",
            "completed",
            "completed",
        ]


def test_a_retry_of_a_failed_run_gets_its_error_again(scenario: httpx.Client) -> None:
    session = f"retried-{uuid.uuid4()}"
    body = {"model": "m", "messages": [{"role": "user", "content": "fail"}]}
    headers = {"X-Session-Id": session}
    first = scenario.post(CHAT, json=body, headers=retry_of(0, **headers))
    again = scenario.post(CHAT, json=body, headers=retry_of(1, **headers))
    assert first.status_code == again.status_code == 500
    assert again.json() == first.json()
    assert again.headers["X-Should-Retry"] == "false"
    assert [m["content"][0]["text"] for m in history(scenario, session)] == ["fail"]


def test_a_chat_completion_stream_closed_by_its_client_stops_its_run() -> None:
    # The client broke out of the stream (a chat page's Stop): the agent went on to the end
    # of its reply, which was stored whole, as if the user had read it.
    keys = Keys.make()  # (the server stops its key store as it stops)
    web = create_app(settings=load_settings(), agent_app=slow_app, key_store=keys.store)
    stopped, kept = f"stopped-{uuid.uuid4()}", f"kept-{uuid.uuid4()}"
    ask: Any = [{"role": "user", "content": "hi"}]
    with (
        running(web) as served,
        openai.OpenAI(base_url=f"{served}/compatible-mode/v1", api_key=keys.alice) as sdk,
        httpx.Client(base_url=served, headers=bearer(keys.alice)) as client,
    ):
        for session, extra in ((stopped, {}), (kept, {"cancel_on_disconnect": False})):
            chunks = sdk.chat.completions.create(
                model="m",
                messages=ask,
                stream=True,
                extra_headers={"X-Session-Id": session},
                extra_body=extra,
            )
            for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content:
                    break
            chunks.close()
        ended = {}
        deadline = time.monotonic() + 30
        while len(ended) < 2:
            assert time.monotonic() < deadline, ended
            for session in (stopped, kept):
                # A run is listed once stored: within its first write delay, or at its end.
                runs = runs_of(client, session)
                if runs and runs[0]["status"] != "in_progress":
                    ended[session] = runs[0]["status"]
            time.sleep(0.05)
        replies = {s: history(client, s)[-1]["content"][0]["text"] for s in (stopped, kept)}
    assert ended == {stopped: "canceled", kept: "completed"}
    assert replies[stopped].count("piece") < PIECES
    assert replies[kept].count("piece") == PIECES


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, {"model": "m", "messages": [{"role": "user", "content": "go"}]}),
        (RESPONSES, {"model": "m", "input": "go"}),
    ],
)
def test_without_a_runs_store_a_call_whose_client_left_is_canceled(
    keys: Keys, path: str, body: dict[str, Any]
) -> None:
    # Nobody can resume a run that is not stored: it ends with its client (the slow agent
    # would write for 5 s; its cleanup saves state as it ends).
    settings = load_settings(runs_backend="none")
    web = create_app(settings=settings, agent_app=slow_app, key_store=keys.store)
    session = f"left-{uuid.uuid4()}"
    with running(web) as served, httpx.Client(base_url=served, headers=bearer(keys.alice)) as c:
        with pytest.raises(httpx.ReadTimeout):
            c.post(path, json=body, headers={"X-Session-Id": session}, timeout=0.5)
        left = time.monotonic()
        while c.get(f"/state/{session}").status_code == 404:
            assert time.monotonic() - left < 2.5, "the run went on without its client"
            time.sleep(0.05)
        assert c.get(f"/state/{session}").json()["state"] == {"cleanup": True}


def test_a_response_whose_session_expired_is_gone(
    keys: Keys, request: pytest.FixtureRequest
) -> None:
    # Its session expired (SESSION_TTL_SECONDS), the response and its input items were
    # still read, with the conversation: only its runs' own, longer, expiry ended them.
    settings = load_settings(**backend_settings("redis", request), session_ttl_seconds=2)
    with (
        running(create_app(settings=settings, key_store=keys.store)) as served,
        openai.OpenAI(
            base_url=f"{served}/compatible-mode/v1", api_key=keys.alice, max_retries=0
        ) as sdk,
    ):
        given = sdk.responses.create(model="m", input="My name is Ada")
        assert sdk.responses.retrieve(given.id).id == given.id
        time.sleep(3.5)  # Redis expires whole seconds
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(given.id)
        with pytest.raises(openai.NotFoundError):
            sdk.responses.input_items.list(given.id)
