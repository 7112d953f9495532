"""A handle on one connected sandbox: run Python and shell, handle files, call any tool.

Every method has a synchronous form and an ``*_async`` twin. Results have the MCP
``CallToolResult`` shape as a dict, the way AgentScope's sandboxes return them::

    {"meta": None, "content": [{"type": "text", "text": "2\\n", "description": "stdout"}],
     "structuredContent": None, "isError": False}

A tool that fails (an exception in the cell, a non-zero exit status) is a result with
``isError`` set; a sandbox that cannot be reached or does not exist raises a
:class:`~agentscope_serverless.errors.SandboxError`.
"""

from __future__ import annotations

from typing import Any

from agentscope_serverless.services.sandbox.client import SandboxClient


class Sandbox:
    """One sandbox on a sandbox server, as returned by ``SandboxService.connect``.

    >>> def demo(box: Sandbox) -> None:
    ...     box.run_ipython_cell("x = 21")
    ...     box.run_ipython_cell("x * 2")["content"][0]["text"]
    ...     box.write_file("notes.txt", "hello")
    ...     box.run_shell_command("cat notes.txt")
    """

    def __init__(self, client: SandboxClient, sandbox_id: str, sandbox_type: str) -> None:
        self._client = client
        self.sandbox_id = sandbox_id
        self.sandbox_type = sandbox_type

    def __repr__(self) -> str:
        return f"Sandbox(sandbox_id={self.sandbox_id!r}, sandbox_type={self.sandbox_type!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sandbox):
            return NotImplemented
        return (self.sandbox_id, self._client) == (other.sandbox_id, other._client)

    def __hash__(self) -> int:
        return hash(self.sandbox_id)

    async def call_tool_async(
        self, name: str, arguments: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Run the tool ``name`` with ``arguments`` in this sandbox."""
        result = await self._client.call_tool(self.sandbox_id, name, arguments or {})
        return result.model_dump()

    def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run the tool ``name`` with ``arguments`` in this sandbox."""
        return self._client.run_sync(self.call_tool_async(name, arguments))

    async def list_tools_async(self, tool_type: str | None = None) -> Any:
        """The tools this sandbox offers (all, or those of ``tool_type``)."""
        return await self._client.list_tools(self.sandbox_id, tool_type)

    def list_tools(self, tool_type: str | None = None) -> Any:
        """The tools this sandbox offers (all, or those of ``tool_type``)."""
        return self._client.run_sync(self.list_tools_async(tool_type))

    async def run_ipython_cell_async(self, code: str) -> dict[str, Any]:
        """Run Python code; variables persist between calls."""
        return await self.call_tool_async("run_ipython_cell", {"code": code})

    def run_ipython_cell(self, code: str) -> dict[str, Any]:
        """Run Python code; variables persist between calls."""
        return self.call_tool("run_ipython_cell", {"code": code})

    async def run_shell_command_async(self, command: str) -> dict[str, Any]:
        """Run a ``/bin/sh`` command in the workspace."""
        return await self.call_tool_async("run_shell_command", {"command": command})

    def run_shell_command(self, command: str) -> dict[str, Any]:
        """Run a ``/bin/sh`` command in the workspace."""
        return self.call_tool("run_shell_command", {"command": command})

    async def read_file_async(self, path: str) -> dict[str, Any]:
        """Read a text file of the workspace (``path`` relative to it)."""
        return await self.call_tool_async("read_file", {"path": path})

    def read_file(self, path: str) -> dict[str, Any]:
        """Read a text file of the workspace (``path`` relative to it)."""
        return self.call_tool("read_file", {"path": path})

    async def write_file_async(self, path: str, content: str) -> dict[str, Any]:
        """Create or overwrite a text file of the workspace."""
        return await self.call_tool_async("write_file", {"path": path, "content": content})

    def write_file(self, path: str, content: str) -> dict[str, Any]:
        """Create or overwrite a text file of the workspace."""
        return self.call_tool("write_file", {"path": path, "content": content})

    async def list_directory_async(self, path: str = ".") -> dict[str, Any]:
        """List a directory of the workspace."""
        return await self.call_tool_async("list_directory", {"path": path})

    def list_directory(self, path: str = ".") -> dict[str, Any]:
        """List a directory of the workspace."""
        return self.call_tool("list_directory", {"path": path})

    async def get_info_async(self) -> dict[str, Any]:
        """What the server tells about this sandbox."""
        return await self._client.get_info(self.sandbox_id)

    def get_info(self) -> dict[str, Any]:
        """What the server tells about this sandbox."""
        return self._client.run_sync(self.get_info_async())


__all__ = ["Sandbox"]
