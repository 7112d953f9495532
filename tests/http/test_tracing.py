"""A request's tracing context reaches its agent: the request id the client can quote (its
``X-Request-Id``) and the trace headers it sent, on the agent's spans too."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from agentscope_serverless.app import AgentApp
from agentscope_serverless.http import create_app
from agentscope_serverless.log import logger
from agentscope_serverless.settings import load_settings
from agentscope_serverless.tracing import TracingUtil, trace
from tests.support.http import Keys, bearer, running, user_message

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
XRAY = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"

app = AgentApp(app_name="traced")


@trace("LLM", trace_name="plan")
async def plan() -> str:
    return TracingUtil.get_request_id()


@app.query(framework="text")
async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
    yield json.dumps({"request_id": await plan(), "headers": TracingUtil.get_trace_header()})


@pytest.fixture
def debug_logs() -> Iterator[None]:
    """The logger at DEBUG (spans) for one test (the tests log nothing below CRITICAL)."""
    level = logger.level
    logger.setLevel("DEBUG")
    try:
        yield
    finally:
        logger.setLevel(level)


def seen_by_agent(url: str, key: str, headers: dict[str, Any]) -> dict[str, Any]:
    body = {"input": [user_message("hi")], "stream": False}
    answer = httpx.post(f"{url}/process", json=body, headers={**bearer(key), **headers})
    assert answer.status_code == 200
    seen: dict[str, Any] = json.loads(answer.json()["output"][-1]["content"][0]["text"])
    assert seen["request_id"] == answer.headers["x-request-id"]
    return seen


def test_the_agent_and_its_spans_carry_the_requests_id_and_trace_headers(
    capfd: pytest.CaptureFixture[str], debug_logs: None
) -> None:
    keys = Keys.make()
    served = create_app(settings=load_settings(), agent_app=app, key_store=keys.store)
    with running(served) as url:
        sent = {"X-Request-Id": "req-7", "traceparent": TRACEPARENT, "X-Amzn-Trace-Id": XRAY}
        seen = seen_by_agent(url, keys.alice, sent)
        # Without one, the id the server made is the agent's all the same.
        made = seen_by_agent(url, keys.alice, {})
    assert seen == {
        "request_id": "req-7",
        "headers": {"traceparent": TRACEPARENT, "x-amzn-trace-id": XRAY},
    }
    assert made["headers"] == {}
    lines = [json.loads(line) for line in capfd.readouterr().out.splitlines() if '"span"' in line]
    assert [(line["span"], line["request_id"]) for line in lines] == [
        ("plan", "req-7"),
        ("plan", made["request_id"]),
    ]


def test_trace_headers_that_are_not_printable_text_are_left_out() -> None:
    keys = Keys.make()
    served = create_app(settings=load_settings(), agent_app=app, key_store=keys.store)
    with running(served) as url:
        sent = {"traceparent": "00-\xe9t\xe9".encode("latin-1"), "tracestate": "a=1" * 2000}
        seen = seen_by_agent(url, keys.alice, sent)
    assert seen["headers"] == {}


@trace("TOOL", trace_name="warm")
def warm() -> str:
    return TracingUtil.get_request_id()


def test_a_traced_call_outside_a_request_leaves_each_request_its_own_id() -> None:
    # As an agent module calling a traced helper as it is imported: the id that call is given
    # must not become that of the requests later served in a context copied from this one.
    outside = warm()
    keys = Keys.make()
    served = create_app(settings=load_settings(), agent_app=app, key_store=keys.store)
    body = {"input": [user_message("hi")], "stream": False}

    async def seen() -> list[str]:
        transport = httpx.ASGITransport(app=served)
        ids = []
        client = httpx.AsyncClient(transport=transport, base_url="http://test")
        async with served.router.lifespan_context(served), client:
            for sent in ("req-1", "req-2"):
                headers = {**bearer(keys.alice), "X-Request-Id": sent}
                answer = await client.post("/process", json=body, headers=headers)
                assert answer.status_code == 200, answer.text
                text = answer.json()["output"][-1]["content"][0]["text"]
                ids.append(json.loads(text)["request_id"])
        return ids

    assert asyncio.run(seen()) == ["req-1", "req-2"]
    assert warm() == outside


renaming = AgentApp(app_name="renaming")


@renaming.query(framework="text")
async def renamed(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
    TracingUtil.set_request_id(f"mine-{TracingUtil.get_request_id()}")
    yield TracingUtil.get_request_id()


def test_a_request_id_the_agent_sets_is_the_one_it_reads_in_that_request() -> None:
    # As AgentScope's TracingUtil: set, then got, in the same request (the request's own id
    # wins only over one set outside it).
    keys = Keys.make()
    served = create_app(settings=load_settings(), agent_app=renaming, key_store=keys.store)
    with running(served) as url:
        body = {"input": [user_message("hi")], "stream": False}
        for sent in ("req-1", "req-2"):
            headers = {**bearer(keys.alice), "X-Request-Id": sent}
            answer = httpx.post(f"{url}/process", json=body, headers=headers)
            assert answer.status_code == 200, answer.text
            assert answer.json()["output"][-1]["content"][0]["text"] == f"mine-{sent}"
