"""Our sandbox server driven by a client written here from AgentScope's protocol table.

``ManagerProtocol`` shares no code with our client: it knows only what AgentScope Runtime
1.0.5's sandbox manager client sends (``POST {base_url}/{method}`` with the keyword
arguments as JSON and the bearer token, and ``POST {base_url}/{method}_async`` from its
async client) and reads ``{"data": ...}`` back. Every operation runs in both forms.

| Endpoint | JSON body -> data |
|---|---|
| /create_from_pool | {"sandbox_type", "meta"} -> sandbox id |
| /create | {"sandbox_type", "mount_dir", "storage_path", "environment", "meta"} -> sandbox id |
| /release, /start, /stop, /get_status, /check_health | {"identity"} |
| /get_info | {"identity"} -> ContainerModel |
| /call_tool | {"identity", "tool_name", "arguments"} -> MCP CallToolResult |
| /list_tools | {"identity", "tool_type"} -> {tool_type: {name: {"name", "json_schema"}}} |
| /add_mcp_servers | {"identity", "server_configs", "overwrite"} |
| /get_session_mapping | {"session_ctx_id"} -> list of ids |
| /list_session_keys | {} -> list of keys |
| /cleanup | {} -> refused here |
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.sandbox_server import RunningServer

OPERATIONS = (
    "create_from_pool",
    "create",
    "release",
    "start",
    "stop",
    "get_status",
    "get_info",
    "check_health",
    "call_tool",
    "list_tools",
    "add_mcp_servers",
    "get_session_mapping",
    "list_session_keys",
)
CONTAINER_MODEL_FIELDS = {
    "session_id",
    "container_id",
    "container_name",
    "url",
    "ports",
    "mount_dir",
    "storage_path",
    "runtime_token",
    "version",
    "meta",
    "timeout",
}


class ProtocolError(Exception):
    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


class ManagerProtocol:
    """AgentScope's remote manager calls: ``twin`` picks the ``_async`` routes."""

    def __init__(self, base_url: str, token: str | None, *, twin: bool) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=60)
        self.twin = twin

    def post(self, method: str, **kwargs: Any) -> Any:
        path = f"/{method}_async" if self.twin else f"/{method}"
        # As AgentScope's client (requests) encodes it: ASCII, a lone surrogate escaped.
        payload = json.dumps(kwargs).encode()
        headers = {"Content-Type": "application/json"}
        response = self.http.post(path, content=payload, headers=headers)
        body = response.json()
        if response.status_code != 200:
            raise ProtocolError(response.status_code, body.get("detail"))
        assert set(body) == {"data"}
        return body["data"]

    def create_from_pool(
        self, sandbox_type: str = "base", meta: dict[str, Any] | None = None
    ) -> str:
        return str(self.post("create_from_pool", sandbox_type=sandbox_type, meta=meta))

    def create(self, sandbox_type: str = "base", **kwargs: Any) -> str:
        return str(self.post("create", sandbox_type=sandbox_type, **kwargs))

    def call_tool(self, identity: str, tool_name: str, arguments: dict[str, Any]) -> Any:
        return self.post("call_tool", identity=identity, tool_name=tool_name, arguments=arguments)


@pytest.fixture(params=["sync", "async"])
def protocol(
    request: pytest.FixtureRequest, sandbox_server: RunningServer
) -> Iterator[ManagerProtocol]:
    client = ManagerProtocol(
        sandbox_server.url, sandbox_server.token, twin=request.param == "async"
    )
    yield client
    client.http.close()


def text(result: dict[str, Any]) -> str:
    return "".join(part["text"] for part in result["content"])


