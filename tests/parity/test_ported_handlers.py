"""Query handlers written for AgentScope Runtime 1.0.5 run unchanged: its Runner called them
with ``request`` and ``response`` (and ``msgs`` for AgentScope's framework) only, so a
handler naming just those, without ``**kwargs``, is called with just those."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentscope_serverless import Runner
from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.helpers.runner import ErrorRunner, SimpleRunner
from agentscope_serverless.schemas.agent_schemas import AgentRequest, AgentResponse, TextContent
from tests.parity.test_agentscope_query import run_script

TURN = {"input": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}


class RequestResponseRunner(Runner):
    """A text runner as AgentScope's users subclass it, its handler naming what it uses."""

    def __init__(self) -> None:
        super().__init__()
        self.framework_type = "text"

    async def query_handler(  # type: ignore[override]  # AgentScope's own shape
        self, request: AgentRequest | None = None, response: AgentResponse | None = None
    ) -> AsyncIterator[str]:
        assert request is not None and response is not None
        yield f"{request.user_id} in {response.session_id}"


async def test_a_handler_without_kwargs_gets_the_request_and_the_response() -> None:
    async with RequestResponseRunner() as runner:
        final = await runner.query({**TURN, "session_id": "s1", "user_id": "ann"})
    assert final.status == "completed", final.error
    assert final.output is not None and final.output[0].get_text_content() == "ann in s1"


async def test_a_handler_with_kwargs_still_gets_the_session_and_memories() -> None:
    seen: dict[str, Any] = {}

    async def handler(self: Runner, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        seen.update(kwargs, msgs=msgs)
        yield "ok"

    async with Runner(handler) as runner:
        final = await runner.query({**TURN, "session_id": "s2"})
    assert final.status == "completed", final.error
    assert {"msgs", "request", "response", "session", "memories"} <= set(seen)


async def test_the_handlers_request_names_the_session_and_user_of_the_run() -> None:
    # AgentScope's Runner filled the request's session id (a new one when none was given)
    # and its user id (the session id when none was given) before calling the handler,
    # which keys its state and memory by them.
    async with RequestResponseRunner() as runner:
        new = await runner.query(TURN)
        named = await runner.query({**TURN, "session_id": "s3"}, user_id="bob")
    assert new.output is not None and named.output is not None
    assert new.output[0].get_text_content() == f"{new.session_id} in {new.session_id}"
    assert named.output[0].get_text_content() == "bob in s3"


async def test_the_helper_runners_answer_and_fail_as_agentscopes_do() -> None:
    # Tests written for AgentScope Runtime check these runners' words.
    async with SimpleRunner() as runner:
        events = [e async for e in runner.stream_query(TURN)]
    deltas = [e.text for e in events if isinstance(e, TextContent) and e.delta]
    assert deltas == ["Hi", "! My name is Friday", "."]
    async with ErrorRunner() as runner:
        events = [e async for e in runner.stream_query(TURN)]
    assert [e.text for e in events if isinstance(e, TextContent) and e.delta] == ["Hi"]
    failed = events[-1]
    assert isinstance(failed, AgentResponse) and failed.error is not None
    assert failed.error.message == "Unknown agent error: RuntimeError: Error"


AGENTSCOPE_HANDLER = """
import asyncio
from agentscope.message import Msg
from agentscope_serverless.app import AgentApp

app = AgentApp(app_name="Friday")

@app.query(framework="agentscope")
async def query_func(self, msgs, request=None, response=None):
    yield Msg("Friday", "echo " + msgs[-1].get_text_content(), "assistant"), True

async def main():
    async with app:
        final = await app.query("Who are you?", user_id="u1", session_id="s1")
    print(final.status, final.error, final.output and final.output[0].get_text_content())

asyncio.run(main())
"""


def test_an_agentscope_handler_without_kwargs_gets_msgs_request_and_response() -> None:
    assert run_script(AGENTSCOPE_HANDLER) == "completed None echo Who are you?"


class LangGraphRunner(Runner):
    """A runner for a framework whose adapter AgentScope Runtime has and we do not."""

    def __init__(self) -> None:
        super().__init__()
        self.framework_type = "langgraph"

    async def query_handler(self, msgs: Any = None, **kwargs: Any) -> AsyncIterator[str]:
        yield "handed protocol messages instead of LangGraph's"


async def test_a_framework_without_an_adapter_is_refused_at_start_naming_it() -> None:
    runner = LangGraphRunner()
    with pytest.raises(ConfigurationError, match="got 'langgraph'"):
        await runner.start()
    assert not runner.is_started
