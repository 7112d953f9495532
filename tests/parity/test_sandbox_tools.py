"""The services guide's sandbox example runs ported: ``connect(tools=...)`` with tools
imported from AgentScope's tool modules (``agentscope_runtime.sandbox.tools.filesystem``
becomes ``agentscope_serverless.sandbox.tools.filesystem``), called synchronously from code
that runs in an event loop, as the guide's notebook cells do; the tools of sandbox types the
server does not run are refused at import, saying so."""

from __future__ import annotations

import importlib
import uuid

import pytest

from agentscope_serverless.services.sandbox import SandboxService
from tests.sandbox.conftest import RunningServer


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