def test_a_sandbox_lives_through_every_operation(protocol: ManagerProtocol) -> None:
    key = f"session-{uuid.uuid4().hex[:8]}_user"
    sandbox_id = protocol.create_from_pool("base", {"session_ctx_id": key})
    assert protocol.post("get_session_mapping", session_ctx_id=key) == [sandbox_id]
    assert key in protocol.post("list_session_keys")
    assert protocol.post("check_health", identity=sandbox_id) is True
    assert protocol.post("get_status", identity=sandbox_id) == "running"

    info = protocol.post("get_info", identity=sandbox_id)
    assert set(info) >= CONTAINER_MODEL_FIELDS
    assert info["container_name"] == sandbox_id
    assert info["meta"] == {"session_ctx_id": key}
    assert "base" in info["version"]
    assert info["mount_dir"] is info["storage_path"] is info["runtime_token"] is None

    result = protocol.call_tool(sandbox_id, "run_ipython_cell", {"code": "x = 6\nx * 7"})
    assert result == {
        "meta": None,
        "content": [{"type": "text", "text": "42\n", "description": "stdout"}],
        "structuredContent": None,
        "isError": False,
    }
    shell = protocol.call_tool(sandbox_id, "run_shell_command", {"command": "echo hi; exit 2"})
    assert [(p["description"], p["text"]) for p in shell["content"]] == [
        ("stdout", "hi\n"),
        ("returncode", "2"),
    ]
    assert shell["isError"] is True

    assert protocol.post("stop", identity=sandbox_id) is True
    assert protocol.post("get_status", identity=sandbox_id) == "exited"
    assert protocol.post("check_health", identity=sandbox_id) is False
    with pytest.raises(ProtocolError) as stopped:
        protocol.call_tool(sandbox_id, "run_ipython_cell", {"code": "x"})
    assert stopped.value.status == 400 and "start it first" in stopped.value.detail
    assert protocol.post("start", identity=sandbox_id) is True
    assert protocol.post("get_status", identity=sandbox_id) == "running"
    # Stopping ended the interpreter: the workspace stays, the variables do not.
    after = protocol.call_tool(sandbox_id, "run_ipython_cell", {"code": "'x' in globals()"})
    assert text(after) == "False\n"

    assert protocol.post("release", identity=sandbox_id) is True
    assert protocol.post("release", identity=sandbox_id) is False
    assert protocol.post("get_session_mapping", session_ctx_id=key) == []
    assert key not in protocol.post("list_session_keys")
    for method in ("get_info", "get_status", "check_health", "start", "stop"):
        with pytest.raises(ProtocolError) as gone:
            protocol.post(method, identity=sandbox_id)
        assert gone.value.status == 404


def test_list_tools_has_agentscopes_shape(protocol: ManagerProtocol) -> None:
    sandbox_id = protocol.create_from_pool("filesystem")
    try:
        tools = protocol.post("list_tools", identity=sandbox_id, tool_type=None)
        assert set(tools) == {"generic", "filesystem"}
        assert set(tools["filesystem"]) == {
            "read_file",
            "read_multiple_files",
            "write_file",
            "edit_file",
            "create_directory",
            "list_directory",
            "directory_tree",
            "move_file",
            "search_files",
            "get_file_info",
            "list_allowed_directories",
        }
        for group in tools.values():
            for name, tool in group.items():
                assert set(tool) == {"name", "json_schema"} and tool["name"] == name
                schema = tool["json_schema"]
                assert schema["type"] == "function"
                assert schema["function"]["name"] == name
                assert schema["function"]["parameters"]["type"] == "object"
        edit = tools["filesystem"]["edit_file"]["json_schema"]["function"]["parameters"]
        assert set(edit["properties"]) == {"path", "edits", "dryRun"}
        assert edit["properties"]["edits"]["items"]["required"] == ["oldText", "newText"]
        search = tools["filesystem"]["search_files"]["json_schema"]["function"]["parameters"]
        assert set(search["properties"]) == {"path", "pattern", "excludePatterns"}

        only = protocol.post("list_tools", identity=sandbox_id, tool_type="generic")
        assert list(only) == ["generic"]
        assert set(only["generic"]) == {"run_ipython_cell", "run_shell_command"}
        assert protocol.post("list_tools", identity=sandbox_id, tool_type="browser") == {
            "browser": {}
        }
    finally:
        protocol.post("release", identity=sandbox_id)


