"""The AgentScope adapters with an AgentScope-shaped package (``agentscope_standin/``): message
conversion both ways, and a sandbox tool run as an AgentScope tool function on a real
sandbox server. They run in a child process, so ``agentscope`` is never importable here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS
from tests.parity.test_agentscope_query import run_script
from tests.support.sandbox_server import RunningServer

STANDIN = Path(__file__).parent / "agentscope_standin"

SCRIPT = """
import asyncio, sys
from agentscope.message import Msg
from agentscope.tool import ToolResponse
from agentscope_serverless.adapters.agentscope.message import (
    agentscope_msg_to_message, message_to_agentscope_msg,
)
from agentscope_serverless.adapters.agentscope.tool import sandbox_tool_adapter
from agentscope_serverless.services.sandbox import SandboxService

msg = Msg("Friday", [{"type": "text", "text": "Hi "}, {"type": "tool_use", "id": "c1",
          "name": "f", "input": {"x": 1}}, {"type": "text", "text": "there"}], "assistant")
message = agentscope_msg_to_message(msg)
texts = [getattr(part, "text", None) for part in message.content]
assert message.role == "assistant" and texts == ["Hi ", None, "there"], message
back = message_to_agentscope_msg(message)
assert (back.id, back.name, back.role, back.content) == (msg.id, "Friday", "assistant",
    msg.content), vars(back)
plain = message_to_agentscope_msg({"role": "user", "content": "hello"})
assert (plain.role, plain.content) == ("user", "hello")
assert [m.role for m in agentscope_msg_to_message([msg, plain])] == ["assistant", "user"]

# Media sent as data (OpenAI's input_audio, a data: URI) and as URLs, both ways.
heard = message_to_agentscope_msg({"role": "user", "content": [
    {"type": "audio", "data": "UklGRg==", "format": "wav"},
    {"type": "audio", "data": "https://example.com/a.mp3", "format": "url"}]})
assert heard.content == [
    {"type": "audio", "source": {"type": "base64", "media_type": "audio/wav", "data": "UklGRg=="}},
    {"type": "audio", "source": {"type": "url", "url": "https://example.com/a.mp3"}}], heard.content
media = Msg("user", [*heard.content, {"type": "image", "source": {"type": "base64",
            "media_type": "image/png", "data": "iVBORw=="}}], "user")
parts = agentscope_msg_to_message(media).content
assert [(p.type, getattr(p, "format", None)) for p in parts] == [
    ("audio", "wav"), ("audio", "url"), ("image", None)], parts
assert parts[2].image_url == "data:image/png;base64,iVBORw=="
assert message_to_agentscope_msg(agentscope_msg_to_message(media)).content[:2] == heard.content

# AgentScope has no file block: the model reads a mention, the agent's code the file.
attached = message_to_agentscope_msg({"role": "user", "content": [
    {"type": "text", "text": "Summarize these."},
    {"type": "file", "file_url": "https://example.com/r.pdf", "filename": "r.pdf"},
    {"type": "file", "file_data": "data:text/csv;base64,YSxi", "filename": "t.csv"},
    {"type": "file", "file_id": "file-abc"}]})
assert attached.content == ("Summarize these.[file r.pdf: https://example.com/r.pdf]"
    "[file t.csv: sent with the message][file: file-abc]"), attached.content
assert [f["filename"] for f in attached.metadata["files"]] == ["r.pdf", "t.csv", None]
assert attached.metadata["files"][1]["file_data"] == "data:text/csv;base64,YSxi"
refused = message_to_agentscope_msg({"role": "assistant", "content": [
    {"type": "refusal", "refusal": "I cannot help with that."}]})
assert refused.content == "I cannot help with that.", refused.content

async def main():
    async with SandboxService(base_url=sys.argv[1], bearer_token=sys.argv[2]) as service:
        [box] = await service.connect_async("adapter-test", user_id="u1")
        tool = sandbox_tool_adapter(box, "run_ipython_cell")
        assert tool.json_schema["function"]["name"] == "run_ipython_cell"
        assert "code" in tool.json_schema["function"]["parameters"]["properties"]
        response = await tool(code="print(6 * 7)")
        assert isinstance(response, ToolResponse)
        assert "42" in response.content[0]["text"] and not response.metadata["isError"]
        await service.release_async("adapter-test", user_id="u1")
    print("ok")

