"""``Sandbox`` and ``SandboxAsync``: one sandbox as an object, AgentScope's base classes.

``with BaseSandbox(base_url=..., bearer_token=...) as box:`` creates a sandbox on entry
(unless ``sandbox_id`` names an existing one) and releases it on exit; the async classes do
the same with ``async with``. Without ``base_url`` the sandbox lives on a private local
server started for it (bubblewrap needed), which stops on exit.

The sandboxes ``SandboxService.connect`` returns are instances of the class registered for
their type, as AgentScope's service returns them: ``isinstance(box, FilesystemSandbox)``
holds for a ``filesystem`` sandbox it connected (and ``isinstance(box, BaseSandbox)`` for
both types, ``FilesystemSandbox`` being a ``BaseSandbox``).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

from agentscope_serverless.errors import SandboxError
from agentscope_serverless.sandbox.enums import SandboxType
from agentscope_serverless.sandbox.manager.sandbox_manager import SandboxManager
from agentscope_serverless.sandbox.registry import SandboxRegistry
from agentscope_serverless.services.sandbox.box import Sandbox as ConnectedSandbox


class _SandboxClass(type):
    """The sandbox classes' metaclass: a sandbox of ``SandboxService.connect`` (which has
    every method of its type's class) is an instance of the class registered for its type,
    and of that class's bases."""

    def __instancecheck__(cls, instance: object) -> bool:
        if super().__instancecheck__(instance):
            return True
        if not isinstance(instance, ConnectedSandbox):
            return False
        try:
            registered = SandboxRegistry.get_classes_by_type(instance.sandbox_type)
        except ValueError:  # a type AgentScope does not know
            return False
        return registered is not None and issubclass(registered, cls)


class SandboxBase(metaclass=_SandboxClass):
    """What the sync and async sandbox classes share: the id, the type and the manager."""

    def __init__(
        self,
        sandbox_id: str | None = None,
        timeout: int = 3000,
        base_url: str | None = None,
        bearer_token: str | None = None,
        sandbox_type: SandboxType | str = SandboxType.BASE,
    ) -> None:
        self.base_url = base_url
        self.embed_mode = not base_url
        self.sandbox_type = SandboxType(sandbox_type)
        self.timeout = timeout
        self._sandbox_id = sandbox_id
        self.manager_api = SandboxManager(
            base_url=base_url, bearer_token=bearer_token, default_type=self.sandbox_type
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sandbox_id={self._sandbox_id!r})"

    @property
    def sandbox_id(self) -> str | None:
        """The sandbox's id on the server (None before the sandbox is created)."""
        return self._sandbox_id

    @sandbox_id.setter
    def sandbox_id(self, value: str) -> None:
        if not value:
            raise ValueError("Sandbox ID cannot be empty.")
        self._sandbox_id = value

    def _id(self) -> str:
        if self._sandbox_id is None:
            raise SandboxError(
                "this sandbox is not created yet: use it in a with block (or pass sandbox_id)"
            )
        return self._sandbox_id


class Sandbox(SandboxBase):
    """A sandbox with synchronous methods."""

    def __enter__(self) -> Self:
        if self._sandbox_id is None:
            self.sandbox_id = self.manager_api.create_from_pool(sandbox_type=self.sandbox_type)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            if self._sandbox_id is not None and not self.embed_mode:
                self.manager_api.release(self._sandbox_id)
        finally:
            self.manager_api.close()

    def get_info(self) -> dict[str, Any]:
        """What the server tells about this sandbox."""
        return self.manager_api.get_info(self._id())

    def list_tools(self, tool_type: str | None = None) -> dict[str, Any]:
        """``{tool_type: {name: {"name", "json_schema"}}}``."""
        return self.manager_api.list_tools(self._id(), tool_type=tool_type)

    def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        """Run the tool ``name``; its MCP ``CallToolResult`` as a dict."""
        return self.manager_api.call_tool(self._id(), name, arguments or {})

    def add_mcp_servers(self, server_configs: dict[str, Any], overwrite: bool = False) -> Any:
        """Add MCP servers (our server refuses, saying what it offers)."""
        return self.manager_api.add_mcp_servers(self._id(), server_configs, overwrite)


class SandboxAsync(SandboxBase):
    """A sandbox with coroutine methods."""

    async def __aenter__(self) -> Self:
        if self._sandbox_id is None:
            self.sandbox_id = await self.manager_api.create_from_pool_async(
                sandbox_type=self.sandbox_type
            )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            if self._sandbox_id is not None and not self.embed_mode:
                await self.manager_api.release_async(self._sandbox_id)
        finally:
            await self.manager_api.aclose()

    async def get_info_async(self) -> dict[str, Any]:
        """What the server tells about this sandbox."""
        return await self.manager_api.get_info_async(self._id())

    async def list_tools_async(self, tool_type: str | None = None) -> dict[str, Any]:
        """``{tool_type: {name: {"name", "json_schema"}}}``."""
        return await self.manager_api.list_tools_async(self._id(), tool_type=tool_type)

    async def call_tool_async(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        """Run the tool ``name``; its MCP ``CallToolResult`` as a dict."""
        return await self.manager_api.call_tool_async(self._id(), name, arguments or {})

    async def add_mcp_servers_async(
        self, server_configs: dict[str, Any], overwrite: bool = False
    ) -> Any:
        """Add MCP servers (our server refuses, saying what it offers)."""
        return await self.manager_api.add_mcp_servers_async(self._id(), server_configs, overwrite)


__all__ = ["Sandbox", "SandboxAsync", "SandboxBase"]
