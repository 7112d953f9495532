"""The client against a second, independent implementation of the protocol.

``FakeManager`` is written here from the protocol's description (AgentScope's sandbox
manager server), sharing no code with our server, to keep the client honest about the
wire format: paths, JSON bodies, the bearer header, the ``{"data": ...}`` envelope, and
errors turned into typed exceptions.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agentscope_serverless.errors import (
    SandboxAuthenticationError,
    SandboxNotFoundError,
    SandboxRequestError,
    SandboxUnavailableError,
)
from agentscope_serverless.services.sandbox import SandboxClient, SandboxService

TOKEN = "wire-token-0123456789"
PREFIX = "/sandbox-manager"


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeManager:
    """Behaviour of a sandbox manager server, plus knobs to make it misbehave."""

    requests: list[Recorded] = field(default_factory=list)
    sessions: dict[str, list[str]] = field(default_factory=dict)
    boxes: dict[str, str] = field(default_factory=dict)
    failures: dict[str, list[int]] = field(default_factory=dict)
    no_envelope: bool = False

    def answer(self, operation: str, body: dict[str, Any]) -> tuple[int, Any]:
        planned = self.failures.get(operation)
        if planned:
            return planned.pop(0), {"detail": f"Error in {operation}: planned failure"}
        if self.no_envelope:
            return 200, {"result": "not the protocol"}
        if operation == "create_from_pool":
            sandbox_id = f"container-{len(self.boxes) + 1}"
            self.boxes[sandbox_id] = body["sandbox_type"]
            key = (body.get("meta") or {}).get("session_ctx_id")
            if key:
                self.sessions.setdefault(key, []).append(sandbox_id)
            return 200, {"data": sandbox_id}
        if operation == "get_session_mapping":
            return 200, {"data": self.sessions.get(body["session_ctx_id"])}
        if operation in {"get_info", "check_health", "call_tool", "list_tools", "release"}:
            sandbox_id = body["identity"]
            if sandbox_id not in self.boxes:
                return 404, {"detail": f"sandbox {sandbox_id} not found"}
            if operation == "get_info":
                # AgentScope's ContainerModel names an image, not a type.
                image = f"agentscope/runtime-sandbox-{self.boxes[sandbox_id]}:latest"
                return 200, {"data": {"container_name": sandbox_id, "version": image}}
            if operation == "check_health":
                return 200, {"data": True}
            if operation == "list_tools":
                return 200, {"data": {"generic": {"run_ipython_cell": {}}}}
            if operation == "release":
                del self.boxes[sandbox_id]
                for ids in self.sessions.values():
                    if sandbox_id in ids:
                        ids.remove(sandbox_id)
                return 200, {"data": True}
            text = f"ran {body['tool_name']} with {json.dumps(body['arguments'])}"
            result = {
                "meta": None,
                "content": [{"type": "text", "text": text, "description": "stdout"}],
                "structuredContent": None,
                "isError": False,
            }
            return 200, {"data": result}
        return 404, {"detail": "Not Found"}


def make_handler(manager: FakeManager) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def reply(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            manager.requests.append(Recorded("GET", self.path, dict(self.headers), None))
            if self.path == f"{PREFIX}/health":
                self.reply(200, {"status": "healthy"})
            else:
                self.reply(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"null")
            manager.requests.append(Recorded("POST", self.path, dict(self.headers), body))
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.reply(401, {"detail": "Invalid or missing token"})
                return
            if not self.path.startswith(f"{PREFIX}/"):
                self.reply(404, {"detail": "Not Found"})
                return
            status, payload = manager.answer(self.path[len(PREFIX) + 1 :], body)
            self.reply(status, payload)

    return Handler


@pytest.fixture
def fake() -> Iterator[tuple[FakeManager, str]]:
    manager = FakeManager()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(manager))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield manager, f"http://127.0.0.1:{server.server_address[1]}{PREFIX}"
    server.shutdown()
    server.server_close()


def posts(manager: FakeManager) -> list[tuple[str, Any]]:
    return [(r.path[len(PREFIX) :], r.body) for r in manager.requests if r.method == "POST"]


async def test_each_operation_posts_its_json_arguments_to_its_path(
    fake: tuple[FakeManager, str],
) -> None:
    manager, url = fake
    client = SandboxClient(url, TOKEN)
    try:
        sandbox_id = await client.create_from_pool("base", {"session_ctx_id": "s_u"})
        assert sandbox_id == "container-1"
        assert await client.get_session_mapping("s_u") == ["container-1"]
        assert await client.get_session_mapping("nobody") == []
        assert (await client.get_info(sandbox_id))["container_name"] == "container-1"
        assert await client.check_health(sandbox_id) is True
        result = await client.call_tool(sandbox_id, "run_ipython_cell", {"code": "1+1"})
        assert result.part("stdout") == 'ran run_ipython_cell with {"code": "1+1"}'
        assert await client.list_tools(sandbox_id, "generic") == {
            "generic": {"run_ipython_cell": {}}
        }
        assert await client.release(sandbox_id) is True
    finally:
        await client.aclose()

    assert posts(manager) == [
        ("/create_from_pool", {"sandbox_type": "base", "meta": {"session_ctx_id": "s_u"}}),
        ("/get_session_mapping", {"session_ctx_id": "s_u"}),
        ("/get_session_mapping", {"session_ctx_id": "nobody"}),
        ("/get_info", {"identity": "container-1"}),
        ("/check_health", {"identity": "container-1"}),
        (
            "/call_tool",
            {
                "identity": "container-1",
                "tool_name": "run_ipython_cell",
                "arguments": {"code": "1+1"},
            },
        ),
        ("/list_tools", {"identity": "container-1", "tool_type": "generic"}),
        ("/release", {"identity": "container-1"}),
    ]
    for request in manager.requests:
        assert request.headers["Authorization"] == f"Bearer {TOKEN}"
        assert request.headers["Content-Type"] == "application/json"


async def test_health_is_a_get_then_a_mapping_asked_with_the_token(
    fake: tuple[FakeManager, str],
) -> None:
    manager, url = fake
    client = SandboxClient(url, TOKEN)
    assert await client.health() is True
    await client.aclose()
    assert [(r.method, r.path, r.body) for r in manager.requests] == [
        ("GET", f"{PREFIX}/health", None),
        ("POST", f"{PREFIX}/get_session_mapping", {"session_ctx_id": "health-check"}),
    ]
    assert manager.requests[1].headers["Authorization"] == f"Bearer {TOKEN}"
    refused = SandboxClient(url, "wrong-token-value")
    assert await refused.health() is False
    await refused.aclose()


async def test_a_rejected_token_raises_an_authentication_error_without_the_token(
    fake: tuple[FakeManager, str],
) -> None:
    _, url = fake
    client = SandboxClient(url, "wrong-token-value")
    with pytest.raises(SandboxAuthenticationError) as caught:
        await client.create_from_pool("base")
    await client.aclose()
    assert "wrong-token-value" not in str(caught.value)
    assert "Invalid or missing token" in str(caught.value)


async def test_error_statuses_become_typed_errors(fake: tuple[FakeManager, str]) -> None:
    manager, url = fake
    client = SandboxClient(url, TOKEN, retries=0)
    with pytest.raises(SandboxNotFoundError, match="sandbox ghost not found"):
        await client.call_tool("ghost", "run_ipython_cell", {"code": "1"})
    manager.failures["create_from_pool"] = [400]
    with pytest.raises(SandboxRequestError, match="planned failure"):
        await client.create_from_pool("base")
    manager.failures["create_from_pool"] = [500]
    with pytest.raises(SandboxUnavailableError, match="planned failure"):
        await client.create_from_pool("base")
    manager.no_envelope = True
    with pytest.raises(SandboxUnavailableError, match="a JSON object without 'data'"):
        await client.get_session_mapping("s")
    await client.aclose()


async def test_idempotent_operations_are_retried_and_others_are_not(
    fake: tuple[FakeManager, str],
) -> None:
    manager, url = fake
    client = SandboxClient(url, TOKEN, retries=2, retry_backoff=0.01)
    sandbox_id = await client.create_from_pool("base")
    manager.failures["get_info"] = [503, 502]
    assert (await client.get_info(sandbox_id))["container_name"] == sandbox_id
    assert [path for path, _ in posts(manager)].count("/get_info") == 3

    manager.failures["call_tool"] = [503]
    with pytest.raises(SandboxUnavailableError):
        await client.call_tool(sandbox_id, "run_shell_command", {"command": "rm -rf x"})
    assert [path for path, _ in posts(manager)].count("/call_tool") == 1
    await client.aclose()


async def test_an_unreachable_server_is_unavailable() -> None:
    client = SandboxClient("http://127.0.0.1:9", TOKEN, retries=1, retry_backoff=0.01)
    with pytest.raises(SandboxUnavailableError, match="cannot connect"):
        await client.create_from_pool("base")
    assert await client.health() is False
    await client.aclose()


async def test_the_service_maps_sessions_like_agentscope(fake: tuple[FakeManager, str]) -> None:
    manager, url = fake
    async with SandboxService(url, TOKEN) as service:
        boxes = await service.connect_async("s1", "u1", env_types=["base", "filesystem"])
        assert [b.sandbox_type for b in boxes] == ["base", "filesystem"]
        again = await service.connect_async("s1", "u1", env_types=["filesystem", "base"])
        assert [b.sandbox_id for b in again] == [boxes[1].sandbox_id, boxes[0].sandbox_id]
        assert await service.release_async("s1", "u1") is True

    creates = [body for path, body in posts(manager) if path == "/create_from_pool"]
    assert creates == [
        # AgentScope's session key, plus the owner our server counts shares by.
        {"sandbox_type": "base", "meta": {"session_ctx_id": "s1_u1", "owner_id": "u1"}},
        {"sandbox_type": "filesystem", "meta": {"session_ctx_id": "s1_u1", "owner_id": "u1"}},
    ]
    assert manager.boxes == {}


async def test_sync_calls_work_inside_a_running_loop(fake: tuple[FakeManager, str]) -> None:
    _, url = fake
    async with SandboxService(url, TOKEN) as service:
        [box] = service.connect("s2")
        assert box.call_tool("run_shell_command", {"command": "ls"})["isError"] is False
        assert service.release("s2") is True
