"""The LLM agent against a chat API that misbehaves: replies that never end, fields of the
wrong type, cut tool calls, split surrogate pairs, replies cut short (all real HTTP)."""

from __future__ import annotations

import asyncio
import json
import re
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import httpx
import openai
import pytest
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from openai.types.chat import ChatCompletionMessageParam

from agentscope_serverless.agents.llm import LLMAgent
from agentscope_serverless.schemas.agent_schemas import (
    DataContent,
    FunctionCall,
    FunctionCallOutput,
    Message,
    MessageType,
    Role,
)
from tests.http.test_llm_agent import (
    ANSWER,
    FOLLOW_UP,
    ScriptedLLM,
    chunk,
    llm_agent_server,
    messages_of,
    run_once,
)
from tests.support.http import Keys, bearer, running, stream, text_of, user_message

DONE = "data: [DONE]\n\n"


def data(item: dict[str, Any]) -> str:
    return f"data: {json.dumps(item)}\n\n"


class RawLLM(ScriptedLLM):
    """A chat API answering each request with the next of ``bodies`` (the last one again
    when they run out): the pieces a function gives, sent as they are."""

    def __init__(
        self, *bodies: Callable[[], Iterable[str]], media_type: str = "text/event-stream"
    ) -> None:
        super().__init__([])
        self.bodies = bodies
        self.media_type = media_type

    async def complete(self, request: Request) -> Response:
        self.requests.append({"body": await request.json()})
        body = self.bodies[min(len(self.requests), len(self.bodies)) - 1]

        async def pieces() -> AsyncIterator[str]:
            for piece in body():
                yield piece
                await asyncio.sleep(0)

        return StreamingResponse(pieces(), media_type=self.media_type)


# With LLM_MAX_REPLY_CHARS at 1,000: 12 bytes a character, and 1 MiB for the envelope.
LINE_LIMIT = 12 * 1_000 + 1024 * 1024


def test_a_line_that_never_ends_fails_the_run_once_no_reply_could_be_that_long(
    keys: Keys,
) -> None:
    def endless_line() -> Iterable[str]:
        yield 'data: {"choices": [{"delta": {"content": "'
        for _ in range(128):  # 8 MiB of one line (a broken server would send it for ever)
            yield "x" * 65_536

    events = run_once(keys, RawLLM(endless_line), llm_max_reply_chars=1_000)
    assert events[-1]["status"] == "failed"
    assert events[-1]["error"] == {
        "code": "LLM_ERROR",
        "message": f"the chat API sent a line of more than {LINE_LIMIT:,} bytes",
    }


def test_a_json_completion_that_never_ends_fails_the_run_once_no_reply_could_be_that_long(
    keys: Keys,
) -> None:
    def endless_json() -> Iterable[str]:
        yield '{"choices": [{"message": {"content": "'
        for _ in range(128):
            yield "x" * 65_536

    llm = RawLLM(endless_json, media_type="application/json")
    events = run_once(keys, llm, llm_max_reply_chars=1_000)
    assert events[-1]["error"] == {
        "code": "LLM_ERROR",
        "message": f"the chat API sent a completion of more than {LINE_LIMIT:,} bytes",
    }


def test_a_line_as_long_as_a_reply_can_be_is_read(keys: Keys) -> None:
    # A whole tool call in one chunk, its arguments nearly as long as a reply may be, each
    # of their characters escaped as a surrogate pair (12 bytes): past the 1 MiB envelope.
    cities = "😀" * 199_000
    arguments = json.dumps({"city": cities}, ensure_ascii=False)
    call = {"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": arguments}}
    line = json.dumps(chunk({"tool_calls": [call]}))
    assert len(arguments) < 200_000 and len(line) > 199_000 * 12 > 2 * 1024 * 1024
    llm = RawLLM(lambda: [f"data: {line}\n\n", DONE], lambda: [data(ANSWER[1]), DONE])
    tool_calls: list[dict[str, Any]] = []
    with (
        llm_agent_server(keys, llm, tool_calls, llm_max_reply_chars=200_000) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=10) as client,
    ):
        _, sse = stream(client, "/process", json={"input": [user_message("Weather?")]})
    assert sse.data[-1]["status"] == "completed"
    assert tool_calls == [{"city": cities}]


