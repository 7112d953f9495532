"""AgentScope's sandbox client classes (``agentscope_serverless.sandbox``) on our server.

The code is AgentScope's README style with only the import prefix changed.
"""

from __future__ import annotations

import inspect
import json
import re
import uuid
from pathlib import Path

import pytest

from agentscope_serverless.errors import SandboxNotFoundError, SandboxRequestError
from agentscope_serverless.sandbox import (
    BaseSandbox,
    BaseSandboxAsync,
    FilesystemSandbox,
    FilesystemSandboxAsync,
    SandboxManager,
    SandboxRegistry,
    SandboxType,
)
from tests.support.sandbox_server import RunningServer


def text(result: dict[str, object]) -> str:
    content = result["content"]
    assert isinstance(content, list)
    return str(content[0]["text"])


def test_base_sandbox_runs_python_with_state_and_releases_on_exit(
    sandbox_server: RunningServer,
) -> None:
    with BaseSandbox(base_url=sandbox_server.url, bearer_token=sandbox_server.token) as box:
        assert box.sandbox_id is not None and not box.embed_mode
        box.run_ipython_cell("x = 21")
        assert text(box.run_ipython_cell("x * 2")) == "42\n"
        assert text(box.run_shell_command("echo hello")) == "hello\n"
        assert set(box.list_tools()) == {"generic", "filesystem"}
        assert box.get_info()["sandbox_type"] == "base"
        with pytest.raises(SandboxRequestError, match="does not add MCP servers"):
            box.add_mcp_servers({"mcpServers": {"fetch": {"command": "uvx"}}})
        sandbox_id = box.sandbox_id
    with (
        SandboxManager(base_url=sandbox_server.url, bearer_token=sandbox_server.token) as manager,
        pytest.raises(SandboxNotFoundError),
    ):
        manager.get_info(sandbox_id)


def test_a_sandbox_object_attaches_to_an_existing_sandbox_by_id(
    sandbox_server: RunningServer,
) -> None:
    manager = SandboxManager(base_url=sandbox_server.url, bearer_token=sandbox_server.token)
    sandbox_id = manager.create_from_pool(SandboxType.BASE)
    try:
        BaseSandbox(sandbox_id, base_url=sandbox_server.url, bearer_token=sandbox_server.token)
        attached = BaseSandbox(
            sandbox_id=sandbox_id, base_url=sandbox_server.url, bearer_token=sandbox_server.token
        )
        attached.run_ipython_cell("kept = 'yes'")
        again = BaseSandbox(
            sandbox_id=sandbox_id, base_url=sandbox_server.url, bearer_token=sandbox_server.token
        )
        assert text(again.run_ipython_cell("kept")) == "'yes'\n"
        with pytest.raises(ValueError):
            again.sandbox_id = ""
    finally:
        assert manager.release(sandbox_id) is True
        manager.close()


def test_filesystem_sandbox_offers_every_tool_with_agentscopes_arguments(
    sandbox_server: RunningServer,
) -> None:
    with FilesystemSandbox(base_url=sandbox_server.url, bearer_token=sandbox_server.token) as box:
        assert box.get_info()["sandbox_type"] == "filesystem"
        assert text(box.create_directory("docs")) == "Successfully created directory docs"
        box.write_file("docs/plan.md", "# Plan\n- step one\n")
        box.write_file("docs/notes.txt", "notes\n")
        assert text(box.read_file("docs/plan.md")) == "# Plan\n- step one\n"
        assert "docs/notes.txt:\nnotes\n" in text(box.read_multiple_files(["docs/notes.txt"]))
        diff = text(box.edit_file("docs/plan.md", [{"oldText": "one", "newText": "two"}], True))
        assert "+- step two" in diff
        assert "one" in text(box.read_file("docs/plan.md"))
        box.edit_file("docs/plan.md", [{"oldText": "one", "newText": "two"}])
        assert "two" in text(box.read_file("docs/plan.md"))
        assert text(box.list_directory("docs")) == "[FILE] notes.txt\n[FILE] plan.md"
        tree = json.loads(text(box.directory_tree(".")))
        assert tree[0]["name"] == "docs" and len(tree[0]["children"]) == 2
        box.move_file("docs/notes.txt", "notes.txt")
        assert text(box.search_files(".", "NOTES")) == "/workspace/notes.txt"
        assert text(box.search_files(".", "a", ["docs"])) == "No matches found"
        assert "isFile: true" in text(box.get_file_info("notes.txt"))
        assert text(box.list_allowed_directories()) == "Allowed directories:\n/workspace"
        # As in AgentScope, a filesystem sandbox is also a base sandbox.
        assert text(box.run_ipython_cell("open('notes.txt').read()")) == "'notes\\n'\n"


