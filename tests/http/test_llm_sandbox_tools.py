"""The LLM agent with sandbox tools, end to end: /process → agent → scripted model, and the
tool call runs in the user's session sandbox on our sandbox server (all real HTTP)."""

from __future__ import annotations

import json
import uuid

import httpx
from fastapi import Request
from fastapi.responses import Response

from agentscope_serverless.agents.llm import create_llm_app
from agentscope_serverless.http import create_app
from agentscope_serverless.services.sandbox import SandboxService
from agentscope_serverless.settings import load_settings
from tests.http.test_llm_agent import API_KEY, ScriptedLLM, chunk, messages_of
from tests.support.http import Keys, bearer, running, stream, text_of, user_message
from tests.support.sandbox_server import RunningServer

CODE = "answer = 6 * 7\nprint(answer)"
RUN_PYTHON = [
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_py",
                    "type": "function",
                    "function": {
                        "name": "run_ipython_cell",
                        "arguments": json.dumps({"code": CODE}),
                    },
                }
            ]
        }
    ),
    chunk(finish="tool_calls"),
]


class ReportingLLM(ScriptedLLM):
    """Calls run_ipython_cell, then answers with what the tool returned."""

    def __init__(self) -> None:
        super().__init__([RUN_PYTHON])

    async def complete(self, request: Request) -> Response:
        body = await request.json()
        tool_results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if tool_results:
            self.replies = [[chunk({"content": f"The sandbox says {tool_results[-1].strip()}."})]]
            self.requests.clear()
        return await super().complete(request)


def test_the_model_runs_python_in_the_users_session_sandbox(
    keys: Keys, sandbox_server: RunningServer
) -> None:
    llm = ReportingLLM()
    settings = load_settings(
        sandbox_base_url=sandbox_server.url, sandbox_bearer_token=sandbox_server.token
    )
    with running(llm.app) as llm_url:
        agent_settings = load_settings(
            llm_base_url=f"{llm_url}/v1", llm_api_key=API_KEY, llm_model="scripted"
        )
        app = create_llm_app(sandbox_tools=True, settings=agent_settings)
        with (
            running(create_app(settings=settings, agent_app=app, key_store=keys.store)) as url,
            httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=60) as client,
        ):
            body = {"input": [user_message("What is 6 times 7?")], "session_id": "maths"}
            _, sse = stream(client, "/process", json=body)
            call, output, answer = messages_of(sse.data)
            offered = {t["function"]["name"] for t in llm.requests[0]["body"]["tools"]}
            assert {"run_ipython_cell", "run_shell_command", "read_file"} <= offered
            assert call["content"][0]["data"]["name"] == "run_ipython_cell"
            assert output["content"][0]["data"]["output"] == "42\n"
            assert answer["content"][0]["text"] == "The sandbox says 42."
            assert "42" in text_of(sse.data)

            # The same session's sandbox, reached over the sandbox API, kept the variable.
            sandboxes = client.get("/sandboxes/maths").json()["sandboxes"]
            assert [s["sandbox_type"] for s in sandboxes] == ["base"]
            cell = {"code": "print(answer)"}
            result = client.post("/sandboxes/maths/tools/run_ipython_cell", json=cell).json()
            assert result["content"][0]["text"] == "42\n"
            assert client.delete("/sandboxes/maths").json()["released"] is True


async def test_the_sandbox_is_the_callers_own(keys: Keys, sandbox_server: RunningServer) -> None:
    llm = ReportingLLM()
    settings = load_settings(
        sandbox_base_url=sandbox_server.url, sandbox_bearer_token=sandbox_server.token
    )
    session = f"shared-{uuid.uuid4().hex[:8]}"
    with running(llm.app) as llm_url:
        app = create_llm_app(
            sandbox_tools=["run_ipython_cell"],
            settings=load_settings(llm_base_url=f"{llm_url}/v1", llm_model="scripted"),
        )
        with running(create_app(settings=settings, agent_app=app, key_store=keys.store)) as url:
            async with httpx.AsyncClient(base_url=url, headers=bearer(keys.bob)) as client:
                body = {"input": [user_message("6 x 7?")], "session_id": session, "stream": False}
                response = await client.post("/process", json=body, timeout=60)
                assert response.status_code == 200
            async with SandboxService(sandbox_server.url, sandbox_server.token) as service:
                assert await service.sandboxes_async(session, "alice") == []
                [bobs] = await service.sandboxes_async(session, "bob")
                printed = await bobs.run_ipython_cell_async("print(answer)")
                assert printed["content"][0]["text"] == "42\n"
        # The app's sandbox service released what it created when the server stopped.
        async with SandboxService(sandbox_server.url, sandbox_server.token) as service:
            assert await service.sandboxes_async(session, "bob") == []