asyncio.run(main())
"""


def run_with_agentscope(script: str, *args: str) -> str:
    """What ``script`` prints, run by a new interpreter importing AgentScope's stand-in;
    it must succeed."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(STANDIN), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_message_conversion_and_the_sandbox_tool_adapter(sandbox_server: RunningServer) -> None:
    stdout = run_with_agentscope(SCRIPT, sandbox_server.url, sandbox_server.token)
    assert stdout.strip() == "ok"


SESSION_MEMORY = """
import asyncio
from agentscope.message import Msg
from agentscope_serverless.adapters.agentscope.memory import AgentScopeSessionHistoryMemory
from agentscope_serverless.services.session_history import InMemorySessionHistoryService

async def main():
    async with InMemorySessionHistoryService() as service:
        # AgentScope Runtime's order: the service, then the user, then the session.
        memory = AgentScopeSessionHistoryMemory(service, "alice", "chat-1")
        await memory.add(Msg("alice", "I love green tea", "user"))
        stored = await service.get_session("alice", "chat-1")
        print(stored and [m.get_text_content() for m in stored.messages])
        print([m.content for m in await memory.get_memory()])

asyncio.run(main())
"""


def test_the_session_memory_takes_the_user_before_the_session_as_agentscopes() -> None:
    assert run_script(SESSION_MEMORY).splitlines() == [
        "['I love green tea']",
        "['I love green tea']",
    ]


NOT_A_MSG = """
import asyncio
from agentscope.message import Msg
from agentscope_serverless.adapters.agentscope.memory import AgentScopeSessionHistoryMemory
from agentscope_serverless.services.session_history import InMemorySessionHistoryService

async def main():
    async with InMemorySessionHistoryService() as service:
        memory = AgentScopeSessionHistoryMemory(service=service, session_id="s1", user_id="u1")
        for given in ("hello", {"role": "user", "content": "hello"}, [Msg("u", "a", "user"), 5]):
            try:
                await memory.add(given)
            except TypeError as exc:
                print(exc)
        print(await memory.size())

asyncio.run(main())
"""


def test_the_session_memory_refuses_what_is_no_msg_naming_it() -> None:
    # "'str' object has no attribute 'role'", and a list storing nothing of its Msgs.
    assert run_script(NOT_A_MSG).splitlines() == [
        "memories must be AgentScope Msg objects (or a list of them), got str",
        "memories must be AgentScope Msg objects (or a list of them), got dict",
        "memories must be AgentScope Msg objects (or a list of them), got int",
        "0",
    ]


TOOL_OF_A_SANDBOX_METHOD = """
import asyncio, inspect, sys
from agentscope.tool import Toolkit, ToolResponse
from agentscope_serverless.adapters.agentscope.tool import sandbox_tool_adapter
from agentscope_serverless.services.sandbox import SandboxService

async def main():
    async with SandboxService(base_url=sys.argv[1], bearer_token=sys.argv[2]) as service:
        [box] = service.connect("adapter-method-test", user_id="u1")
        toolkit = Toolkit()
        # AgentScope Runtime's form: a sandbox's tool method, wrapped to answer ToolResponses.
        tool = sandbox_tool_adapter(box.run_ipython_cell)
        toolkit.register_tool_function(tool)
        print(tool.__name__, list(inspect.signature(tool).parameters))
        response = toolkit.tools["run_ipython_cell"](code="print(6 * 7)")
        assert isinstance(response, ToolResponse), response
        print(response.content)
        shell = sandbox_tool_adapter(box.run_shell_command_async)
        response = await shell(command="echo hi")
        print(response.content[0])
        service.release("adapter-method-test", user_id="u1")

asyncio.run(main())
"""


def test_the_sandbox_tool_adapter_wraps_a_sandbox_tool_method_as_agentscopes(
    sandbox_server: RunningServer,
) -> None:
    stdout = run_with_agentscope(TOOL_OF_A_SANDBOX_METHOD, sandbox_server.url, sandbox_server.token)
    assert stdout.splitlines() == [
        "run_ipython_cell ['code']",
        "[{'type': 'text', 'text': '42\\n'}]",
        "{'type': 'text', 'text': 'hi\\n'}",
    ]