def test_a_reply_longer_than_llm_max_reply_chars_fails_the_run(keys: Keys) -> None:
    def endless_answer() -> Iterable[str]:
        for _ in range(5_000):  # 250,000 characters (a looping model would not stop)
            yield data(chunk({"content": "blah " * 10}))
        yield DONE

    def endless_empty_chunks() -> Iterable[str]:
        for _ in range(5_000):
            yield data({"choices": [{"index": 0, "delta": {}}]})
        yield DONE

    for body in (endless_answer, endless_empty_chunks):
        events = run_once(keys, RawLLM(body), llm_max_reply_chars=1_000)
        assert events[-1]["status"] == "failed"
        assert events[-1]["error"] == {
            "code": "LLM_ERROR",
            "message": "the model's reply was longer than 1,000 characters",
        }


def call_with(**fields: Any) -> dict[str, Any]:
    function = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    return {"index": 0, "id": "call_1", "type": "function", "function": function, **fields}


@pytest.mark.parametrize(
    "call",
    [
        call_with(function="SECRET-UPSTREAM"),
        call_with(function={"name": 5, "arguments": "{}"}),
        call_with(function={"name": "get_weather", "arguments": {"city": "SECRET-UPSTREAM"}}),
        call_with(function={"name": ["SECRET-UPSTREAM"], "arguments": "{}"}),
        call_with(id=7),
        call_with(id={"upstream": "SECRET-UPSTREAM"}),
    ],
)
def test_a_tool_call_of_the_wrong_shape_fails_the_run_quoting_nothing_of_it(
    keys: Keys, call: dict[str, Any]
) -> None:
    streamed = RawLLM(lambda: [data(chunk({"tool_calls": [call]})), DONE])
    whole = {"choices": [{"message": {"role": "assistant", "tool_calls": [call]}}]}
    not_streamed = RawLLM(lambda: [json.dumps(whole)], media_type="application/json")
    for llm in (streamed, not_streamed):
        events = run_once(keys, llm)
        assert events[-1]["error"] == {
            "code": "LLM_ERROR",
            "message": "the chat API sent a tool call of an unexpected shape",
        }
        assert "SECRET" not in json.dumps(events)


@pytest.mark.parametrize(
    "count",
    ['"SECRET-UPSTREAM"', "NaN", "1e999", "-Infinity", "[1]", "-5", "10" * 15, "1.5", "true"],
)
def test_a_usage_count_that_is_no_count_is_ignored_and_the_answer_kept(
    keys: Keys, count: str
) -> None:
    usage = f'{{"choices": [], "usage": {{"prompt_tokens": {count}, "completion_tokens": 1}}}}'
    llm = RawLLM(lambda: [data(chunk({"content": "ok"})), f"data: {usage}\n\n", DONE])
    events = run_once(keys, llm)
    assert events[-1]["status"] == "completed"
    assert text_of(events) == "ok"
    assert events[-1].get("usage") is None
    assert "SECRET" not in json.dumps(events)


class ArgumentCheckingLLM(ScriptedLLM):
    """A scripted chat API that, like strict ones, answers 400 to a conversation holding a
    tool call whose arguments are not a JSON object."""

    def __init__(self, replies: list[list[dict[str, Any]]]) -> None:
        super().__init__(replies)
        self.rejected = 0

    async def complete(self, request: Request) -> Response:
        for message in (await request.json())["messages"]:
            for call in message.get("tool_calls") or []:
                try:
                    arguments = json.loads(call["function"]["arguments"])
                except ValueError:
                    arguments = None
                named = re.fullmatch(r"[A-Za-z0-9_-]{1,64}", call["function"]["name"])
                if not isinstance(arguments, dict) or not named:
                    self.rejected += 1
                    self.requests.append({"body": None})
                    error = {"message": "arguments is not valid JSON", "code": "invalid_arguments"}
                    return JSONResponse({"error": error}, status_code=400)
        return await super().complete(request)


