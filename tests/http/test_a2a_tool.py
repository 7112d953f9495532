"""Another A2A agent as a tool, against agents on loopback that are not ours: one whose card
names its endpoint elsewhere, one echoing the request it got, one trickling its answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from a2a.types import AgentCard, AgentInterface
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from agentscope_serverless.agents.a2a_tool import (
    A2AOriginError,
    A2ATimeoutError,
    a2a_agent_tool,
    ask_a2a_agent,
    fetch_card,
)
from agentscope_serverless.app import AgentApp
from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.http import create_app
from agentscope_serverless.log import logger
from agentscope_serverless.settings import load_settings
from tests.support.http import Keys, running

Answer = Callable[[dict[str, Any], Any], dict[str, Any]]

echo = AgentApp(app_name="echo")


@echo.query(framework="text")
async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
    yield msgs[-1].get_text_content() or ""


def _card(name: str, *urls: str, description: str = "An agent.") -> dict[str, Any]:
    interfaces = [{"url": u, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"} for u in urls]
    return {
        "name": name,
        "description": description,
        "version": "1",
        "supportedInterfaces": interfaces,
        "capabilities": {},
        "defaultInputModes": ["text"],
        "defaultOutputModes": ["text"],
        "skills": [],
    }


def _replying(text: str) -> Answer:
    """An answer of the agent: a message saying ``text`` (``{authorization}`` in it, the
    Authorization header it got)."""

    def answer(call: dict[str, Any], headers: Any) -> dict[str, Any]:
        said = text.format(authorization=headers.get("authorization"))
        message = {"messageId": "m1", "role": "ROLE_AGENT", "parts": [{"text": said}]}
        return {"jsonrpc": "2.0", "id": call["id"], "result": {"message": message}}

    return answer


@contextlib.contextmanager
def _agent() -> Iterator[tuple[str, dict[str, Any]]]:
    """An A2A agent on loopback serving ``state["card"]`` (a card, or a function of the
    request's headers giving one) and answering each call with ``state["answer"]``; the
    headers of the calls it got are in ``state["called"]``."""
    state: dict[str, Any] = {"called": [], "answer": _replying("hello")}
    web = FastAPI()

    @web.get("/.well-known/agent-card.json")
    async def card(request: Request) -> dict[str, Any]:
        card = state["card"]
        return card(request.headers) if callable(card) else dict(card)

    @web.post("/a2a")
    async def call(request: Request) -> dict[str, Any]:
        state["called"].append(dict(request.headers))
        return dict(state["answer"](await request.json(), request.headers))

    with running(web) as url:
        yield url, state


async def test_the_key_and_the_user_go_only_to_the_origin_the_tool_was_given() -> None:
    # A card naming another host or port (a proxy's upstream, another party) got the key.
    key = f"sk-{uuid.uuid4().hex}"
    with _agent() as (home, at_home), _agent() as (other, elsewhere):
        at_home["answer"] = _replying("from home")
        elsewhere["answer"] = _replying("from elsewhere")
        as_localhost = home.replace("127.0.0.1", "localhost")
        as_https = home.replace("http://", "https://")
        for given, named in [(home, other), (as_localhost, home), (home, as_https)]:
            at_home["card"] = _card("helper", f"{named}/a2a")
            with pytest.raises(A2AOriginError) as refused:
                await a2a_agent_tool(given, api_key=key)
            message = str(refused.value)
            assert f"names its endpoint at {named}, not at {given}" in message, message
            assert (refused.value.named, refused.value.given) == ([named], [given])
            assert key not in message
        assert at_home["called"] == elsewhere["called"] == []
        # A card naming its endpoint at the origin given too: only that one is called.
        at_home["card"] = _card("helper", f"{other}/a2a", f"{home}/a2a")
        tool = await a2a_agent_tool(home, api_key=key)
        assert await tool.invoke('{"message": "hi"}') == "from home"
        assert [h["authorization"] for h in at_home["called"]] == [f"Bearer {key}"]
        # Another origin, listed by the operator, is called.
        at_home["card"] = _card("helper", f"{other}/a2a")
        tool = await a2a_agent_tool(home, api_key=key, allowed_origins=[other])
        assert await tool.invoke('{"message": "hi"}') == "from elsewhere"
        assert [h["authorization"] for h in elsewhere["called"]] == [f"Bearer {key}"]


async def test_what_an_a2a_agent_echoes_of_the_request_never_carries_the_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Echoed in a failed task or a JSON-RPC error, the key reached the model (and the
    # session) or the log line of the tool's failure.
    key = f"sk-{uuid.uuid4().hex}"

    def answer(call: dict[str, Any], headers: Any) -> dict[str, Any]:
        echoed = f"you sent Authorization: {headers.get('authorization')}"
        asked = call["params"]["message"]["parts"][0]["text"]
        if asked == "fail":
            said = {"messageId": "m1", "role": "ROLE_AGENT", "parts": [{"text": echoed}]}
            status = {"state": "TASK_STATE_FAILED", "message": said}
            task = {"id": "t1", "contextId": "c1", "status": status}
            return {"jsonrpc": "2.0", "id": call["id"], "result": {"task": task}}
        if asked == "err":
            error = {"code": -32000, "message": echoed}
            return {"jsonrpc": "2.0", "id": call["id"], "error": error}
        return _replying(echoed)(call, headers)

    with _agent() as (url, state):
        state["answer"] = answer
        state["card"] = lambda headers: _card(
            f"helper {headers.get('authorization')}",
            f"{url}/a2a",
            description=f"Asked with {headers.get('authorization')}.",
        )
        tool = await a2a_agent_tool(url, api_key=key)
        assert (tool.name, tool.description) == (
            "helper_Bearer__redacted_",
            "Asked with Bearer [redacted].",
        )
        level = logger.level
        logger.setLevel("ERROR")  # the tests log nothing below CRITICAL
        try:
            said = [await tool.invoke(json.dumps({"message": m})) for m in ("fail", "err", "hi")]
        finally:
            logger.setLevel(level)
    assert said == [
        "error: the agent 'helper Bearer [redacted]' did not complete the task (failed: you "
        "sent Authorization: Bearer [redacted])",
        "error: the call to the agent 'helper Bearer [redacted]' failed (JSON-RPC Error "
        "-32000: you sent Authorization: Bearer [redacted])",
        "you sent Authorization: Bearer [redacted]",
    ]
    assert key not in capsys.readouterr().out


async def test_a_key_too_short_to_mask_leaves_the_answer_whole() -> None:
    # Masked as it was, the key "e" turned the answer into "th[redacted] answ[redacted]r".
    with _agent() as (url, state):
        state["answer"] = _replying("the answer")
        state["card"] = lambda headers: _card("helper", f"{url}/a2a", description="Helps.")
        tool = await a2a_agent_tool(url, api_key="e")
        assert tool.description == "Helps."
        assert await tool.invoke('{"message": "hi"}') == "the answer"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, Keys]]:
    keys = Keys.make()
    web = create_app(settings=load_settings(), agent_app=echo, key_store=keys.store)
    with running(web) as url:
        yield url, keys


async def test_a_key_no_header_can_carry_is_refused_without_quoting_it(
    served: tuple[str, Keys],
) -> None:
    # A key read from a file with its newline was quoted whole by the error of the header.
    url, keys = served
    card = await fetch_card(url, api_key=keys.alice)
    middle = len(keys.alice) // 2
    for bad in (
        keys.alice + "\n",
        f" {keys.alice}",
        keys.alice[:middle] + "\r\n" + keys.alice[middle:],
        keys.alice + "\u00e9",
    ):
        with pytest.raises(ConfigurationError) as refused:
            await a2a_agent_tool(url, api_key=bad)
        assert "the api_key of the A2A agent" in str(refused.value)
        assert keys.alice[:middle] not in str(refused.value)
        with pytest.raises(ConfigurationError) as refused:
            await ask_a2a_agent(card, "hi", api_key=bad)
        assert keys.alice[:middle] not in str(refused.value)
    tool = await a2a_agent_tool(url, api_key=keys.alice)
    assert await tool.invoke('{"message": "still here"}') == "still here"


async def test_an_a2a_agent_trickling_its_answer_is_given_up_at_the_time_limit() -> None:
    # A byte now and then reset the timeout of each read: the call waited as long as the
    # agent went on sending.
    async def trickle() -> AsyncIterator[bytes]:
        for _ in range(40):
            yield b" "
            await asyncio.sleep(0.1)

    web = FastAPI()

    @web.get("/.well-known/agent-card.json")
    @web.post("/a2a")
    async def slowly() -> StreamingResponse:
        return StreamingResponse(trickle(), media_type="application/json")

    with running(web) as url:
        began = time.monotonic()
        with pytest.raises(A2ATimeoutError, match=r"was not read within 1 s") as late:
            await fetch_card(url, timeout_seconds=1)
        assert late.value.limit_seconds == 1
        assert time.monotonic() - began < 2.5
        interface = AgentInterface(
            url=f"{url}/a2a", protocol_binding="JSONRPC", protocol_version="1.0"
        )
        card = AgentCard(name="slow", supported_interfaces=[interface])
        began = time.monotonic()
        with pytest.raises(A2ATimeoutError, match=r"'slow' did not answer within 1 s"):
            await ask_a2a_agent(card, "hi", timeout_seconds=1)
        assert time.monotonic() - began < 2.5
