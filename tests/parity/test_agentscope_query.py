"""``@app.query`` as AgentScope's: without a framework it is ``"agentscope"``, whose handler
gets AgentScope ``Msg`` objects made from the request's messages. With the AgentScope-shaped
package (``agentscope_standin/``), in a child process so ``agentscope`` is never importable
here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

STANDIN = Path(__file__).parent / "agentscope_standin"


def run_script(script: str) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(STANDIN), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


DEFAULT_FRAMEWORK = """
import asyncio
from agentscope.message import Msg
from agentscope_serverless.app import AgentApp

app = AgentApp(app_name="Friday")

@app.query()
async def query_func(self, msgs, request=None, **kwargs):
    assert all(isinstance(m, Msg) for m in msgs), [type(m) for m in msgs]
    reply = Msg("Friday", "", "assistant")
    reply.content = [{"type": "text", "text": "echo " + msgs[-1].get_text_content()}]
    yield reply, True

async def main():
    async with app:
        response = await app.query("Who are you?", user_id="u1", session_id="s1")
    assert response.status == "completed", response.error
    print(app.framework, response.output[0].get_text_content())

asyncio.run(main())
"""


def test_query_without_a_framework_hands_the_handler_agentscope_msgs() -> None:
    assert run_script(DEFAULT_FRAMEWORK) == "agentscope echo Who are you?"


IMAGE_INPUT = """
import asyncio
from agentscope.message import Msg
from agentscope_serverless.app import AgentApp

app = AgentApp(app_name="Friday")
seen = []

@app.query(framework="agentscope")
async def query_func(self, msgs, request=None, **kwargs):
    seen.append((msgs[-1].name, msgs[-1].role, msgs[-1].content))
    yield Msg("Friday", "a cat", "assistant"), True

async def main():
    parts = [{"type": "text", "text": "What is this?"},
             {"type": "image", "image_url": "https://example.com/cat.png"}]
    async with app:
        response = await app.query({"input": [{"role": "user", "content": parts}]})
        await app.query("Thanks")
    assert response.status == "completed", response.error
    print(seen)

asyncio.run(main())
"""


def test_an_agentscope_handler_gets_every_content_part_as_a_block() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
    expected = [
        ("user", "user", [{"type": "text", "text": "What is this?"}, image]),
        ("user", "user", "Thanks"),
    ]
    assert run_script(IMAGE_INPUT) == repr(expected)


REACT_TURN = """
import asyncio, json
from agentscope.message import Msg
from agentscope_serverless.app import AgentApp

app = AgentApp(app_name="Friday")

@app.query(framework="agentscope")
async def query_func(self, msgs, request=None, **kwargs):
    # What a ReActAgent with a tool prints: its reasoning, a tool call, the tool's result
    # (a Msg of the system) and the answer, each Msg growing until its last print.
    thinking = Msg("Friday", [{"type": "thinking", "thinking": "Let me"}], "assistant")
    yield thinking, False
    thinking.content = [
        {"type": "thinking", "thinking": "Let me compute."},
        {"type": "text", "text": "Computing"},
        {"type": "tool_use", "id": "call_1", "name": "run", "input": {"code": "1+1"}},
    ]
    yield thinking, True
    output = [{"type": "text", "text": "2"}]
    result = {"type": "tool_result", "id": "call_1", "name": "run", "output": output}
    yield Msg("system", [result], "system"), True
    answer = Msg("Friday", "It is 2.", "assistant")
    answer.usage = {"input_tokens": 10, "output_tokens": 3}
    yield answer, True

async def main():
    async with app:
        final = await app.query("What is 1+1?", user_id="u1", session_id="s1")
    assert final.status == "completed", final.error
    print(json.dumps({
        "output": [
            [m.type, m.role, [c.model_dump(include={"type", "text", "data"}) for c in m.content]]
            for m in final.output
        ],
        "usage": final.usage,
    }))

asyncio.run(main())
"""


def test_an_agentscope_handlers_reasoning_tool_calls_and_results_are_messages() -> None:
    result = json.loads(run_script(REACT_TURN))
    call = {"call_id": "call_1", "name": "run", "arguments": '{"code": "1+1"}'}
    output = {"call_id": "call_1", "name": "run", "output": '[{"type": "text", "text": "2"}]'}
    assert result["output"] == [
        ["reasoning", "assistant", [{"type": "text", "text": "Let me compute."}]],
        ["message", "assistant", [{"type": "text", "text": "Computing"}]],
        ["plugin_call", "assistant", [{"type": "data", "data": call}]],
        ["plugin_call_output", "tool", [{"type": "data", "data": output}]],
        ["message", "assistant", [{"type": "text", "text": "It is 2."}]],
    ]
    assert result["usage"] == {"input_tokens": 10, "output_tokens": 3}