def test_create_sets_the_environment_and_refuses_host_paths(protocol: ManagerProtocol) -> None:
    sandbox_id = protocol.create("base", environment={"GREETING": "hello there"}, meta=None)
    try:
        echoed = protocol.call_tool(sandbox_id, "run_shell_command", {"command": "echo $GREETING"})
        assert echoed["content"][0]["text"] == "hello there\n"
        cell = protocol.call_tool(
            sandbox_id, "run_ipython_cell", {"code": "import os; os.environ['GREETING']"}
        )
        assert text(cell) == "'hello there'\n"
    finally:
        protocol.post("release", identity=sandbox_id)
    for hostile in (
        {"mount_dir": "/root"},
        {"storage_path": "oss://bucket/x"},
        {"environment": {"PATH": "/tmp/evil"}},
        {"environment": {"LD_PRELOAD": "/tmp/evil.so"}},
        {"environment": {"LD_AUDIT": "/workspace/evil.so"}},
        {"environment": {"LD_LIBRARY_PATH": "/workspace/lib"}},
        {"environment": {"BAD NAME": "x"}},
        {"environment": {"NUL": "a\x00b"}},
        {"environment": {f"V{i}": "x" for i in range(65)}},
        {"environment": {"BIG": "x" * 70_000}},
        {"sandbox_type": "browser"},
    ):
        with pytest.raises(ProtocolError) as refused:
            protocol.post("create", **{"sandbox_type": "base", **hostile})
        assert refused.value.status in (400, 422), hostile
        assert isinstance(refused.value.detail, str)


def test_an_environment_create_accepts_reaches_the_sandbox_and_one_it_cannot_is_refused(
    protocol: ManagerProtocol,
) -> None:
    # 60 KB of text outside the BMP, and of control characters: in JSON's ASCII escapes,
    # three times what an argument of a program may hold.
    faces, controls = "\U0001f600" * 15_000, "\x01" * 4_000
    sandbox_id = protocol.create(
        "base", environment={"FACES": faces, "CONTROLS": controls, "TAB": "a\tb"}, meta=None
    )
    try:
        cell = protocol.call_tool(
            sandbox_id,
            "run_ipython_cell",
            {"code": "import os; e = os.environ; e['FACES'].count('\U0001f600'), e['TAB']"},
        )
        assert text(cell) == "(15000, 'a\\tb')\n"
        cell = protocol.call_tool(
            sandbox_id, "run_ipython_cell", {"code": "os.environ['CONTROLS'] == '\x01' * 4000"}
        )
        assert text(cell) == "True\n"
    finally:
        protocol.post("release", identity=sandbox_id)
    # No Unicode text, no environment variable: it could never be set.
    with pytest.raises(ProtocolError) as refused:
        protocol.post("create", sandbox_type="base", environment={"LONE": "\ud800"})
    assert refused.value.status == 400
    assert "environment variable LONE is not Unicode text" in refused.value.detail


def test_add_mcp_servers_is_refused_saying_what_is_offered(protocol: ManagerProtocol) -> None:
    sandbox_id = protocol.create_from_pool("base")
    try:
        configs = {"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time"]}}}
        with pytest.raises(ProtocolError) as refused:
            protocol.post(
                "add_mcp_servers", identity=sandbox_id, server_configs=configs, overwrite=False
            )
        assert refused.value.status == 400
        assert "does not add MCP servers (time)" in refused.value.detail
        assert "run_ipython_cell" in refused.value.detail and "edit_file" in refused.value.detail
        with pytest.raises(ProtocolError) as empty:
            protocol.post("add_mcp_servers", identity=sandbox_id, server_configs={})
        assert empty.value.status == 400
        with pytest.raises(ProtocolError) as unknown:
            protocol.post("add_mcp_servers", identity="sbx-none", server_configs=configs)
        assert unknown.value.status == 404
        # Nothing ran: the sandbox has the same tools as before.
        tools = protocol.post("list_tools", identity=sandbox_id)
        assert set(tools) == {"generic", "filesystem"}
    finally:
        protocol.post("release", identity=sandbox_id)


