"""Servers for the HTTP tests: the demo agent and a scenario agent, on loopback ports."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from agentscope_serverless.agents.demo import app as demo_app
from agentscope_serverless.app import AgentApp
from agentscope_serverless.errors import StoreUnavailableError
from agentscope_serverless.http import create_app
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS
from agentscope_serverless.log import logger
from agentscope_serverless.schemas.agent_schemas import (
    ImageContent,
    Message,
    RefusalContent,
    Role,
    TextContent,
)
from agentscope_serverless.settings import load_settings
from tests.support.http import Keys, bearer, running

PING_INTERVAL = 0.1
SECRET = "sk-live-0123456789"
CAT = "https://example.com/cat.png"
# Loading the CA bundle is the slowest part of making an httpx client: load it once.
TLS_CONTEXT = ssl.create_default_context()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local stack's AWS credentials, for apps on DynamoDB (moto)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", LOCAL_AWS_CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_AWS_CREDENTIALS["aws_secret_access_key"])


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys.make()


@pytest.fixture(scope="module")
def demo_url(keys: Keys) -> Iterator[str]:
    """Every router, the demo agent, in-memory stores."""
    with running(
        create_app(settings=load_settings(), agent_app=demo_app, key_store=keys.store)
    ) as url:
        yield url


def scenario_app() -> AgentApp:
    """An agent whose behaviour the input selects: echo, fail, sleep, ..."""
    app = AgentApp(app_name="scenario")

    @app.query(framework="text")
    async def query(
        self: Any, msgs: list[Message], request: Any = None, **kwargs: Any
    ) -> AsyncIterator[str | Message]:
        text = msgs[-1].get_text_content() or ""
        if text == "fail":
            raise RuntimeError(f"boom, and the key is {SECRET}")
        if text == "fail after a word":
            yield "partial "
            raise RuntimeError(f"boom, and the key is {SECRET}")
        if text == "store down":
            raise StoreUnavailableError("redis", "connection refused")
        if text.startswith("sleep "):
            await asyncio.sleep(float(text.split()[1]))
        if text == "limits":
            yield f"max_tokens={request.max_tokens}"
            return
        if text == "draw":
            picture = ImageContent(image_url=CAT)
            yield Message(role=Role.ASSISTANT, content=[picture, TextContent(text="A cat.")])
            return
        if text == "refuse":
            yield Message(role=Role.ASSISTANT, content=[RefusalContent(refusal="I can't.")])
            return
        if text == "say nothing":
            return
        if text == "half refuse":
            said = [TextContent(text="Part one."), RefusalContent(refusal="Not the rest.")]
            yield Message(role=Role.ASSISTANT, content=said)
            return
        if text == "ticks":
            # A message a tick, for 8 s: a reply long enough to be stopped.
            for tick in range(40):
                yield Message(role=Role.ASSISTANT, content=[TextContent(text=f"tick {tick}")])
                await asyncio.sleep(0.2)
            return
        if text == "show":
            # A message of a picture alone, then one of text.
            yield Message(role=Role.ASSISTANT, content=[ImageContent(image_url=CAT)])
            yield "Here it is."
            return
        yield "echo: "
        yield text

    return app


@pytest.fixture(scope="module")
def scenario_url(keys: Keys) -> Iterator[str]:
    """The scenario agent, with keep-alive pings every 0.1 s (its failures mention SECRET,
    a secret of its settings)."""
    settings = load_settings(sse_ping_interval_seconds=PING_INTERVAL, llm_api_key=SECRET)
    with running(
        create_app(settings=settings, agent_app=scenario_app(), key_store=keys.store)
    ) as url:
        yield url


@pytest.fixture
def client_for(demo_url: str) -> Iterator[Callable[..., httpx.Client]]:
    """``client_for(key, url=demo_url)``: an httpx client authenticated with ``key``."""
    clients: list[httpx.Client] = []

    def make(key: str | None, url: str = demo_url, **headers: str) -> httpx.Client:
        auth = bearer(key) if key else {}
        client = httpx.Client(
            base_url=url, headers={**auth, **headers}, timeout=10, verify=TLS_CONTEXT
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def info_logs() -> Iterator[None]:
    """The runtime's logger at INFO for one test (the tests log nothing below CRITICAL)."""
    level = logger.level
    logger.setLevel("INFO")
    try:
        yield
    finally:
        logger.setLevel(level)