MARKED_HINTS = """
import asyncio
from agentscope.message import Msg
from agentscope_serverless.adapters.agentscope.memory import AgentScopeSessionHistoryMemory
from agentscope_serverless.services.session_history import InMemorySessionHistoryService

async def main():
    async with InMemorySessionHistoryService() as service:
        memory = AgentScopeSessionHistoryMemory(service, user_id="alice", session_id="chat-1")
        await memory.add(Msg("alice", "Plan my trip", "user"))
        # A reasoning step of agentscope 1.0.21's ReActAgent with a plan: its hint is marked,
        # read in the prompt, then deleted by its mark.
        await memory.add(Msg("user", "<system-hint>step 1</system-hint>", "user"), marks="hint")
        print([m.content for m in await memory.get_memory(exclude_mark=None)])
        print([m.content for m in await memory.get_memory(mark="hint")])
        print(await memory.delete_by_mark(mark="hint"), await memory.size())
        await memory.add(Msg("Friday", "Where to?", "assistant"))
        print([m.content for m in await memory.get_memory()])
        stored = await service.get_session("alice", "chat-1")
        print([m.get_text_content() for m in stored.messages])

asyncio.run(main())
"""


def test_the_session_memory_keeps_marked_hints_for_the_agent_alone() -> None:
    assert run_script(MARKED_HINTS).splitlines() == [
        "['Plan my trip', '<system-hint>step 1</system-hint>']",
        "['<system-hint>step 1</system-hint>']",
        "1 1",
        "['Plan my trip', 'Where to?']",
        "['Plan my trip', 'Where to?']",
    ]


TOOL_MESSAGES_TO_MSGS = """
from agentscope_serverless.adapters.agentscope.message import message_to_agentscope_msg

calls = message_to_agentscope_msg([
    # A tool call and its result as the runner keeps them, then as OpenAI clients send them.
    {"type": "plugin_call", "role": "assistant", "content": [{"type": "data", "data": {
        "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"type": "plugin_call_output", "role": "tool", "content": [{"type": "data", "data": {
        "call_id": "c1", "name": "get_weather",
        "output": '[{"type": "text", "text": "Sunny"}]'}}]},
    {"type": "function_call", "role": "assistant", "content": [{"type": "data", "data": {
        "call_id": "c2", "name": "add", "arguments": "{}"}}]},
    {"type": "function_call_output", "role": "tool", "content": [{"type": "data", "data": {
        "call_id": "c2", "output": "42"}}]},
    {"type": "reasoning", "role": "assistant", "content": [{"type": "text", "text": "Hmm."}]},
])
for msg in calls:
    print(msg.role, msg.content)
"""


def test_tool_calls_results_and_reasoning_become_agentscopes_blocks() -> None:
    # As AgentScope Runtime's adapter: the model is shown calls and results, not their text.
    assert run_script(TOOL_MESSAGES_TO_MSGS).splitlines() == [
        "assistant [{'type': 'tool_use', 'id': 'c1', 'name': 'get_weather', "
        "'input': {'city': 'Paris'}}]",
        "system [{'type': 'tool_result', 'id': 'c1', 'name': 'get_weather', "
        "'output': [{'type': 'text', 'text': 'Sunny'}]}]",
        "assistant [{'type': 'tool_use', 'id': 'c2', 'name': 'add', 'input': {}}]",
        "system [{'type': 'tool_result', 'id': 'c2', 'name': '', 'output': '42'}]",
        "assistant [{'type': 'thinking', 'thinking': 'Hmm.'}]",
    ]


