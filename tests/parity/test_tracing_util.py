"""AgentScope Runtime 1.0.5's ``TracingUtil``: the request id, trace headers and common span
attributes of the current task, with 1.0.5's signatures and defaults.

The tests are coroutines: each runs in a task of its own, so what one sets stays in it."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentscope_serverless import log
from agentscope_serverless.helpers.agent_api_client import parse_event_from_json
from agentscope_serverless.log import logger
from agentscope_serverless.tracing import (
    TraceType,
    TracingUtil,
    merge_agent_response,
    trace,
    tracing_util,
)

FRAMEWORK = {"gen_ai.framework": "Alibaba Cloud Model Studio"}


@pytest.fixture(autouse=True)
def no_request_yet() -> Iterator[None]:
    """Each test's task starts from a context with no request id: one a Lambda invocation run
    in this process (another test's) bound for good must not show here."""
    context = contextvars.copy_context()
    defaults: list[tuple[contextvars.ContextVar[Any], Any]] = [
        (log._request_id, None),
        (log._client_request_id, None),
        (log._trace_ids, ()),
        (tracing_util._REQUEST_ID, None),
        (tracing_util._TRACE_HEADER, {}),
        (tracing_util._COMMON_ATTRIBUTES, {}),
    ]
    tokens = [(var, var.set(default)) for var, default in defaults if var in context]
    yield
    for var, token in reversed(tokens):
        var.reset(token)


def test_methods_have_agentscope_parameters_and_defaults() -> None:
    def parameters(name: str) -> list[tuple[str, object]]:
        method = inspect.getattr_static(TracingUtil, name)
        assert isinstance(method, staticmethod), name
        return [(p.name, p.default) for p in inspect.signature(method).parameters.values()]

    empty = inspect.Parameter.empty
    assert parameters("set_request_id") == [("value", "")]
    assert parameters("get_request_id") == [("default_value", "")]
    assert parameters("set_trace_header") == [("trace_headers", empty)]
    assert parameters("get_trace_header") == []
    assert parameters("set_common_attributes") == [("attributes", empty)]
    assert parameters("get_common_attributes") == []
    assert parameters("clear_common_attributes") == []


async def test_without_a_request_id_get_returns_the_default() -> None:
    assert TracingUtil.get_request_id() == ""
    assert TracingUtil.get_request_id("fallback") == "fallback"
    assert TracingUtil.get_trace_header() == {}
    assert TracingUtil.get_common_attributes() == {}


async def test_the_request_id_set_is_returned_over_the_default() -> None:
    TracingUtil.set_request_id(value="req-1")
    assert TracingUtil.get_request_id() == "req-1"
    assert TracingUtil.get_request_id("fallback") == "req-1"


async def test_an_empty_request_id_keeps_the_one_set() -> None:
    TracingUtil.set_request_id()
    assert TracingUtil.get_request_id("fallback") == "fallback"
    TracingUtil.set_request_id("req-1")
    TracingUtil.set_request_id("")
    assert TracingUtil.get_request_id() == "req-1"


async def test_a_request_id_replaces_the_common_attributes_with_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in ("APPLICATION_ENV", "DS_ENV", "ALIYUN_UID", "WORKSPACE_ID", "APPLICATION_ID"):
        monkeypatch.delenv(variable, raising=False)
    TracingUtil.set_common_attributes({"stale": 1})
    TracingUtil.set_request_id("req-1")
    assert TracingUtil.get_common_attributes() == {
        "request_id": "req-1",
        "bailian.request_id": "req-1",
        "gen_ai.response.id": "req-1",
        **FRAMEWORK,
    }


async def test_the_common_attributes_carry_model_studio_application_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("APPLICATION_ENV", "")
    monkeypatch.setenv("DS_ENV", "prod")
    monkeypatch.setenv("ALIYUN_UID", "42")
    monkeypatch.setenv("WORKSPACE_ID", "ws")
    monkeypatch.delenv("APPLICATION_ID", raising=False)
    TracingUtil.set_request_id("req-1")
    attributes = TracingUtil.get_common_attributes()
    assert {
        k: v for k, v in attributes.items() if k.startswith(("bailian.app", "gen_ai.user"))
    } == {
        "bailian.app.env": "prod",
        "bailian.app.owner_id": "42",
        "gen_ai.user.id": "42",
        "bailian.app.workspace": "ws",
    }


async def test_common_attributes_merge_until_cleared() -> None:
    TracingUtil.set_common_attributes({"a": 1, "b": 1})
    TracingUtil.set_common_attributes({"b": 2})
    assert TracingUtil.get_common_attributes() == {"a": 1, "b": 2}
    TracingUtil.clear_common_attributes()
    assert TracingUtil.get_common_attributes() == {}


async def test_the_trace_header_set_is_returned() -> None:
    headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    TracingUtil.set_trace_header(headers)
    assert TracingUtil.get_trace_header() == headers


async def test_a_task_request_id_stays_in_it() -> None:
    TracingUtil.set_request_id("parent")

    async def child() -> str:
        TracingUtil.set_request_id("child")
        return TracingUtil.get_request_id()

    assert await asyncio.create_task(child()) == "child"
    assert TracingUtil.get_request_id() == "parent"


async def test_a_traced_call_gives_its_task_a_request_id() -> None:
    @trace("LLM")
    async def plan() -> str:
        return TracingUtil.get_request_id()

    request_id = await plan()
    assert len(request_id) == 36
    assert TracingUtil.get_common_attributes()["request_id"] == request_id
    assert await plan() == request_id


async def test_a_traced_call_keeps_the_request_id_set() -> None:
    @trace("TOOL")
    def search() -> str:
        return TracingUtil.get_request_id()

    TracingUtil.set_request_id("req-1")
    assert search() == "req-1"


async def test_common_attributes_a_task_adds_stay_in_it() -> None:
    TracingUtil.set_common_attributes({"parent": 1})

    async def child() -> None:
        TracingUtil.set_common_attributes({"child": 1})

    await asyncio.create_task(child())
    assert TracingUtil.get_common_attributes() == {"parent": 1}


def test_a_traced_generator_is_one_span_over_its_whole_iteration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    @trace("TOOL", trace_name="rows")
    def rows() -> Iterator[int]:
        yield 1
        raise ValueError("the source went away")

    def spans() -> list[dict[str, Any]]:
        out = capsys.readouterr().out
        return [json.loads(line) for line in out.splitlines() if '"span"' in line]

    level = logger.level
    logger.setLevel("DEBUG")  # the tests log nothing below CRITICAL
    try:
        iteration = rows()
        assert next(iteration) == 1
        assert spans() == []  # not ended while it is iterated
        with pytest.raises(ValueError, match="the source went away"):
            next(iteration)
        (span,) = spans()
    finally:
        logger.setLevel(level)
    assert (span["span"], span["span_type"], span["error"]) == ("rows", "TOOL", "ValueError")


def test_a_traced_generator_returns_what_its_function_returns() -> None:
    # The value was dropped: `yield from` a traced generator gave None.
    @trace("TOOL")
    def rows() -> Generator[int, None, str]:
        yield 1
        return "one row"

    def counted() -> Generator[int, None, str]:
        return (yield from rows())

    iteration = counted()
    assert next(iteration) == 1
    with pytest.raises(StopIteration) as stopped:
        next(iteration)
    assert stopped.value.value == "one row"


@pytest.mark.parametrize(
    "name",
    [
        "LLM",
        "TOOL",
        "AGENT_STEP",
        "MEMORY",
        "SEARCH",
        "AIGC",
        "RAG",
        "INTENTION",
        "PLUGIN",
        "FUNCTION_CALL",
        "AGENT",
        "PLANNING",
        "CHAIN",
        "RETRIEVER",
        "RERANKER",
        "EMBEDDING",
        "TASK",
        "GUARDRAIL",
        "REWRITER",
        "OTHER",
    ],
)
def test_every_trace_type_of_agentscope_is_named(name: str) -> None:
    # A ported module decorating with @trace(TraceType.RAG) imports as it did.
    assert getattr(TraceType, name) == name

    @trace(getattr(TraceType, name))
    def traced() -> str:
        return "done"

    assert traced() == "done"


def _golden_events(name: str) -> list[Any]:
    """The events of a golden ``/process`` transcript, as AgentScope's client parses them."""
    text = (Path(__file__).with_name("golden") / name).read_text()
    return [
        parse_event_from_json(json.loads(line[len("data: ") :]))
        for line in text.splitlines()
        if line.startswith("data: ")
    ]


def test_merging_a_run_cut_short_keeps_the_text_it_streamed() -> None:
    # The deltas were dropped: a run that failed after "Hi! " merged into a message of no text.
    events = _golden_events("peer_as_err_process.txt")
    merged = merge_agent_response(events)
    assert merged.status == "failed"
    assert merged.output is not None
    assert [m.get_text_content() for m in merged.output] == ["Hi! "]
    # What was merged is left as it was.
    assert _golden_events("peer_as_err_process.txt")[2] == events[2]


def test_merging_a_whole_run_gives_its_reply_once() -> None:
    events = _golden_events("peer_as_process.txt")
    for cut in range(4, len(events) + 1):
        merged = merge_agent_response(events[:cut])
        assert merged.output is not None
        (reply,) = merged.output
        assert reply.get_text_content() == "".join(["Hi! ", "My name is ", "Friday."][: cut - 3])
    assert merge_agent_response(events).status == "completed"
