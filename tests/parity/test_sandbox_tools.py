"""The services guide's sandbox example runs ported: ``connect(tools=...)`` with tools
imported from AgentScope's tool modules (``agentscope_runtime.sandbox.tools.filesystem``
becomes ``agentscope_serverless.sandbox.tools.filesystem``), called synchronously from code
that runs in an event loop, as the guide's notebook cells do; the tools of sandbox types the
server does not run are refused at import, saying so. The tools are called, bound and read
as AgentScope's ``SandboxTool`` objects are."""

from __future__ import annotations

import importlib
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentscope_serverless.errors import SandboxRequestError
from agentscope_serverless.sandbox import BaseSandbox, FilesystemSandbox
from agentscope_serverless.sandbox.tools.base import run_ipython_cell, run_shell_command
from agentscope_serverless.sandbox.tools.filesystem import read_file, write_file
from agentscope_serverless.services.sandbox import SandboxService
from tests.sandbox.conftest import RunningServer, require_sandbox_tools


@pytest.fixture
def base_box(sandbox_server: RunningServer) -> Iterator[BaseSandbox]:
    with BaseSandbox(base_url=sandbox_server.url, bearer_token=sandbox_server.token) as box:
        yield box


def parts(result: dict[str, object]) -> dict[str, str]:
    """The text parts of a tool result by their description."""
    content = result["content"]
    assert isinstance(content, list)
    return {part["description"]: part["text"] for part in content}


def test_a_tool_called_with_a_sandbox_runs_on_it(sandbox_server: RunningServer) -> None:
    with FilesystemSandbox(base_url=sandbox_server.url, bearer_token=sandbox_server.token) as box:
        run_ipython_cell(code="x = 6", sandbox=box)  # a filesystem sandbox is a base one
        result = run_ipython_cell(code="print(x * 7)", sandbox=box)
        assert result["isError"] is False and parts(result)["stdout"] == "42\n"
        write_file(path="notes.md", content="# Notes", sandbox=box)
        assert parts(read_file(path="notes.md", sandbox=box))["stdout"] == "# Notes"


async def test_a_bound_tool_keeps_its_sandbox_and_the_original_stays_unbound(
    base_box: BaseSandbox,
) -> None:
    # Called synchronously from code that runs in an event loop, as notebook cells do.
    bound = run_ipython_cell.bind(base_box)
    bound(code="x = 6")
    assert parts(bound(code="print(x * 7)"))["stdout"] == "42\n"
    assert bound.sandbox is base_box and run_ipython_cell.sandbox is None
    assert bound == run_ipython_cell and hash(bound) == hash(run_ipython_cell)
    assert bound.name == "run_ipython_cell" and bound.sandbox_type == "base"


def test_an_unbound_tool_runs_in_a_temporary_sandbox_released_after_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require_sandbox_tools()
    # Without a sandbox, the tool makes one as BaseSandbox() does: on a private local server,
    # whose directory (workspaces included) is made under the temporary directory.
    with tempfile.TemporaryDirectory() as directory:
        Path(directory).chmod(0o711)
        monkeypatch.setattr(tempfile, "tempdir", directory)
        assert parts(run_shell_command(command="echo hello"))["stdout"] == "hello\n"
        assert list(Path(directory).iterdir()) == []
        with pytest.raises(SandboxRequestError, match="path: Field required"):
            read_file()
        assert list(Path(directory).iterdir()) == []


def test_schema_is_the_openai_function_tool() -> None:
    assert run_ipython_cell.schema == {
        "type": "function",
        "function": {
            "name": "run_ipython_cell",
            "description": run_ipython_cell.description,
            "parameters": run_ipython_cell.parameters,
        },
    }
    assert run_ipython_cell.schema["function"]["parameters"]["required"] == ["code"]


def test_a_sandbox_of_another_type_is_refused(base_box: BaseSandbox) -> None:
    for attempt in (
        lambda: read_file.bind(base_box),
        lambda: read_file(path=".", sandbox=base_box),
    ):
        with pytest.raises(SandboxRequestError, match="'filesystem' sandbox, not in a 'base' one"):
            attempt()


def test_is_error_says_the_tool_failed_not_that_it_wrote_to_stderr(base_box: BaseSandbox) -> None:
    warned = run_shell_command(command="echo warning >&2", sandbox=base_box)
    assert warned["isError"] is False and parts(warned)["stderr"] == "warning\n"
    assert run_shell_command(command="exit 3", sandbox=base_box)["isError"] is True


async def test_connect_infers_the_sandboxes_of_the_tool_modules_tools(
    sandbox_server: RunningServer,
) -> None:
    from agentscope_serverless.sandbox.tools.base import run_ipython_cell
    from agentscope_serverless.sandbox.tools.filesystem import read_file, write_file

    session_id, user_id = f"session-{uuid.uuid4().hex[:12]}", "user1"
    sandbox_service = SandboxService(base_url=sandbox_server.url, bearer_token=sandbox_server.token)
    await sandbox_service.start()
    try:
        tools = [read_file, write_file, run_ipython_cell]
        sandboxes = sandbox_service.connect(session_id=session_id, user_id=user_id, tools=tools)
        assert [box.sandbox_type for box in sandboxes] == ["filesystem", "base"]
        write_file.execute(sandboxes, {"path": "notes.md", "content": "# Notes"})
        assert read_file.execute(sandboxes, {"path": "notes.md"}) == "# Notes\n"
        assert run_ipython_cell.execute(sandboxes, {"code": "print(6 * 7)"}) == "42\n"
        assert sandbox_service.release(session_id, user_id) is True
    finally:
        await sandbox_service.stop()


@pytest.mark.parametrize("kind", ["browser", "gui", "mobile"])
def test_tools_of_sandboxes_not_offered_are_refused_at_import(kind: str) -> None:
    with pytest.raises(ImportError, match=f"{kind} sandbox tools are not offered"):
        importlib.import_module(f"agentscope_serverless.sandbox.tools.{kind}")


# AgentScope Runtime 1.0.5's sandbox classes of the types the server does not run, by the
# module (package) AgentScope defines them in.
SANDBOXES_NOT_OFFERED = {
    "BrowserSandbox": "browser.browser_sandbox",
    "BrowserSandboxAsync": "browser.browser_sandbox",
    "GuiSandbox": "gui.gui_sandbox",
    "GuiSandboxAsync": "gui.gui_sandbox",
    "MobileSandbox": "mobile.mobile_sandbox",
    "MobileSandboxAsync": "mobile.mobile_sandbox",
    "TrainingSandbox": "training_box.training_box",
    "CloudSandbox": "cloud.cloud_sandbox",
    "AgentbaySandbox": "agentbay.agentbay_sandbox",
}


@pytest.mark.parametrize("name", sorted(SANDBOXES_NOT_OFFERED))
def test_sandboxes_not_offered_are_refused_at_import_naming_what_to_use(name: str) -> None:
    module = f"agentscope_serverless.sandbox.box.{SANDBOXES_NOT_OFFERED[name]}"
    for statement in (
        f"from agentscope_serverless.sandbox import {name}",
        f"from {module} import {name}",
        f"import {module}",
    ):
        with pytest.raises(ImportError) as raised:
            exec(statement, {})
        message = str(raised.value)
        assert "is not offered" in message, (statement, message)
        assert "agentscope_serverless.sandbox.BaseSandbox or FilesystemSandbox" in message
    # Any other missing name is an AttributeError, as for any module.
    sandbox = importlib.import_module("agentscope_serverless.sandbox")
    with pytest.raises(AttributeError):
        sandbox.NoSuchSandbox  # noqa: B018
