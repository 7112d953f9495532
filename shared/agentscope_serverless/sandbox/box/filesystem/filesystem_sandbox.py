"""``FilesystemSandbox`` and ``FilesystemSandboxAsync``: the filesystem tools by name.

The methods and arguments are AgentScope's (``edit_file(path, edits, dry_run)`` sends
``dryRun``; ``search_files(path, pattern, exclude_patterns)`` sends ``excludePatterns``).
Paths are in the sandbox's workspace (``/workspace``), the one allowed directory.
"""

from __future__ import annotations

from typing import Any

from agentscope_serverless.sandbox.box.base.base_sandbox import (
    IMAGE_PREFIX,
    BaseSandbox,
    BaseSandboxAsync,
)
from agentscope_serverless.sandbox.enums import SandboxType
from agentscope_serverless.sandbox.registry import SandboxRegistry
from agentscope_serverless.services.sandbox.box import (
    FilesystemTools,
    edit_arguments,
    search_arguments,
)


@SandboxRegistry.register(
    f"{IMAGE_PREFIX}-filesystem", SandboxType.FILESYSTEM, description="Filesystem sandbox"
)
class FilesystemSandbox(BaseSandbox, FilesystemTools):
    """A ``filesystem`` sandbox: ``read_file``, ``edit_file``, ``search_files``... (and,
    as in AgentScope, the base sandbox's tools)."""

    def __init__(
        self,
        sandbox_id: str | None = None,
        timeout: int = 3000,
        base_url: str | None = None,
        bearer_token: str | None = None,
        sandbox_type: SandboxType | str = SandboxType.FILESYSTEM,
    ) -> None:
        super().__init__(sandbox_id, timeout, base_url, bearer_token, sandbox_type)


@SandboxRegistry.register(
    f"{IMAGE_PREFIX}-filesystem",
    SandboxType.FILESYSTEM_ASYNC,
    description="Filesystem sandbox (Async)",
)
class FilesystemSandboxAsync(BaseSandboxAsync):
    """A ``filesystem`` sandbox with coroutine methods."""

    def __init__(
        self,
        sandbox_id: str | None = None,
        timeout: int = 3000,
        base_url: str | None = None,
        bearer_token: str | None = None,
        sandbox_type: SandboxType | str = SandboxType.FILESYSTEM_ASYNC,
    ) -> None:
        super().__init__(sandbox_id, timeout, base_url, bearer_token, sandbox_type)

    async def read_file(self, path: str) -> Any:
        """Read the complete contents of a text file."""
        return await self.call_tool_async("read_file", {"path": path})

    async def read_multiple_files(self, paths: list[str]) -> Any:
        """Read several files at once."""
        return await self.call_tool_async("read_multiple_files", {"paths": list(paths)})

    async def write_file(self, path: str, content: str) -> Any:
        """Create a file or overwrite it with ``content``."""
        return await self.call_tool_async("write_file", {"path": path, "content": content})

    async def edit_file(self, path: str, edits: list[dict[str, str]], dry_run: bool = False) -> Any:
        """Replace texts (``[{"oldText", "newText"}]``); returns a diff."""
        return await self.call_tool_async("edit_file", edit_arguments(path, edits, dry_run))

    async def create_directory(self, path: str) -> Any:
        """Create a directory and its parents."""
        return await self.call_tool_async("create_directory", {"path": path})

    async def list_directory(self, path: str = ".") -> Any:
        """List a directory: ``[DIR] name`` and ``[FILE] name`` lines."""
        return await self.call_tool_async("list_directory", {"path": path})

    async def directory_tree(self, path: str) -> Any:
        """A recursive tree of a directory, as JSON."""
        return await self.call_tool_async("directory_tree", {"path": path})

    async def move_file(self, source: str, destination: str) -> Any:
        """Move or rename a file or directory."""
        arguments = {"source": source, "destination": destination}
        return await self.call_tool_async("move_file", arguments)

    async def search_files(
        self, path: str, pattern: str, exclude_patterns: list[str] | None = None
    ) -> Any:
        """Paths under ``path`` whose name contains ``pattern``."""
        arguments = search_arguments(path, pattern, exclude_patterns)
        return await self.call_tool_async("search_files", arguments)

    async def get_file_info(self, path: str) -> Any:
        """Size, times, type and permissions of a file or directory."""
        return await self.call_tool_async("get_file_info", {"path": path})

    async def list_allowed_directories(self) -> Any:
        """The directories the filesystem tools may access."""
        return await self.call_tool_async("list_allowed_directories", {})


__all__ = ["FilesystemSandbox", "FilesystemSandboxAsync"]