def _call_then_follow_up(keys: Keys, llm: ArgumentCheckingLLM) -> tuple[Any, Any, Any]:
    """Two turns of one session with ``llm`` scripted for the first (a tool call), then
    answering; the events of both and the stored messages. No tool may have run."""
    llm.replies += [ANSWER, FOLLOW_UP]
    tool_calls: list[dict[str, Any]] = []
    with (
        llm_agent_server(keys, llm, tool_calls) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=10) as client,
    ):
        body = {"input": [user_message("Weather?")], "session_id": "called"}
        _, sse = stream(client, "/process", json=body)
        body = {"input": [user_message("And now?")], "session_id": "called"}
        _, follow_up = stream(client, "/process", json=body)
        stored = client.get("/sessions/called/messages").json()["items"]
    assert tool_calls == []
    return sse, follow_up, stored


@pytest.mark.parametrize(
    ("arguments", "finish", "output"),
    [
        (
            '{"city": "Par',
            "length",
            "error: the arguments were cut off at the model's output limit; the tool was not run",
        ),
        (
            "{city: Paris}",
            "tool_calls",
            "error: the arguments are not a JSON object; the tool was not run",
        ),
        (
            '["Paris"]',
            "tool_calls",
            "error: the arguments are not a JSON object; the tool was not run",
        ),
        (
            '{"city": NaN}',
            "tool_calls",
            "error: the arguments are not a JSON object; the tool was not run",
        ),
    ],
)
def test_a_tool_call_whose_arguments_are_not_a_json_object_is_answered_not_run(
    keys: Keys, arguments: str, finish: str, output: str
) -> None:
    call = {"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": arguments}}
    llm = ArgumentCheckingLLM([[chunk({"tool_calls": [call]}), chunk(finish=finish)]])
    sse, follow_up, stored = _call_then_follow_up(keys, llm)
    assert sse.data[-1]["status"] == "completed"
    call_message, output_message, _ = messages_of(sse.data)
    assert call_message["content"][0]["data"]["arguments"] == "{}"
    assert output_message["content"][0]["data"]["output"] == output
    (kept,) = [m for m in stored if m["type"] == "function_call"]
    assert kept["content"][0]["data"]["arguments"] == "{}"
    assert follow_up.data[-1]["status"] == "completed"
    assert text_of(follow_up.data) == "You asked about Paris."
    assert llm.rejected == 0


@pytest.mark.parametrize("name", ["", "get weather", "x" * 200, "get_weather\u00e9"])
def test_a_tool_call_naming_no_tool_a_chat_api_takes_back_is_answered_not_run(
    keys: Keys, name: str
) -> None:
    # Kept as it came, the name made a strict API refuse every later turn of the session.
    call = {"index": 0, "id": "call_1", "function": {"name": name, "arguments": "{}"}}
    llm = ArgumentCheckingLLM([[chunk({"tool_calls": [call]})]])
    sse, follow_up, _ = _call_then_follow_up(keys, llm)
    call_message, output_message, _ = messages_of(sse.data)
    assert call_message["content"][0]["data"]["name"] == "unnamed_tool"
    assert output_message["content"][0]["data"]["output"] == (
        "error: the call does not name a tool (a name is 1 to 64 letters, digits, _ or -)"
    )
    assert follow_up.data[-1]["status"] == "completed"
    assert llm.rejected == 0