async def test_the_async_classes_create_use_and_release_their_sandbox(
    sandbox_server: RunningServer,
) -> None:
    async with BaseSandboxAsync(
        base_url=sandbox_server.url, bearer_token=sandbox_server.token
    ) as box:
        await box.run_ipython_cell("y = 5")
        assert text(await box.run_ipython_cell("y + 1")) == "6\n"
        assert text(await box.run_shell_command("pwd")) == "/workspace\n"
        assert (await box.get_info_async())["sandbox_type"] == "base"
        assert list(await box.list_tools_async("generic")) == ["generic"]
        base_id = box.sandbox_id

    async with FilesystemSandboxAsync(
        base_url=sandbox_server.url, bearer_token=sandbox_server.token
    ) as files:
        await files.write_file("a.txt", "alpha")
        assert text(await files.read_file("a.txt")) == "alpha"
        await files.edit_file("a.txt", [{"oldText": "alpha", "newText": "beta"}])
        assert "a.txt:\nbeta\n" in text(await files.read_multiple_files(["a.txt"]))
        await files.create_directory("d")
        await files.move_file("a.txt", "d/b.txt")
        assert text(await files.list_directory("d")) == "[FILE] b.txt"
        assert json.loads(text(await files.directory_tree("d"))) == [
            {"name": "b.txt", "type": "file"}
        ]
        assert text(await files.search_files(".", "b.TXT", [])) == "/workspace/d/b.txt"
        assert "size: 4" in text(await files.get_file_info("d/b.txt"))
        assert "/workspace" in text(await files.list_allowed_directories())
        files_id = files.sandbox_id

    async with SandboxManager(
        base_url=sandbox_server.url, bearer_token=sandbox_server.token
    ) as manager:
        for sandbox_id in (base_id, files_id):
            with pytest.raises(SandboxNotFoundError):
                await manager.get_info_async(sandbox_id)


async def test_the_manager_offers_every_operation_sync_and_async(
    sandbox_server: RunningServer,
) -> None:
    key = f"s-{uuid.uuid4().hex[:8]}_u"
    manager = SandboxManager(base_url=sandbox_server.url, bearer_token=sandbox_server.token)
    first = manager.create_from_pool("base", {"session_ctx_id": key})
    second = await manager.create_async(
        "filesystem", environment={"MODE": "test"}, meta={"session_ctx_id": key}
    )
    try:
        assert manager.get_session_mapping(key) == [first, second]
        assert await manager.get_session_mapping_async(key) == [first, second]
        assert key in manager.list_session_keys()
        assert key in await manager.list_session_keys_async()
        assert manager.check_health(first) and await manager.check_health_async(second)
        shell = await manager.call_tool_async(
            second, "run_shell_command", {"command": "echo $MODE"}
        )
        assert text(shell) == "test\n"
        assert manager.stop(first) is True
        assert manager.get_status(first) == "exited"
        assert await manager.start_async(first) is True
        assert await manager.get_status_async(first) == "running"
        assert await manager.stop_async(first) is True
        assert manager.start(first) is True
        tools = manager.list_tools(second, tool_type="filesystem")
        assert "search_files" in tools["filesystem"]
        assert "edit_file" in (await manager.list_tools_async(second))["filesystem"]
        with pytest.raises(SandboxRequestError, match="does not add MCP servers"):
            await manager.add_mcp_servers_async(second, {"mcpServers": {"x": {"url": "http://x"}}})
        with pytest.raises(SandboxRequestError, match="mount_dir"):
            manager.create("base", mount_dir="/etc")
        with pytest.raises(SandboxRequestError, match="release your sandboxes"):
            manager.cleanup()
        with pytest.raises(SandboxRequestError, match="release your sandboxes"):
            await manager.cleanup_async()
        assert manager.get_info(first)["meta"] == {"session_ctx_id": key}
    finally:
        assert manager.release(first) is True
        assert await manager.release_async(second) is True
        assert await manager.release_async(second) is False
        await manager.aclose()


