"""The LLM agent end to end: /process → agent → a scripted OpenAI-compatible server, all HTTP."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from openai.types.chat import ChatCompletionMessageParam

from agentscope_serverless.agents.llm import create_llm_app
from agentscope_serverless.agents.tools import AgentTool
from agentscope_serverless.http import create_app
from agentscope_serverless.settings import Settings, load_settings
from tests.support.http import (
    SSE,
    Keys,
    bearer,
    free_port,
    running,
    stream,
    text_of,
    user_message,
)
from tests.support.raw_server import raw_servers

API_KEY = "sk-test-0000"
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice]}


def usage(prompt: int, completion: int) -> dict[str, Any]:
    counts = {"prompt_tokens": prompt, "completion_tokens": completion}
    return {"choices": [], "usage": {**counts, "total_tokens": prompt + completion}}


TOOL_CALL = [
    chunk({"role": "assistant", "content": None}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
    chunk(finish="tool_calls"),
    usage(20, 5),
]
ANSWER = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "It is sunny "}),
    chunk({"content": "in Paris."}),
    chunk(finish="stop"),
    usage(30, 6),
]
FOLLOW_UP = [chunk({"content": "You asked about Paris."}), chunk(finish="stop")]


class ScriptedLLM:
    """An OpenAI-compatible chat API that streams scripted replies and records requests."""

    def __init__(self, replies: list[list[dict[str, Any]]], status: int = 200) -> None:
        self.replies = replies
        self.requests: list[dict[str, Any]] = []
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.complete)
        self.status = status
        self.code: str | None = "invalid_api_key"

    async def complete(self, request: Request) -> Response:
        self.requests.append(
            {"authorization": request.headers.get("authorization"), "body": await request.json()}
        )
        if self.status != 200:
            message = "Incorrect API key provided: sk-te****"
            detail = {"error": {"message": message, "code": self.code, "type": "sk-te****"}}
            return JSONResponse(detail, status_code=self.status)
        reply = self.replies[min(len(self.requests), len(self.replies)) - 1]

        async def lines() -> AsyncIterator[str]:
            for item in reply:
                yield f"data: {json.dumps(item)}\n\n"
                await asyncio.sleep(0.001)
            yield "data: [DONE]\n\n"

        return StreamingResponse(lines(), media_type="text/event-stream")


class StrictLLM(ScriptedLLM):
    """A scripted chat API that, like OpenAI's, answers 400 to a message list where a tool
    message does not answer a call of the assistant message before it, or a call of an
    assistant message is not answered right after it."""

    def __init__(self, replies: list[list[dict[str, Any]]]) -> None:
        super().__init__(replies)
        self.rejected: list[str] = []

    async def complete(self, request: Request) -> Response:
        messages = (await request.json())["messages"]
        pending: list[str] = []
        for message in messages:
            if message["role"] == "tool":
                if message["tool_call_id"] not in pending:
                    return self.reject("messages with role 'tool' must be a response to a call")
                pending.remove(message["tool_call_id"])
                continue
            if pending:
                return self.reject(f"tool_call_ids did not have response messages: {pending}")
            pending = [call["id"] for call in message.get("tool_calls") or []]
        return await super().complete(request)

    def reject(self, message: str) -> Response:
        self.rejected.append(message)
        return JSONResponse({"error": {"message": message}}, status_code=400)


@contextmanager
def llm_agent_server(
    keys: Keys,
    llm: ScriptedLLM,
    tool_calls: list[dict[str, Any]],
    *,
    tools: Sequence[AgentTool] = (),
    server_settings: dict[str, Any] | None = None,
    **settings: Any,
) -> Iterator[str]:
    async def get_weather(arguments: dict[str, Any]) -> str:
        tool_calls.append(arguments)
        return f"sunny, 24°C in {arguments['city']}"

    tool = AgentTool(
        name="get_weather",
        description="The weather in a city.",
        parameters=WEATHER_SCHEMA,
        call=get_weather,
    )
    with running(llm.app) as llm_url:
        agent_settings = load_settings(
            **{
                "llm_base_url": f"{llm_url}/v1",
                "llm_api_key": API_KEY,
                "llm_model": "scripted",
                **settings,
            }
        )
        app = create_llm_app([tool, *tools], settings=agent_settings)
        server = load_settings(**(server_settings or {}))
        with running(create_app(settings=server, agent_app=app, key_store=keys.store)) as url:
            yield url


async def test_a_tool_answers_arguments_nesting_too_deeply_with_an_error_text() -> None:
    calls: list[dict[str, Any]] = []

    async def record(arguments: dict[str, Any]) -> str:
        calls.append(arguments)
        return "done"

    tool = AgentTool(name="t", description="d", parameters={"type": "object"}, call=record)
    deep = '{"v": ' + "[" * 50_000 + "]" * 50_000 + "}"
    assert await tool.invoke(deep) == "error: the arguments nest deeper than 100 levels"
    assert await tool.invoke('{"v": [[1]]}') == "done"
    assert calls == [{"v": [[1]]}]


def messages_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["object"] == "message" and e["status"] == "completed"]


def test_streams_tokens_runs_one_tool_call_and_answers(keys: Keys) -> None:
    llm = ScriptedLLM([TOOL_CALL, ANSWER, FOLLOW_UP])
    tool_calls: list[dict[str, Any]] = []
    with (
        llm_agent_server(keys, llm, tool_calls) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=10) as client,
    ):
        body = {"input": [user_message("Weather in Paris?")], "session_id": "weather"}
        _, sse = stream(client, "/process", json=body)
        events = sse.data
        assert tool_calls == [{"city": "Paris"}]
        call, output, answer = messages_of(events)
        assert (call["type"], call["role"]) == ("function_call", "assistant")
        assert call["content"][0]["data"] == {
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        }
        assert (output["type"], output["role"]) == ("function_call_output", "tool")
        assert output["content"][0]["data"] == {
            "call_id": "call_1",
            "name": "get_weather",
            "output": "sunny, 24°C in Paris",
        }
        deltas = [e["text"] for e in events if e.get("delta") and e.get("msg_id") == answer["id"]]
        assert deltas == ["It is sunny ", "in Paris."]
        assert answer["content"][0]["text"] == "It is sunny in Paris."
        final = events[-1]
        assert final["status"] == "completed"
        assert final["usage"] == {"prompt_tokens": 50, "completion_tokens": 11, "total_tokens": 61}

        first, second = (r["body"] for r in llm.requests)
        assert llm.requests[0]["authorization"] == f"Bearer {API_KEY}"
        assert (first["model"], first["stream"]) == ("scripted", True)
        assert first["tools"] == [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "The weather in a city.",
                    "parameters": WEATHER_SCHEMA,
                },
            }
        ]
        assert [m["role"] for m in first["messages"]] == ["system", "user"]
        assert second["messages"][-2]["tool_calls"][0]["id"] == "call_1"
        assert second["messages"][-1] == {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": "sunny, 24°C in Paris",
        }

        body = {"input": [user_message("What did I ask?")], "session_id": "weather"}
        _, follow_up = stream(client, "/process", json=body)
        assert text_of(follow_up.data) == "You asked about Paris."
        history = llm.requests[2]["body"]["messages"]
        assert [m["role"] for m in history] == [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
        ]
        assert history[4]["content"] == "It is sunny in Paris."


def test_a_model_that_keeps_calling_tools_is_stopped(keys: Keys) -> None:
    llm = ScriptedLLM([TOOL_CALL])
    tool_calls: list[dict[str, Any]] = []
    with (
        llm_agent_server(keys, llm, tool_calls, llm_max_iterations=2) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=10) as client,
    ):
        _, sse = stream(client, "/process", json={"input": [user_message("loop")]})
    assert sse.data[-1]["status"] == "failed"
    assert sse.data[-1]["error"]["code"] == "AGENT_MAX_ITERATIONS"
    # The last round's call is not run: no model call is left to read its result.
    assert len(llm.requests) == 2 and len(tool_calls) == 1


def test_the_tokens_of_a_failed_run_are_on_its_response_and_in_its_metrics(
    keys: Keys, capfd: pytest.CaptureFixture[str]
) -> None:
    llm = ScriptedLLM([TOOL_CALL])  # two model calls of 20 + 5 tokens, then it fails
    namespace = {"metrics_namespace": "AgentScopeServerless"}
    with (
        llm_agent_server(keys, llm, [], llm_max_iterations=2, server_settings=namespace) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=10) as client,
    ):
        capfd.readouterr()
        _, sse = stream(client, "/process", json={"input": [user_message("loop")]})
    assert sse.data[-1]["error"]["code"] == "AGENT_MAX_ITERATIONS"
    spent = {"prompt_tokens": 40, "completion_tokens": 10, "total_tokens": 50}
    assert sse.data[-1]["usage"] == spent
    (record,) = [
        json.loads(line) for line in capfd.readouterr().out.splitlines() if '"_aws"' in line
    ]
    assert (record["Status"], record["PromptTokens"], record["CompletionTokens"]) == (
        "failed",
        40,
        10,
    )


def test_an_api_error_fails_the_run_without_leaking_the_reply(keys: Keys) -> None:
    llm = ScriptedLLM([], status=401)
    with (
        llm_agent_server(keys, llm, []) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=10) as client,
    ):
        _, sse = stream(client, "/process", json={"input": [user_message("hi")]})
    assert sse.data[-1]["error"] == {
        "code": "LLM_ERROR",
        "message": "the chat API answered HTTP 401 (invalid_api_key)",
    }
    assert "sk-te" not in sse.raw


def test_an_api_error_is_named_only_by_a_name_that_cannot_hold_a_secret(keys: Keys) -> None:
    failures = []
    for code in ("sk-proj-abc123", "Bearer sk-live", "x" * 65, None, 42):
        llm = ScriptedLLM([], status=400)
        llm.code = code  # type: ignore[assignment]
        with (
            llm_agent_server(keys, llm, []) as url,
            httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=10) as client,
        ):
            _, sse = stream(client, "/process", json={"input": [user_message("hi")]})
        failures.append(sse.data[-1]["error"]["message"])
        assert "sk-" not in sse.raw
    assert failures == ["the chat API answered HTTP 400"] * 5


def test_a_history_window_that_cuts_off_a_tool_call_still_makes_a_valid_request(
    keys: Keys,
) -> None:
    llm = StrictLLM([TOOL_CALL, ANSWER, FOLLOW_UP])
    window = {"agent_history_window": 2}
    with (
        llm_agent_server(keys, llm, [], server_settings=window) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=10) as client,
    ):
        body = {"input": [user_message("Weather in Paris?")], "session_id": "window"}
        _, sse = stream(client, "/process", json=body)
        assert sse.data[-1]["status"] == "completed"
        body = {"input": [user_message("What did I ask?")], "session_id": "window"}
        _, follow_up = stream(client, "/process", json=body)
    assert llm.rejected == []
    assert follow_up.data[-1]["status"] == "completed"
    assert text_of(follow_up.data) == "You asked about Paris."
    history = llm.requests[2]["body"]["messages"]
    assert [m["role"] for m in history if m["role"] != "system"] == ["assistant", "user"]
    assert history[-2]["content"] == "It is sunny in Paris."


def test_a_tool_call_canceled_before_its_result_leaves_a_session_the_model_accepts(
    keys: Keys,
) -> None:
    llm = StrictLLM([TOOL_CALL, FOLLOW_UP])
    started = threading.Event()

    async def forecast(arguments: dict[str, Any]) -> str:
        started.set()
        await asyncio.sleep(60)
        return "rain"

    slow = AgentTool(name="forecast", description="d", parameters={"type": "object"}, call=forecast)
    calls_forecast = json.loads(json.dumps(TOOL_CALL).replace("get_weather", "forecast"))
    llm.replies = [calls_forecast, FOLLOW_UP]
    with (
        llm_agent_server(keys, llm, [], tools=[slow]) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=10) as client,
    ):
        body = {"input": [user_message("Forecast?")], "session_id": "canceled"}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(stream, client, "/process", json=body)
            assert started.wait(10)
            # A run is listed once stored (within its first write delay).
            deadline = time.monotonic() + 10
            listed = {"session_id": "canceled"}
            while not (runs := client.get("/runs", params=listed).json()["items"]):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert client.post(f"/runs/{runs[0]['id']}/cancel").status_code == 202
            assert first.result()[1].data[-1]["status"] == "canceled"
        body = {"input": [user_message("What did I ask?")], "session_id": "canceled"}
        _, follow_up = stream(client, "/process", json=body)
    assert llm.rejected == []
    assert follow_up.data[-1]["status"] == "completed"
    history = llm.requests[1]["body"]["messages"]
    assert [m["role"] for m in history] == ["system", "user", "assistant", "tool", "user"]
    assert history[3]["tool_call_id"] == "call_1"
    assert "no result" in history[3]["content"]


class PlainReplyLLM(ScriptedLLM):
    """A chat API answering each request with the next of ``answers``, as they are (not
    streamed)."""

    def __init__(self, answers: list[Response]) -> None:
        super().__init__([])
        self.answers = answers

    async def complete(self, request: Request) -> Response:
        self.requests.append({"body": await request.json()})
        return self.answers[len(self.requests) - 1]


def test_a_chat_api_answering_with_a_whole_json_completion_is_understood(keys: Keys) -> None:
    def completion(message: dict[str, Any], prompt: int, completion: int) -> JSONResponse:
        counts = {"prompt_tokens": prompt, "completion_tokens": completion}
        return JSONResponse(
            {
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {**counts, "total_tokens": prompt + completion},
            }
        )

    call = {"id": "call_9", "type": "function"}
    call["function"] = {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    llm = PlainReplyLLM(
        [
            completion({"role": "assistant", "content": None, "tool_calls": [call]}, 10, 2),
            completion({"role": "assistant", "content": "Snow in Oslo."}, 20, 4),
        ]
    )
    tool_calls: list[dict[str, Any]] = []
    with (
        llm_agent_server(keys, llm, tool_calls) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=10) as client,
    ):
        _, sse = stream(client, "/process", json={"input": [user_message("Oslo?")]})
    assert tool_calls == [{"city": "Oslo"}]
    assert text_of(sse.data) == "Snow in Oslo."
    assert sse.data[-1]["status"] == "completed"
    assert sse.data[-1]["usage"] == {
        "prompt_tokens": 30,
        "completion_tokens": 6,
        "total_tokens": 36,
    }
    assert llm.requests[1]["body"]["messages"][-1]["tool_call_id"] == "call_9"


def test_a_redirect_or_a_web_page_from_the_chat_api_fails_the_run(keys: Keys) -> None:
    moved = Response(status_code=301, headers={"Location": "https://elsewhere.invalid/v1"})
    page = Response("<html><body>Welcome</body></html>", media_type="text/html")
    llm = PlainReplyLLM([moved, page])
    with (
        llm_agent_server(keys, llm, []) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=10) as client,
    ):
        _, redirected = stream(client, "/process", json={"input": [user_message("hi")]})
        _, web_page = stream(client, "/process", json={"input": [user_message("hi")]})
    assert redirected.data[-1]["status"] == "failed"
    assert redirected.data[-1]["error"] == {
        "code": "LLM_ERROR",
        "message": "the chat API answered HTTP 301",
    }
    assert web_page.data[-1]["status"] == "failed"
    assert web_page.data[-1]["error"] == {
        "code": "LLM_ERROR",
        "message": "the chat API sent no completion",
    }


def weather_call(city: str, **fields: Any) -> dict[str, Any]:
    arguments = json.dumps({"city": city})
    return {
        **fields,
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }


def test_parallel_tool_calls_streamed_without_distinct_indexes_stay_apart(keys: Keys) -> None:
    same_index = [
        chunk({"tool_calls": [weather_call("Paris", index=0, id="call_a")]}),
        chunk({"tool_calls": [weather_call("Rome", index=0, id="call_b")]}),
        chunk(finish="tool_calls"),
    ]
    no_index = [
        chunk(
            {"tool_calls": [weather_call("Oslo", id="call_c"), weather_call("Lima", id="call_d")]}
        ),
        chunk(finish="tool_calls"),
    ]
    no_id = [
        chunk({"tool_calls": [weather_call("Kyiv", index=0), weather_call("Nice", index=1)]}),
        chunk(finish="tool_calls"),
    ]
    llm = ScriptedLLM([same_index, ANSWER, no_index, ANSWER, no_id, ANSWER])
    tool_calls: list[dict[str, Any]] = []
    with (
        llm_agent_server(keys, llm, tool_calls) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=10) as client,
    ):
        for _ in range(3):
            _, sse = stream(client, "/process", json={"input": [user_message("Weather?")]})
            assert sse.data[-1]["status"] == "completed"
    assert tool_calls == [{"city": c} for c in ("Paris", "Rome", "Oslo", "Lima", "Kyiv", "Nice")]
    answered = [llm.requests[i]["body"]["messages"][-3:] for i in (1, 3, 5)]
    assert [m["role"] for m in answered[0]] == ["assistant", "tool", "tool"]
    for call, *results in answered:
        ids = [c["id"] for c in call["tool_calls"]]
        assert len(set(ids)) == 2 and all(ids)
        assert [r["tool_call_id"] for r in results] == ids
    assert [c["id"] for c in answered[0][0]["tool_calls"]] == ["call_a", "call_b"]
    assert [c["id"] for c in answered[1][0]["tool_calls"]] == ["call_c", "call_d"]


def test_a_tool_returning_neither_text_nor_json_answers_the_model_with_an_error(
    keys: Keys,
) -> None:
    async def fetch(arguments: dict[str, Any]) -> Any:
        return b"\x89PNG"

    raw = AgentTool(name="fetch", description="d", parameters={"type": "object"}, call=fetch)
    calls_fetch = json.loads(json.dumps(TOOL_CALL).replace("get_weather", "fetch"))
    llm = ScriptedLLM([calls_fetch, FOLLOW_UP])
    with (
        llm_agent_server(keys, llm, [], tools=[raw]) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=10) as client,
    ):
        _, sse = stream(client, "/process", json={"input": [user_message("Fetch it")]})
    assert sse.data[-1]["status"] == "completed"
    _, output, _ = messages_of(sse.data)
    assert output["content"][0]["data"]["output"] == "error: the tool returned bytes, not text"
    assert (
        llm.requests[1]["body"]["messages"][-1]["content"] == output["content"][0]["data"]["output"]
    )


THINKING = [
    chunk({"role": "assistant", "content": None, "reasoning_content": "The user greets. "}),
    chunk({"reasoning_content": "Answer briefly."}),
    chunk({"content": "Hello"}),
    chunk({"content": " there."}),
    chunk(finish="stop"),
]


def test_a_thinking_models_reasoning_streams_as_its_own_message_and_is_not_sent_back(
    keys: Keys,
) -> None:
    llm = ScriptedLLM([THINKING, FOLLOW_UP])
    with (
        llm_agent_server(keys, llm, []) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=10) as client,
    ):
        body = {"input": [user_message("hi")], "session_id": "thinking"}
        _, sse = stream(client, "/process", json=body)
        reasoning, answer = messages_of(sse.data)
        assert (reasoning["type"], reasoning["role"]) == ("reasoning", "assistant")
        assert reasoning["content"][0]["text"] == "The user greets. Answer briefly."
        assert (answer["type"], answer["content"][0]["text"]) == ("message", "Hello there.")
        # The reasoning streamed as deltas of its own message, before the answer.
        deltas = [(e["msg_id"], e["text"]) for e in sse.data if e.get("delta")]
        assert deltas == [
            (reasoning["id"], "The user greets. "),
            (reasoning["id"], "Answer briefly."),
            (answer["id"], "Hello"),
            (answer["id"], " there."),
        ]
        body = {"input": [user_message("and now?")], "session_id": "thinking"}
        _, follow_up = stream(client, "/process", json=body)
        assert follow_up.data[-1]["status"] == "completed"
        kept = client.get("/sessions/thinking/messages").json()["items"]
    assert [m["type"] for m in kept] == ["message", "reasoning", "message", "message", "message"]
    sent = llm.requests[1]["body"]["messages"]
    assert [(m["role"], m["content"]) for m in sent[1:] if m["role"] != "system"] == [
        ("user", "hi"),
        ("assistant", "Hello there."),
        ("user", "and now?"),
    ]
    assert "Answer briefly" not in json.dumps(sent)


class ContextLimitedLLM(ScriptedLLM):
    """A scripted chat API that, like every model, answers 400 to messages longer than its
    context (here 64,000 characters of JSON)."""

    CONTEXT = 64_000

    async def complete(self, request: Request) -> Response:
        if len(json.dumps((await request.json())["messages"])) > self.CONTEXT:
            self.requests.append({"body": None})
            return JSONResponse({"error": {"message": "context length exceeded"}}, 400)
        return await super().complete(request)


def test_a_huge_tool_output_reaches_the_model_cut_and_the_client_whole(keys: Keys) -> None:
    # A log or a file dumped by a tool: a model's context could never hold it, and the
    # session keeps it, so every later turn would fail the same way.
    log = "".join(f"line {i}: ok\n" for i in range(100_000)) + "Traceback: KeyError 'x'"

    async def read_log(arguments: dict[str, Any]) -> str:
        return log

    tool = AgentTool(name="read_log", description="d", parameters={"type": "object"}, call=read_log)
    calls_read = json.loads(json.dumps(TOOL_CALL).replace("get_weather", "read_log"))
    llm = ContextLimitedLLM([calls_read, ANSWER, FOLLOW_UP])
    with (
        llm_agent_server(keys, llm, [], tools=[tool], llm_max_tool_output_chars=5_000) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client,
    ):
        body = {"input": [user_message("Why did it fail?")], "session_id": "log"}
        _, sse = stream(client, "/process", json=body)
        assert sse.data[-1]["status"] == "completed", sse.data[-1]
        _, output, _ = messages_of(sse.data)
        assert output["content"][0]["data"]["output"] == log
        body = {"input": [user_message("And now?")], "session_id": "log"}
        _, follow_up = stream(client, "/process", json=body)
        assert follow_up.data[-1]["status"] == "completed", follow_up.data[-1]
        stored = client.get("/sessions/log/messages", params={"limit": 10}).json()["items"]
    assert [r["body"] is not None for r in llm.requests] == [True, True, True]
    for request in llm.requests[1:]:
        (seen,) = [m["content"] for m in request["body"]["messages"] if m["role"] == "tool"]
        assert len(seen) <= 5_000
        assert seen.startswith("line 0: ok\nline 1: ok\n")
        assert seen.endswith("Traceback: KeyError 'x'")
        cut = int(seen.split("[... ")[1].split(" characters")[0].replace(",", ""))
        head, tail = seen.split("\n\n[... ")[0], seen.split("here ...]\n\n")[1]
        assert head + log[len(head) : len(head) + cut] + tail == log
    (kept,) = [m for m in stored if m["type"] == "function_call_output"]
    assert kept["content"][0]["data"]["output"] == log


def test_the_oldest_history_is_left_out_of_a_request_past_the_context_budget(
    keys: Keys,
) -> None:
    # Three pasted documents: together more than the model's context (64,000 characters).
    llm = ContextLimitedLLM([ANSWER])
    budget = 55_000
    with (
        llm_agent_server(keys, llm, [], llm_max_context_chars=budget) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client,
    ):
        for number in range(3):
            text = f"document {number}: " + "lorem ipsum " * 2_100
            body = {"input": [user_message(text)], "session_id": "docs"}
            _, sse = stream(client, "/process", json=body)
            assert sse.data[-1]["status"] == "completed", sse.data[-1]
    last = llm.requests[-1]["body"]["messages"]
    assert len(json.dumps(last, ensure_ascii=False)) <= budget
    assert last[0]["role"] == "system"
    texts = [m["content"] for m in last[1:]]
    # The newest turns that fit, the new input last; the first document left out.
    assert texts[-1].startswith("document 2: ")
    assert texts[-3].startswith("document 1: ")
    assert not any(t.startswith("document 0: ") for t in texts)
    # What is kept starts at a user's message: the answer to the first document is left out.
    assert [m["role"] for m in last[1:]] == ["user", "assistant", "user"]


def test_recalled_memories_take_at_most_a_quarter_of_the_budget(keys: Keys) -> None:
    llm = ScriptedLLM([ANSWER])
    pasted = "my tea notes: " + "oolong " * 1_000
    with (
        llm_agent_server(keys, llm, [], llm_max_context_chars=4_000) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client,
    ):
        for number, text in enumerate([pasted, "I like green tea", "Which tea?"]):
            body = {"input": [user_message(text)], "session_id": f"s{number}"}
            _, sse = stream(client, "/process", json=body)
            assert sse.data[-1]["status"] == "completed"
    last = llm.requests[-1]["body"]["messages"]
    (note,) = [m["content"] for m in last[1:] if m["role"] == "system"]
    assert "I like green tea" in note and "oolong" not in note
    assert len(note) <= 1_000


def test_a_memory_is_recalled_once_and_not_when_the_conversation_holds_it(keys: Keys) -> None:
    # A chat page that resends its whole conversation with each call, in a new session each
    # time, leaves a copy of each earlier message in memory per call.
    llm = ScriptedLLM([ANSWER])
    told, asked = "I live in Paris near the river", "Where do I live, near which river?"
    with (
        llm_agent_server(keys, llm, []) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client,
    ):
        for number in range(3):
            body = {"input": [user_message(told)], "session_id": f"copy{number}"}
            _, sse = stream(client, "/process", json=body)
            assert sse.data[-1]["status"] == "completed"
        for session in ("elsewhere", "copy0"):
            body = {"input": [user_message(asked)], "session_id": session}
            _, sse = stream(client, "/process", json=body)
            assert sse.data[-1]["status"] == "completed"
    elsewhere, in_copy = (request["body"]["messages"] for request in llm.requests[-2:])
    (note,) = [m["content"] for m in elsewhere[1:] if m["role"] == "system"]
    assert note.count(told) == 1
    # The conversation holds it already (another copy of it, in its own session).
    assert not any(told in m["content"] for m in in_copy if m["role"] == "system")


def test_what_the_budget_leaves_out_of_a_long_session_can_be_recalled_from_memory(
    keys: Keys,
) -> None:
    llm = ScriptedLLM([ANSWER])
    notes = "My tea notes: oolong from the north, brewed at 85 degrees."
    with (
        llm_agent_server(keys, llm, [], llm_max_context_chars=4_000) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client,
    ):
        for text in [notes, "a " * 700, "b " * 700, "Which oolong was it?"]:
            body = {"input": [user_message(text)], "session_id": "long-memory"}
            _, sse = stream(client, "/process", json=body)
            assert sse.data[-1]["status"] == "completed"
    last = llm.requests[-1]["body"]["messages"]
    conversation = [m["content"] for m in last if m["role"] != "system"]
    (note,) = [m["content"] for m in last[1:] if m["role"] == "system"]
    # Left out of the conversation by the budget, the notes come back as a memory.
    assert not any(notes in text for text in conversation)
    assert notes in note
    assert conversation[-1] == "Which oolong was it?"
    assert len(json.dumps(last, ensure_ascii=False)) <= 4_000


def test_a_new_input_longer_than_the_budget_still_goes_alone(keys: Keys) -> None:
    llm = ScriptedLLM([ANSWER])
    with (
        llm_agent_server(keys, llm, [], llm_max_context_chars=1_000) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client,
    ):
        for text in ("hello", "x" * 5_000):
            body = {"input": [user_message(text)], "session_id": "long"}
            _, sse = stream(client, "/process", json=body)
            assert sse.data[-1]["status"] == "completed"
    assert [m["role"] for m in llm.requests[0]["body"]["messages"]] == ["system", "user"]
    last = llm.requests[1]["body"]["messages"]
    assert [m["role"] for m in last] == ["system", "user"]
    assert last[1]["content"] == "x" * 5_000


def test_content_streamed_as_a_list_of_parts_is_answered_with_its_text_parts(keys: Keys) -> None:
    thinking = {"type": "thinking", "thinking": [{"type": "text", "text": "Hmm."}]}
    parts = [
        chunk({"role": "assistant", "content": [thinking]}),
        chunk({"content": [{"type": "text", "text": "Forty"}]}),
        chunk({"content": [{"type": "text", "text": "-two."}]}),
        chunk(finish="stop"),
    ]
    broken = [chunk({"content": "Half"}), {"choices": [None]}]
    llm = ScriptedLLM([parts, broken])
    with (
        llm_agent_server(keys, llm, []) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=10) as client,
    ):
        _, sse = stream(client, "/process", json={"input": [user_message("The answer?")]})
        _, malformed = stream(client, "/process", json={"input": [user_message("Again?")]})
    assert sse.data[-1]["status"] == "completed"
    assert text_of(sse.data) == "Forty-two."
    assert malformed.data[-1]["error"] == {
        "code": "LLM_ERROR",
        "message": "the chat API sent a chunk of an unexpected shape",
    }


class KeepAliveLLM(ScriptedLLM):
    """A chat API that opens its stream, then sends only keep-alive comments, for ever."""

    async def complete(self, request: Request) -> Response:
        self.requests.append({"body": await request.json()})

        async def comments() -> AsyncIterator[str]:
            while True:
                yield ": keep-alive\n\n"
                await asyncio.sleep(0.05)

        return StreamingResponse(comments(), media_type="text/event-stream")


def test_a_stream_of_keep_alive_comments_without_data_fails_at_the_timeout(keys: Keys) -> None:
    with (
        llm_agent_server(keys, KeepAliveLLM([]), [], llm_timeout_seconds=0.5) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client,
    ):
        _, sse = stream(client, "/process", json={"input": [user_message("hi")]})
    assert sse.data[-1]["status"] == "failed"
    error = sse.data[-1]["error"]
    assert error["code"] == "LLM_UNAVAILABLE"
    assert re.fullmatch(
        r"cannot reach the chat API at http://127\.0\.0\.1:\d+ \(LLM_BASE_URL\): it sent no "
        r"data for 0\.5 s",
        error["message"],
    ), error


def test_a_chat_api_not_reached_is_named_by_its_host_and_never_its_credentials(
    keys: Keys,
) -> None:
    # The error said "cannot reach the chat API (ConnectError)": which one, and which setting
    # names it, the user had to guess.
    port = free_port()
    base = f"http://someone:hush@127.0.0.1:{port}/v1?api-key=hush"
    app = create_llm_app(
        [],
        settings=load_settings(
            llm_base_url=base, llm_api_key=API_KEY, llm_model="m", llm_max_retries=0
        ),
    )
    with (
        running(create_app(settings=load_settings(), agent_app=app, key_store=keys.store)) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client,
    ):
        _, sse = stream(client, "/process", json={"input": [user_message("hi")]})
    assert sse.data[-1]["error"] == {
        "code": "LLM_UNAVAILABLE",
        "message": f"cannot reach the chat API at http://127.0.0.1:{port} (LLM_BASE_URL): "
        "ConnectError",
    }


def test_a_key_no_header_can_hold_fails_at_once_as_not_sent_never_as_not_reached(
    keys: Keys,
) -> None:
    # A key with a newline in it: httpx refuses the header before sending anything. The run
    # was retried, then failed saying the chat API could not be reached (LocalProtocolError).
    llm = ScriptedLLM([ANSWER])
    with (
        llm_agent_server(keys, llm, [], llm_api_key="sk-test\n0000", llm_max_retries=2) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client,
    ):
        started = time.monotonic()
        _, sse = stream(client, "/process", json={"input": [user_message("hi")]})
        took = time.monotonic() - started
    error = sse.data[-1]["error"]
    assert error["code"] == "LLM_ERROR", error
    assert "cannot reach" not in error["message"] and "cannot be sent" in error["message"]
    assert "sk-test" not in error["message"] and "0000" not in error["message"]
    assert llm.requests == [] and took < 0.5  # not retried (0.5 s before the first retry)


class FlakyLLM(ScriptedLLM):
    """A chat API whose first answers are failures (status, headers), then scripted replies."""

    def __init__(
        self, failures: list[tuple[int, dict[str, str]]], replies: list[list[dict[str, Any]]]
    ) -> None:
        super().__init__(replies)
        self.failures = failures

    async def complete(self, request: Request) -> Response:
        if len(self.requests) < len(self.failures):
            self.requests.append({"body": await request.json()})
            status, headers = self.failures[len(self.requests) - 1]
            detail = {"error": {"message": "try later", "code": "rate_limit_exceeded"}}
            return JSONResponse(detail, status_code=status, headers=headers)
        return await self.scripted(request)

    async def scripted(self, request: Request) -> Response:
        self.requests.append({"body": await request.json()})
        reply = self.replies[min(len(self.requests) - len(self.failures), len(self.replies)) - 1]

        async def lines() -> AsyncIterator[str]:
            for item in reply:
                yield f"data: {json.dumps(item)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(lines(), media_type="text/event-stream")


def run_once(keys: Keys, llm: ScriptedLLM, **settings: Any) -> list[dict[str, Any]]:
    """The events of one /process run of the LLM agent on ``llm``."""
    with (
        llm_agent_server(keys, llm, [], **settings) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client,
    ):
        _, sse = stream(client, "/process", json={"input": [user_message("hi")]})
    return sse.data


def test_a_rate_limit_and_a_server_error_are_retried_as_the_api_asks(keys: Keys) -> None:
    llm = FlakyLLM([(429, {"Retry-After": "0"}), (503, {"retry-after-ms": "20"})], [ANSWER])
    events = run_once(keys, llm)
    assert events[-1]["status"] == "completed"
    (answer,) = messages_of(events)
    assert answer["content"][0]["text"] == "It is sunny in Paris."
    assert len(llm.requests) == 3
    assert llm.requests[0]["body"] == llm.requests[2]["body"]


def test_retries_stop_after_llm_max_retries(keys: Keys) -> None:
    llm = FlakyLLM([(429, {"Retry-After": "0"})] * 5, [ANSWER])
    events = run_once(keys, llm, llm_max_retries=2)
    assert events[-1]["status"] == "failed"
    assert events[-1]["error"] == {
        "code": "LLM_ERROR",
        "message": "the chat API answered HTTP 429 (rate_limit_exceeded)",
    }
    assert len(llm.requests) == 3
    unretried = FlakyLLM([(503, {"Retry-After": "0"})], [ANSWER])
    assert run_once(keys, unretried, llm_max_retries=0)[-1]["status"] == "failed"
    assert len(unretried.requests) == 1


def test_an_answer_that_cannot_change_or_says_not_to_retry_is_not_retried(keys: Keys) -> None:
    for status, headers in [
        (400, {"Retry-After": "0"}),
        (401, {}),
        (404, {}),
        (503, {"x-should-retry": "false"}),
    ]:
        llm = FlakyLLM([(status, headers)], [ANSWER])
        events = run_once(keys, llm)
        message = f"the chat API answered HTTP {status} (rate_limit_exceeded)"
        assert events[-1]["error"]["message"] == message
        assert len(llm.requests) == 1
    told = FlakyLLM([(400, {"x-should-retry": "true", "Retry-After": "0"})], [ANSWER])
    assert run_once(keys, told)[-1]["status"] == "completed"
    assert len(told.requests) == 2


class BrokenStreamLLM(FlakyLLM):
    """A chat API whose first stream breaks (the connection drops) after ``sent`` chunks."""

    def __init__(self, sent: int) -> None:
        super().__init__([], [ANSWER])
        self.sent = sent

    async def complete(self, request: Request) -> Response:
        if self.requests:
            return await self.scripted(request)
        self.requests.append({"body": await request.json()})

        async def broken() -> AsyncIterator[str]:
            for item in ANSWER[: self.sent]:
                yield f"data: {json.dumps(item)}\n\n"
            await asyncio.sleep(0.05)
            raise RuntimeError("the connection drops")

        return StreamingResponse(broken(), media_type="text/event-stream")


def test_a_stream_broken_before_its_first_chunk_is_retried_and_after_it_is_not(
    keys: Keys,
) -> None:
    early = BrokenStreamLLM(sent=0)
    events = run_once(keys, early)
    assert events[-1]["status"] == "completed"
    assert len(early.requests) == 2
    late = BrokenStreamLLM(sent=2)  # "It is sunny " reached the client: no second answer
    events = run_once(keys, late)
    assert events[-1]["status"] == "failed"
    assert events[-1]["error"]["code"] == "LLM_UNAVAILABLE"
    assert len(late.requests) == 1


def with_usage(item: dict[str, Any], prompt: int, completion: int) -> dict[str, Any]:
    return {**item, "usage": usage(prompt, completion)["usage"]}


def test_usage_repeated_as_a_running_total_on_every_chunk_counts_once_per_call(
    keys: Keys,
) -> None:
    # vLLM's continuous_usage_stats (and some proxies) send the total so far with every
    # chunk: adding them up counted each call's tokens once per chunk.
    llm = ScriptedLLM(
        [
            [
                with_usage(TOOL_CALL[1], 20, 1),
                with_usage(TOOL_CALL[2], 20, 2),
                with_usage(TOOL_CALL[3], 20, 3),
                with_usage(TOOL_CALL[4], 20, 3),
            ],
            [
                with_usage(chunk({"content": "a"}), 30, 1),
                with_usage(chunk({"content": "b"}, "stop"), 30, 2),
                usage(30, 2),
            ],
        ]
    )
    events = run_once(keys, llm)
    assert events[-1]["status"] == "completed"
    assert events[-1]["usage"] == {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55}


class EmptyChunksLLM(ScriptedLLM):
    """A chat API that opens its stream, then sends chunks without any choice for 10 s, and
    only then its answer."""

    async def complete(self, request: Request) -> Response:
        self.requests.append({"body": await request.json()})

        async def empty() -> AsyncIterator[str]:
            yield f"data: {json.dumps(chunk({'role': 'assistant', 'content': ''}))}\n\n"
            for _ in range(200):
                yield 'data: {"choices": []}\n\n'
                await asyncio.sleep(0.05)
            yield f"data: {json.dumps(chunk({'content': 'Late.'}, 'stop'))}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(empty(), media_type="text/event-stream")


class TricklingJSONLLM(ScriptedLLM):
    """A chat API answering with a whole completion as JSON, one byte every 50 ms (15 s in
    all: far longer than any deadline a test sets)."""

    async def complete(self, request: Request) -> Response:
        self.requests.append({"body": await request.json()})
        message = {"role": "assistant", "content": "Slowly."}
        completion = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
        body = " " * 210 + json.dumps(completion)

        async def trickle() -> AsyncIterator[bytes]:
            for byte in body.encode():
                yield bytes([byte])
                await asyncio.sleep(0.05)

        return StreamingResponse(trickle(), media_type="application/json")


def test_a_stream_of_chunks_bringing_nothing_fails_at_the_timeout(keys: Keys) -> None:
    # Each empty chunk restarted the wait: the run was held for as long as they came.
    started = time.monotonic()
    events = run_once(keys, EmptyChunksLLM([]), llm_timeout_seconds=0.5)
    assert time.monotonic() - started < 6
    assert events[-1]["status"] == "failed"
    assert events[-1]["error"]["code"] == "LLM_UNAVAILABLE"
    assert "it sent no data for 0.5 s" in events[-1]["error"]["message"]


def test_a_completion_not_streamed_must_arrive_whole_within_the_timeout(keys: Keys) -> None:
    # A byte at a time, each within the read timeout, it had no deadline at all.
    started = time.monotonic()
    events = run_once(keys, TricklingJSONLLM([]), llm_timeout_seconds=0.5)
    assert time.monotonic() - started < 10  # the completion takes 15 s
    assert events[-1]["status"] == "failed"
    assert events[-1]["error"]["code"] == "LLM_UNAVAILABLE"
    assert re.fullmatch(
        r"cannot reach the chat API at http://127\.0\.0\.1:\d+ \(LLM_BASE_URL\): its "
        r"completion was not whole within 0\.5 s",
        events[-1]["error"]["message"],
    ), events[-1]["error"]


class TricklingErrorLLM(ScriptedLLM):
    """A chat API answering HTTP 500 at once, then its error body one byte every 50 ms."""

    async def complete(self, request: Request) -> Response:
        self.requests.append({"body": await request.json()})
        body = " " * 200 + json.dumps({"error": {"code": "server_error"}})

        async def trickle() -> AsyncIterator[bytes]:
            for byte in body.encode():
                yield bytes([byte])
                await asyncio.sleep(0.05)

        return StreamingResponse(trickle(), status_code=500, media_type="application/json")


def process_once(keys: Keys, agent_settings: Settings) -> tuple[SSE, float]:
    """The events of one /process run of an LLM agent app with ``agent_settings``, and how
    many seconds the run took."""
    app = create_llm_app([], settings=agent_settings)
    with (
        running(create_app(settings=load_settings(), agent_app=app, key_store=keys.store)) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client,
    ):
        started = time.monotonic()
        _, sse = stream(client, "/process", json={"input": [user_message("hi")]})
        return sse, time.monotonic() - started


def test_an_error_body_trickling_in_fails_the_run_at_the_timeout(keys: Keys) -> None:
    # Each byte reset the read timeout: the run waited for the whole body (up to 64 KiB).
    llm = TricklingErrorLLM([])
    with running(llm.app) as llm_url:
        settings = load_settings(
            llm_base_url=f"{llm_url}/v1",
            llm_api_key=API_KEY,
            llm_model="m",
            llm_timeout_seconds=0.5,
            llm_max_retries=0,
        )
        sse, took = process_once(keys, settings)
    assert took < 6  # the body trickles for 12 s: room for a busy machine, not for that
    assert sse.data[-1]["error"] == {
        "code": "LLM_ERROR",
        "message": "the chat API answered HTTP 500",
    }
    assert len(llm.requests) == 1
    assert API_KEY not in sse.raw


def test_headers_trickling_in_fail_the_run_at_the_timeout(keys: Keys) -> None:
    # A header growing a byte at a time held the run as long as it grew.
    def trickle_headers(connection: socket.socket, head: bytes) -> None:
        connection.sendall(b"HTTP/1.1 200 OK\r\nX-Pad: ")
        for _ in range(200):
            connection.sendall(b"a")
            time.sleep(0.05)

    with raw_servers() as start:
        llm = start(trickle_headers)
        llm_url = llm.url
        settings = load_settings(
            llm_base_url=f"{llm_url}/v1",
            llm_api_key=API_KEY,
            llm_model="m",
            llm_timeout_seconds=0.5,
            llm_max_retries=1,
        )
        sse, took = process_once(keys, settings)
    # Two calls of 0.5 s and a backoff of at most 0.5 s between them, against the 10 s each
    # call's headers trickle for: room for a busy machine.
    assert took < 7
    assert sse.data[-1]["error"] == {
        "code": "LLM_UNAVAILABLE",
        "message": f"cannot reach the chat API at {llm_url} (LLM_BASE_URL): it did not answer "
        "within 0.5 s",
    }
    assert llm.requests == 2
    assert API_KEY not in sse.raw


class QueryLLM(ScriptedLLM):
    """A scripted chat API that records the query of each request."""

    def __init__(self, replies: list[list[dict[str, Any]]]) -> None:
        super().__init__(replies)
        self.queries: list[str] = []

    async def complete(self, request: Request) -> Response:
        self.queries.append(request.url.query)
        return await super().complete(request)


def test_a_base_url_with_a_query_keeps_it_after_the_chat_path(keys: Keys) -> None:
    # Azure's ?api-version=...: the path was appended to the query, and the API answered 404.
    llm = QueryLLM([ANSWER])
    with running(llm.app) as llm_url:
        settings = load_settings(
            llm_base_url=f"{llm_url}/v1/?api-version=2024-06-01",
            llm_api_key=API_KEY,
            llm_model="m",
        )
        sse, _ = process_once(keys, settings)
    assert sse.data[-1]["status"] == "completed", sse.data[-1]
    assert text_of(sse.data) == "It is sunny in Paris."
    assert llm.queries == ["api-version=2024-06-01"]


def test_a_models_refusal_reaches_the_client_and_the_session(keys: Keys) -> None:
    # With no content, the refusal was dropped: the run completed with no output at all.
    refusal = "I'm sorry, I can't help with that."
    streamed = ScriptedLLM(
        [
            [
                chunk({"role": "assistant", "content": None, "refusal": ""}),
                chunk({"refusal": refusal[:10]}),
                chunk({"refusal": refusal[10:]}),
                chunk(finish="stop"),
                usage(10, 9),
            ]
        ]
    )
    message = {"role": "assistant", "content": None, "refusal": refusal}
    whole = PlainReplyLLM(
        [JSONResponse({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})]
    )
    for llm in (streamed, whole):
        with (
            llm_agent_server(keys, llm, []) as url,
            httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client,
        ):
            _, sse = stream(
                client, "/process", json={"input": [user_message("hi")], "session_id": "s"}
            )
            stored = client.get("/sessions/s").json()["messages"]
        assert sse.data[-1]["status"] == "completed"
        (answer,) = messages_of(sse.data)
        assert answer["content"] == [
            {**answer["content"][0], "type": "refusal", "refusal": refusal}
        ]
        assert [m["role"] for m in stored] == ["user", "assistant"]
        assert stored[1]["content"][0]["type"] == "refusal"
        assert stored[1]["content"][0]["refusal"] == refusal


def test_a_models_refusal_reaches_openai_clients_as_a_refusal(keys: Keys) -> None:
    # The SDK read content '' and refusal None: the refusal was lost.
    refusal = "I can't help with that."
    llm = ScriptedLLM(
        [
            [
                chunk({"role": "assistant", "content": None}),
                chunk({"refusal": refusal[:5]}),
                chunk({"refusal": refusal[5:]}),
                chunk(finish="stop"),
                usage(10, 9),
            ]
        ]
    )
    with llm_agent_server(keys, llm, []) as url:
        client = openai.OpenAI(
            base_url=f"{url}/compatible-mode/v1", api_key=keys.alice, max_retries=0
        )
        ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
        completion = client.chat.completions.create(model="x", messages=ask)
        pieces = list(client.chat.completions.create(model="x", messages=ask, stream=True))
        response = client.responses.create(model="x", input="hi")
        events = list(client.responses.create(model="x", input="hi", stream=True))
    message = completion.choices[0].message
    assert (message.content, message.refusal) == (None, refusal)
    assert completion.choices[0].finish_reason == "stop"
    streamed = "".join(p.choices[0].delta.refusal or "" for p in pieces if p.choices)
    assert streamed == refusal
    assert all(not p.choices[0].delta.content for p in pieces if p.choices)
    refused = [{"type": "refusal", "refusal": refusal}]
    assert response.output[0].model_dump()["content"] == refused
    kinds = [event.type for event in events]
    assert "response.refusal.delta" in kinds and "response.output_text.delta" not in kinds
    done = [event.model_dump() for event in events if event.type == "response.refusal.done"]
    assert [event["refusal"] for event in done] == [refusal]
    assert events[-1].model_dump()["response"]["output"][0]["content"] == refused