async def test_arguments_kept_cut_by_an_earlier_version_are_sent_back_as_an_empty_object() -> None:
    llm = ArgumentCheckingLLM([ANSWER])
    cut = FunctionCall(call_id="call_1", name="get_weather", arguments='{"city": "Par')
    result = FunctionCallOutput(call_id="call_1", name="get_weather", output="error")
    history = [
        Message(role=Role.USER, content="Weather?"),
        Message(
            type=MessageType.FUNCTION_CALL,
            role=Role.ASSISTANT,
            content=[DataContent(data=cut.model_dump())],
        ),
        Message(
            type=MessageType.FUNCTION_CALL_OUTPUT,
            role=Role.TOOL,
            content=[DataContent(data=result.model_dump())],
        ),
        Message(role=Role.USER, content="And now?"),
    ]
    with running(llm.app) as url:
        agent = LLMAgent(base_url=f"{url}/v1", api_key="sk-test", model="scripted")
        try:
            answer = [item async for item in agent.run(history)]
        finally:
            await agent.aclose()
    assert llm.rejected == 0 and answer
    (sent,) = [m for m in llm.requests[0]["body"]["messages"] if m.get("tool_calls")]
    assert sent["tool_calls"][0]["function"]["arguments"] == "{}"


def test_surrogate_pairs_split_across_chunks_arrive_whole_and_lone_halves_as_fffd(
    keys: Keys,
) -> None:
    split_answer = [
        'data: {"choices": [{"delta": {"content": "A\\ud83d"}}]}\n\n',
        'data: {"choices": [{"delta": {"content": "\\ude00B"}}]}\n\n',
        DONE,
    ]
    calls = [
        'data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_1", "function": '
        '{"name": "get_weather", "arguments": "{\\"city\\": \\"\\ud83d"}}]}}]}\n\n',
        'data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": '
        '{"arguments": "\\ude00\\"}"}}]}}]}\n\n',
        'data: {"choices": [{"delta": {"tool_calls": [{"index": 1, "id": "call_\\udc00", '
        '"function": {"name": "x\\ud800", "arguments": "{\\"a\\": \\"\\ud800\\"}"}}]}}]}\n\n',
        DONE,
    ]
    llm = RawLLM(lambda: split_answer, lambda: calls, lambda: [data(ANSWER[1]), DONE])
    tool_calls: list[dict[str, Any]] = []
    with (
        llm_agent_server(keys, llm, tool_calls) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=10) as client,
    ):
        _, answered = stream(client, "/process", json={"input": [user_message("Smile")]})
        _, called = stream(client, "/process", json={"input": [user_message("Weather?")]})
    assert answered.data[-1]["status"] == "completed"
    assert text_of(answered.data) == "A😀B"
    assert called.data[-1]["status"] == "completed", called.data[-1]
    assert tool_calls == [{"city": "😀"}]
    call_message, _, unknown, _ = messages_of(called.data)
    assert [part["data"] for part in call_message["content"]] == [
        {"call_id": "call_1", "name": "get_weather", "arguments": '{"city": "😀"}'},
        # "x\ufffd" is no name a chat API takes back: the call is kept under another one.
        {"call_id": "call_\ufffd", "name": "unnamed_tool", "arguments": '{"a": "\ufffd"}'},
    ]
    assert unknown["content"][0]["data"]["output"].startswith("error: the call does not name")


@pytest.mark.parametrize(
    ("reason", "incomplete"),
    [("length", "max_output_tokens"), ("content_filter", "content_filter")],
)
def test_a_reply_cut_at_the_output_limit_or_by_a_filter_says_so(
    keys: Keys, reason: str, incomplete: str
) -> None:
    llm = ScriptedLLM([[chunk({"content": "Half an answ"}), chunk(finish=reason)]])
    question: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me"}]
    with (
        llm_agent_server(keys, llm, []) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=10) as client,
        openai.OpenAI(
            base_url=f"{url}/compatible-mode/v1", api_key=keys.alice, max_retries=0
        ) as sdk,
    ):
        _, sse = stream(client, "/process", json={"input": [user_message("Tell me")]})
        completion = sdk.chat.completions.create(model="llm", messages=question)
        chunks = list(sdk.chat.completions.create(model="llm", messages=question, stream=True))
        response = sdk.responses.create(model="llm", input="Tell me")
        events = list(sdk.responses.create(model="llm", input="Tell me", stream=True))
    assert sse.data[-1]["status"] == "completed"
    (answer,) = messages_of(sse.data)
    assert answer["metadata"] == {"finish_reason": reason}
    assert completion.choices[0].finish_reason == reason
    assert completion.choices[0].message.content == "Half an answ"
    assert chunks[-1].choices[0].finish_reason == reason
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == incomplete
    assert response.output_text == "Half an answ"
    assert events[-1].type == "response.incomplete"