def test_without_a_base_url_a_private_local_server_is_started() -> None:
    with BaseSandbox() as box:
        assert box.embed_mode
        assert text(box.run_ipython_cell("print(6 * 7)")) == "42\n"
        manager = box.manager_api
        assert manager.list_session_keys() == []
    assert manager.embed_mode


def test_names_and_signatures_follow_agentscope() -> None:
    assert SandboxRegistry.get_classes_by_type("base") is BaseSandbox
    assert SandboxRegistry.get_classes_by_type(SandboxType.FILESYSTEM) is FilesystemSandbox
    assert SandboxRegistry.get_classes_by_type("filesystem_async") is FilesystemSandboxAsync
    assert SandboxRegistry.get_classes_by_type(SandboxType.BASE_ASYNC) is BaseSandboxAsync
    for cls in (BaseSandbox, BaseSandboxAsync, FilesystemSandbox, FilesystemSandboxAsync):
        assert list(inspect.signature(cls).parameters) == [
            "sandbox_id",
            "timeout",
            "base_url",
            "bearer_token",
            "sandbox_type",
        ]
    assert list(inspect.signature(SandboxManager).parameters)[:4] == [
        "config",
        "base_url",
        "bearer_token",
        "default_type",
    ]
    edit = inspect.signature(FilesystemSandbox.edit_file).parameters
    assert list(edit) == ["self", "path", "edits", "dry_run"]
    search = inspect.signature(FilesystemSandboxAsync.search_files).parameters
    assert list(search) == ["self", "path", "pattern", "exclude_patterns"]
    assert inspect.iscoroutinefunction(FilesystemSandboxAsync.read_file)
    assert inspect.iscoroutinefunction(BaseSandboxAsync.run_ipython_cell)
    for operation in (
        "create_from_pool",
        "create",
        "release",
        "start",
        "stop",
        "get_status",
        "get_info",
        "check_health",
        "list_tools",
        "call_tool",
        "add_mcp_servers",
        "get_session_mapping",
        "list_session_keys",
        "cleanup",
    ):
        assert callable(getattr(SandboxManager, operation))
        assert inspect.iscoroutinefunction(getattr(SandboxManager, f"{operation}_async"))


def test_the_readme_example_runs_on_the_server(
    sandbox_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOX_SERVER_TOKEN", sandbox_server.token)
    monkeypatch.delenv("SANDBOX_BASE_URL", raising=False)
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("### AgentScope's sandbox protocol and client classes") :]
    example = re.search(r"```python\n(.*?)```", section, re.S)
    assert example is not None and "FilesystemSandbox" in example.group(1)
    code = example.group(1).replace("http://sandbox-host:8000", sandbox_server.url)
    namespace: dict[str, object] = {"token": sandbox_server.token}
    exec(compile(code, "README.md", "exec"), namespace)
    box = namespace["box"]
    assert isinstance(box, FilesystemSandbox)
    with (
        SandboxManager(base_url=sandbox_server.url, bearer_token=sandbox_server.token) as manager,
        pytest.raises(SandboxNotFoundError),
    ):
        manager.get_info(str(box.sandbox_id))
