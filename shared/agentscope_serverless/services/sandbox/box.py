"""A handle on one connected sandbox: run Python and shell, handle files, call any tool.

Every method has a synchronous form and an ``*_async`` twin; the ``filesystem`` tools
(``read_file``, ``edit_file``, ``search_files``...) have AgentScope's signatures. Results
have the MCP ``CallToolResult`` shape as a dict, the way AgentScope's sandboxes return them::

    {"meta": None, "content": [{"type": "text", "text": "2\\n", "description": "stdout"}],
     "structuredContent": None, "isError": False}

A tool that fails (an exception in the cell, a non-zero exit status) is a result with
``isError`` set; a sandbox that cannot be reached or does not exist raises a
:class:`~agentscope_serverless.errors.SandboxError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentscope_serverless.services.sandbox.client import SandboxClient


def edit_arguments(path: str, edits: Sequence[dict[str, str]], dry_run: bool) -> dict[str, Any]:
    """The arguments of ``edit_file``, with AgentScope's names."""
    return {"path": path, "edits": list(edits), "dryRun": dry_run}


def search_arguments(
    path: str, pattern: str, exclude_patterns: Sequence[str] | None
) -> dict[str, Any]:
    """The arguments of ``search_files``, with AgentScope's names."""
    return {"path": path, "pattern": pattern, "excludePatterns": list(exclude_patterns or [])}


class FilesystemTools:
    """The ``filesystem`` tools as synchronous methods, with AgentScope's signatures."""

    def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        raise NotImplementedError

    def read_file(self, path: str) -> Any:
        """Read the complete contents of a text file."""
        return self.call_tool("read_file", {"path": path})

    def read_multiple_files(self, paths: list[str]) -> Any:
        """Read several files at once."""
        return self.call_tool("read_multiple_files", {"paths": list(paths)})

    def write_file(self, path: str, content: str) -> Any:
        """Create a file or overwrite it with ``content``."""
        return self.call_tool("write_file", {"path": path, "content": content})

    def edit_file(self, path: str, edits: list[dict[str, str]], dry_run: bool = False) -> Any:
        """Replace texts (``[{"oldText", "newText"}]``); returns a diff."""
        return self.call_tool("edit_file", edit_arguments(path, edits, dry_run))

    def create_directory(self, path: str) -> Any:
        """Create a directory and its parents."""
        return self.call_tool("create_directory", {"path": path})

    def list_directory(self, path: str = ".") -> Any:
        """List a directory: ``[DIR] name`` and ``[FILE] name`` lines."""
        return self.call_tool("list_directory", {"path": path})

    def directory_tree(self, path: str) -> Any:
        """A recursive tree of a directory, as JSON."""
        return self.call_tool("directory_tree", {"path": path})

    def move_file(self, source: str, destination: str) -> Any:
        """Move or rename a file or directory."""
        return self.call_tool("move_file", {"source": source, "destination": destination})

    def search_files(
        self, path: str, pattern: str, exclude_patterns: list[str] | None = None
    ) -> Any:
        """Paths under ``path`` whose name contains ``pattern``."""
        return self.call_tool("search_files", search_arguments(path, pattern, exclude_patterns))

    def get_file_info(self, path: str) -> Any:
        """Size, times, type and permissions of a file or directory."""
        return self.call_tool("get_file_info", {"path": path})

    def list_allowed_directories(self) -> Any:
        """The directories the filesystem tools may access."""
        return self.call_tool("list_allowed_directories", {})


class AsyncFilesystemTools:
    """The ``filesystem`` tools as ``*_async`` coroutine methods."""

    async def call_tool_async(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        raise NotImplementedError

    async def read_file_async(self, path: str) -> Any:
        """Read the complete contents of a text file."""
        return await self.call_tool_async("read_file", {"path": path})

    async def read_multiple_files_async(self, paths: list[str]) -> Any:
        """Read several files at once."""
        return await self.call_tool_async("read_multiple_files", {"paths": list(paths)})

    async def write_file_async(self, path: str, content: str) -> Any:
        """Create a file or overwrite it with ``content``."""
        return await self.call_tool_async("write_file", {"path": path, "content": content})

    async def edit_file_async(
        self, path: str, edits: list[dict[str, str]], dry_run: bool = False
    ) -> Any:
        """Replace texts (``[{"oldText", "newText"}]``); returns a diff."""
        return await self.call_tool_async("edit_file", edit_arguments(path, edits, dry_run))

    async def create_directory_async(self, path: str) -> Any:
        """Create a directory and its parents."""
        return await self.call_tool_async("create_directory", {"path": path})

    async def list_directory_async(self, path: str = ".") -> Any:
        """List a directory: ``[DIR] name`` and ``[FILE] name`` lines."""
        return await self.call_tool_async("list_directory", {"path": path})

    async def directory_tree_async(self, path: str) -> Any:
        """A recursive tree of a directory, as JSON."""
        return await self.call_tool_async("directory_tree", {"path": path})

    async def move_file_async(self, source: str, destination: str) -> Any:
        """Move or rename a file or directory."""
        arguments = {"source": source, "destination": destination}
        return await self.call_tool_async("move_file", arguments)

    async def search_files_async(
        self, path: str, pattern: str, exclude_patterns: list[str] | None = None
    ) -> Any:
        """Paths under ``path`` whose name contains ``pattern``."""
        arguments = search_arguments(path, pattern, exclude_patterns)
        return await self.call_tool_async("search_files", arguments)

    async def get_file_info_async(self, path: str) -> Any:
        """Size, times, type and permissions of a file or directory."""
        return await self.call_tool_async("get_file_info", {"path": path})

    async def list_allowed_directories_async(self) -> Any:
        """The directories the filesystem tools may access."""
        return await self.call_tool_async("list_allowed_directories", {})


class Sandbox(FilesystemTools, AsyncFilesystemTools):
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

    async def list_tools_async(self, tool_type: str | None = None) -> dict[str, Any]:
        """The tools this sandbox offers (all, or those of ``tool_type``), as
        ``{tool_type: {name: {"name", "json_schema"}}}``."""
        return await self._client.list_tools(self.sandbox_id, tool_type)

    def list_tools(self, tool_type: str | None = None) -> dict[str, Any]:
        """The tools this sandbox offers (all, or those of ``tool_type``), as
        ``{tool_type: {name: {"name", "json_schema"}}}``."""
        return self._client.run_sync(self.list_tools_async(tool_type))

    async def add_mcp_servers_async(
        self, server_configs: dict[str, Any], overwrite: bool = False
    ) -> Any:
        """Ask the server to add MCP servers (our server refuses, saying what it offers)."""
        return await self._client.add_mcp_servers(self.sandbox_id, server_configs, overwrite)

    def add_mcp_servers(self, server_configs: dict[str, Any], overwrite: bool = False) -> Any:
        """Ask the server to add MCP servers (our server refuses, saying what it offers)."""
        return self._client.run_sync(self.add_mcp_servers_async(server_configs, overwrite))

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

    async def get_info_async(self) -> dict[str, Any]:
        """What the server tells about this sandbox."""
        return await self._client.get_info(self.sandbox_id)

    def get_info(self) -> dict[str, Any]:
        """What the server tells about this sandbox."""
        return self._client.run_sync(self.get_info_async())


__all__ = ["AsyncFilesystemTools", "FilesystemTools", "Sandbox"]