def test_agentscopes_async_client_sends_positional_arguments_as_args(
    sandbox_server: RunningServer,
) -> None:
    """AgentScope's ``get_info_async(sandbox_id)`` posts ``{"args": sandbox_id}`` (its async
    wrappers are declared ``(*args, **kwargs)``), and ``create_from_pool_async("base", meta)``
    posts ``{"args": "base", "kwargs": meta}``; its async sandbox classes ask for the
    ``base_async`` and ``filesystem_async`` types."""
    http = httpx.Client(
        base_url=sandbox_server.url,
        headers={"Authorization": f"Bearer {sandbox_server.token}"},
        timeout=60,
    )
    key = f"args-{uuid.uuid4().hex[:8]}"
    with http:
        created = http.post(
            "/create_from_pool_async",
            json={"args": "filesystem_async", "kwargs": {"session_ctx_id": key}},
        )
        sandbox_id = created.json()["data"]
        info = http.post("/get_info_async", json={"args": sandbox_id}).json()["data"]
        assert info["sandbox_type"] == "filesystem" and "filesystem" in info["version"]
        assert http.post("/get_session_mapping_async", json={"args": key}).json() == {
            "data": [sandbox_id]
        }
        assert http.post("/get_status_async", json={"args": sandbox_id}).json() == {
            "data": "running"
        }
        keyword = http.post("/create_from_pool_async", json={"sandbox_type": "base_async"})
        other = keyword.json()["data"]
        assert (
            http.post("/get_info_async", json={"args": other}).json()["data"]["sandbox_type"]
            == "base"
        )
        for doubled in (
            {"args": sandbox_id, "identity": sandbox_id},
            {"args": sandbox_id, "kwargs": "extra"},
        ):
            reply = http.post("/get_info_async", json=doubled)
            assert reply.status_code == 422 and isinstance(reply.json()["detail"], str)
        # The sync routes take keyword bodies only.
        assert http.post("/get_info", json={"args": sandbox_id}).status_code == 422
        assert http.post("/release_async", json={"args": sandbox_id}).json() == {"data": True}
        assert http.post("/release_async", json={"identity": other}).json() == {"data": True}


@pytest.mark.parametrize("suffix", ["", "_async"])
def test_every_operation_needs_the_token_and_cleanup_is_refused(
    sandbox_server: RunningServer, suffix: str
) -> None:
    for method in (*OPERATIONS, "cleanup"):
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": sandbox_server.token},
        ):
            reply = httpx.post(f"{sandbox_server.url}/{method}{suffix}", json={}, headers=headers)
            assert reply.status_code == 401, (method, headers)
    authorized = {"Authorization": f"Bearer {sandbox_server.token}"}
    refused = httpx.post(f"{sandbox_server.url}/cleanup{suffix}", json={}, headers=authorized)
    assert refused.status_code == 403
    assert "release your own" in refused.json()["detail"]


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        b'"identity"',
        b"\xff\xfe",
        b'{"identity": "\\ud800"}',
        b'{"identity": ""}',
        b'{"identity": "x", "surprise": 1}',
    ],
)
def test_malformed_bodies_are_refused_in_both_forms(
    sandbox_server: RunningServer, body: bytes
) -> None:
    headers = {
        "Authorization": f"Bearer {sandbox_server.token}",
        "Content-Type": "application/json",
    }
    for path in ("/get_status", "/get_status_async"):
        reply = httpx.post(f"{sandbox_server.url}{path}", content=body, headers=headers)
        assert reply.status_code in (404, 422), (path, reply.text)
        assert isinstance(reply.json()["detail"], str)


@pytest.mark.parametrize(
    ("meta", "reason"),
    [
        (b'{"x": ' + b"[" * 900 + b"]" * 900 + b"}", "nests deeper than 100 levels"),
        (b'{"x": "\\ud800"}', "must be JSON"),
        (b'{"x": NaN}', "must be JSON"),
        (b'{"x": "' + b"a" * 70_000 + b'"}', "larger than 65536 bytes"),
    ],
)
def test_create_refuses_a_meta_that_get_info_could_not_send_back(
    sandbox_server: RunningServer, meta: bytes, reason: str
) -> None:
    headers = {
        "Authorization": f"Bearer {sandbox_server.token}",
        "Content-Type": "application/json",
    }
    before = httpx.get(f"{sandbox_server.url}/health").json()["sandboxes"]
    for path in ("/create_from_pool", "/create_from_pool_async", "/create"):
        body = b'{"sandbox_type": "base", "meta": ' + meta + b"}"
        reply = httpx.post(f"{sandbox_server.url}{path}", content=body, headers=headers)
        assert reply.status_code == 400, (path, reply.text)
        assert reason in reply.json()["detail"]
    assert httpx.get(f"{sandbox_server.url}/health").json()["sandboxes"] == before


def test_a_meta_as_deep_as_accepted_comes_back_from_get_info(protocol: ManagerProtocol) -> None:
    deep: Any = []
    for _ in range(98):
        deep = [deep]
    meta = {"session_ctx_id": f"s-{uuid.uuid4().hex}", "x": deep}
    sandbox_id = protocol.create_from_pool(meta=meta)
    try:
        assert protocol.post("get_info", identity=sandbox_id)["meta"] == meta
    finally:
        protocol.post("release", identity=sandbox_id)