MARKED_AND_DELETED_HISTORY = """
import asyncio, json, sys, uuid
from agentscope.message import Msg
from agentscope_serverless.adapters.agentscope.memory import AgentScopeSessionHistoryMemory
from agentscope_serverless.services.session_history import InMemorySessionHistoryService
from agentscope_serverless.services.session_history.dynamodb import (
    DynamoDBSessionHistoryService,
)
from agentscope_serverless.services.session_history.redis import RedisSessionHistoryService

backend = json.loads(sys.argv[1])
shared = InMemorySessionHistoryService()

def make():
    # Each call another process on the same store (in memory: the same object).
    if backend["kind"] == "redis":
        return RedisSessionHistoryService(redis_url=backend["url"])
    if backend["kind"] == "dynamodb":
        return DynamoDBSessionHistoryService(backend["table"], **backend["options"])
    return shared

async def main():
    sid = uuid.uuid4().hex
    a, b, c = (Msg("alice", text, "user") for text in "abc")
    async with make() as service:
        memory = AgentScopeSessionHistoryMemory(service, "alice", sid)
        await memory.add([a, b, c])
        # agentscope's ReActAgent, compressing its memory, marks what the summary replaces.
        print(await memory.update_messages_mark(new_mark="compressed", msg_ids=[a.id, b.id]))
        await memory.update_compressed_summary("a and b")
    async with make() as service:
        memory = AgentScopeSessionHistoryMemory(service, "alice", sid)
        # The summary in place of what it replaces, as the agent reads its memory.
        print([m.content for m in await memory.get_memory(exclude_mark="compressed")])
        read = memory.get_memory
        print([m.content for m in await read(exclude_mark="compressed", prepend_summary=False)])
        print([m.content for m in await read(mark="compressed", prepend_summary=False)])
        print(await memory.delete([b.id]), await memory.delete_by_mark("compressed"))
        print([m.content for m in await memory.get_memory()], await memory.size())
        # Another object appending while this one deletes: nothing it stores is lost.
        other = AgentScopeSessionHistoryMemory(make(), "alice", sid)
        async with other.service:
            added = [Msg("alice", f"new {i}", "user") for i in range(5)]
            await asyncio.gather(memory.delete([c.id]), *(other.add(m) for m in added))
            stored = await service.get_session("alice", sid)
        print(sorted(m.get_text_content() for m in stored.messages))

asyncio.run(main())
"""


@pytest.mark.parametrize("kind", ["in_memory", "redis", "dynamodb"])
def test_the_session_memory_marks_and_deletes_stored_messages_as_agentscopes(
    kind: str, request: pytest.FixtureRequest
) -> None:
    backend: dict[str, Any] = {"kind": kind}
    if kind == "redis":
        backend["url"] = request.getfixturevalue("redis_server").url
    elif kind == "dynamodb":
        server = request.getfixturevalue("dynamodb_server")
        backend["table"] = server.sessions_table
        backend["options"] = {
            "endpoint_url": server.endpoint_url,
            "region_name": server.region,
            **LOCAL_AWS_CREDENTIALS,
        }
    stdout = run_with_agentscope(MARKED_AND_DELETED_HISTORY, json.dumps(backend))
    assert stdout.splitlines() == [
        "2",
        "['a and b', 'c']",
        "['c']",
        "['a', 'b']",
        "1 1",
        "['a and b', 'c'] 1",
        str(sorted(f"new {i}" for i in range(5))),
    ]


MISSING_AGENTSCOPE = """
import importlib, sys


class NoAgentScope:  # as if not installed, whatever this environment has
    def find_spec(self, name, path=None, target=None):
        if name == "agentscope":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, NoAgentScope())
for name in ["message", "memory", "long_term_memory", "tool"]:
    module = f"agentscope_serverless.adapters.agentscope.{name}"
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:  # an ImportError still, for who catches that
        assert exc.name == "agentscope", exc.name
        print(exc)
    else:
        raise AssertionError(f"{module} imported without agentscope")
"""


def test_an_adapter_imported_without_agentscope_names_the_extra_to_install() -> None:
    # It was a bare "No module named 'agentscope'".
    said = run_script(MISSING_AGENTSCOPE).splitlines()
    assert said == [
        f"agentscope_serverless.adapters.agentscope.{name} needs the agentscope package (1.x, "
        "as AgentScope Runtime 1.0.5): pip install 'agentscope-serverless[agentscope]'"
        for name in ["message", "memory", "long_term_memory", "tool"]
    ]
