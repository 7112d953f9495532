"""``BaseSandbox`` and ``BaseSandboxAsync``: Python and shell in a sandbox.

>>> def demo() -> None:
...     with BaseSandbox(base_url="http://sandbox-host:8000", bearer_token="t") as box:
...         box.run_ipython_cell("x = 21")
...         box.run_ipython_cell("x * 2")["content"][0]["text"]  # '42\\n'
"""

from __future__ import annotations

from typing import Any

from agentscope_serverless.sandbox.box.sandbox import Sandbox, SandboxAsync
from agentscope_serverless.sandbox.enums import SandboxType
from agentscope_serverless.sandbox.registry import SandboxRegistry

IMAGE_PREFIX = "agentscope-serverless-sandbox"


@SandboxRegistry.register(f"{IMAGE_PREFIX}-base", SandboxType.BASE, description="Base Sandbox")
class BaseSandbox(Sandbox):
    """A ``base`` sandbox: ``run_ipython_cell`` (state kept) and ``run_shell_command``."""

    def __init__(
        self,
        sandbox_id: str | None = None,
        timeout: int = 3000,
        base_url: str | None = None,
        bearer_token: str | None = None,
        sandbox_type: SandboxType | str = SandboxType.BASE,
    ) -> None:
        super().__init__(sandbox_id, timeout, base_url, bearer_token, sandbox_type)

    def run_ipython_cell(self, code: str) -> Any:
        """Run Python code; variables persist between calls."""
        return self.call_tool("run_ipython_cell", {"code": code})

    def run_shell_command(self, command: str) -> Any:
        """Run a ``/bin/sh`` command in the workspace."""
        return self.call_tool("run_shell_command", {"command": command})


@SandboxRegistry.register(
    f"{IMAGE_PREFIX}-base", SandboxType.BASE_ASYNC, description="Base Sandbox (Async)"
)
class BaseSandboxAsync(SandboxAsync):
    """A ``base`` sandbox with coroutine methods."""

    def __init__(
        self,
        sandbox_id: str | None = None,
        timeout: int = 3000,
        base_url: str | None = None,
        bearer_token: str | None = None,
        sandbox_type: SandboxType | str = SandboxType.BASE_ASYNC,
    ) -> None:
        super().__init__(sandbox_id, timeout, base_url, bearer_token, sandbox_type)

    async def run_ipython_cell(self, code: str) -> Any:
        """Run Python code; variables persist between calls."""
        return await self.call_tool_async("run_ipython_cell", {"code": code})

    async def run_shell_command(self, command: str) -> Any:
        """Run a ``/bin/sh`` command in the workspace."""
        return await self.call_tool_async("run_shell_command", {"command": command})


__all__ = ["BaseSandbox", "BaseSandboxAsync"]