def test_a_reply_ending_without_an_answer_fails_the_run_saying_why(keys: Keys) -> None:
    thought_to_the_limit = [chunk({"reasoning_content": "Let me think"}), chunk(finish="length")]
    filtered = [chunk({}), chunk(finish="content_filter")]
    no_choice: list[dict[str, Any]] = [
        {"choices": []},
        {"choices": [], "usage": {"prompt_tokens": 3}},
    ]
    for reply, message in (
        (thought_to_the_limit, "the model reached its output limit before answering"),
        (filtered, "the chat API's content filter withheld the answer"),
        (no_choice, "the chat API sent no completion"),
    ):
        events = run_once(keys, ScriptedLLM([reply]))
        assert events[-1]["status"] == "failed"
        assert events[-1]["error"] == {"code": "LLM_ERROR", "message": message}


def test_an_answer_ending_normally_says_no_finish_reason(keys: Keys) -> None:
    events = run_once(keys, ScriptedLLM([ANSWER]))
    (answer,) = messages_of(events)
    assert not answer.get("metadata")


def gzipped(*chunks: bytes) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    return b"".join([*map(compressor.compress, chunks), compressor.flush()])


class PackedLLM(RawLLM):
    """A chat API whose answer is ``body``, sent as it is with its ``Content-Encoding``."""

    def __init__(self, body: bytes, content_encoding: str) -> None:
        super().__init__(lambda: [])
        self.body = body
        self.content_encoding = content_encoding

    async def complete(self, request: Request) -> Response:
        self.requests.append({"body": await request.json()})
        headers = {"Content-Encoding": self.content_encoding}
        return Response(self.body, media_type="text/event-stream", headers=headers)


def test_an_answer_compressed_twice_fails_the_run_without_being_unpacked_whole(
    keys: Keys,
) -> None:
    # 256 MiB of one line in a few KiB: gzip of gzip. Each layer is unpacked a piece at a
    # time, so the line is refused once it is past the limit, not after it is all in memory.
    start, mebibyte = b'data: {"choices": [{"delta": {"content": "', b"x" * 1024**2
    bomb = gzipped(gzipped(start, *[mebibyte] * 256))
    assert len(bomb) < 64 * 1024
    tracemalloc.start()
    try:
        events = run_once(keys, PackedLLM(bomb, "gzip, gzip"), llm_max_reply_chars=1_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert events[-1]["error"] == {
        "code": "LLM_ERROR",
        "message": f"the chat API sent a line of more than {LINE_LIMIT:,} bytes",
    }
    assert peak < 64 * 1024**2


def test_a_compressed_answer_is_read_as_its_content_encoding_says(keys: Keys) -> None:
    stream_text = "".join([data(piece) for piece in ANSWER] + [DONE]).encode()
    for encoding, body in [
        ("gzip", gzipped(stream_text)),
        ("deflate", zlib.compress(stream_text)),
        ("gzip, deflate", zlib.compress(gzipped(stream_text))),
    ]:
        events = run_once(keys, PackedLLM(body, encoding))
        assert events[-1]["status"] == "completed", encoding
        (answer,) = messages_of(events)
        assert answer["content"][0]["text"] == "It is sunny in Paris."
