"""``SandboxManager``: AgentScope's sandbox manager client, over a sandbox server.

Every operation of the protocol is a method, with an ``*_async`` twin: ``create_from_pool``,
``create``, ``release``, ``start``, ``stop``, ``get_status``, ``get_info``,
``check_health``, ``list_tools``, ``call_tool``, ``add_mcp_servers``,
``get_session_mapping``, ``list_session_keys``. With ``base_url`` (and the server's
``bearer_token``) it talks to that server; without, to a private local server it starts on
first use (bubblewrap needed), as AgentScope's embedded manager does.

Unlike AgentScope's client, a failure raises a typed
:class:`~agentscope_serverless.errors.SandboxError` instead of returning an ``"Error: ..."``
string, and leaving a ``with`` block never destroys the server's sandboxes (``cleanup`` is
refused by remote servers).

>>> def demo() -> None:
...     with SandboxManager(base_url="http://sandbox-host:8000", bearer_token="t") as manager:
...         sandbox_id = manager.create_from_pool("base", {"session_ctx_id": "s1_u1"})
...         manager.call_tool(sandbox_id, "run_ipython_cell", {"code": "1 + 1"})
...         manager.release(sandbox_id)
"""

from __future__ import annotations

import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

from agentscope_serverless.errors import SandboxRequestError
from agentscope_serverless.sandbox.enums import SandboxType
from agentscope_serverless.services.sandbox._sync import BackgroundLoop
from agentscope_serverless.services.sandbox.client import DEFAULT_TIMEOUT_SECONDS, SandboxClient
from agentscope_serverless.services.sandbox.embedded import EmbeddedSandboxServer

T = TypeVar("T")
EMBEDDED_URL = "http://embedded-sandbox"


def _run_apart(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to its end on a helper loop (callers may be inside a loop)."""
    helper = BackgroundLoop("sandbox-manager")
    try:
        return helper.run(coroutine)
    finally:
        helper.close()


def _type_name(sandbox_type: SandboxType | str) -> str:
    return sandbox_type.value if isinstance(sandbox_type, SandboxType) else sandbox_type


class SandboxManager:
    """A client of one sandbox server with AgentScope's ``SandboxManager`` methods."""

    def __init__(
        self,
        config: Any = None,
        base_url: str | None = None,
        bearer_token: str | None = None,
        default_type: SandboxType | str | list[SandboxType | str] = SandboxType.BASE,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self.config = config
        self.base_url = base_url.rstrip("/") if base_url else None
        self.bearer_token = bearer_token
        types = default_type if isinstance(default_type, list) else [default_type]
        self.default_type = [SandboxType(t) for t in types] or [SandboxType.BASE]
        self._timeout = timeout
        self._lock = threading.Lock()
        self._client: SandboxClient | None = None
        self._embedded: EmbeddedSandboxServer | None = None

    def __repr__(self) -> str:
        return f"SandboxManager(base_url={self.base_url or 'embedded'!r})"

    @property
    def embed_mode(self) -> bool:
        """True when this manager runs its own local server (no ``base_url``)."""
        return self.base_url is None

    @property
    def client(self) -> SandboxClient:
        """The protocol client (the embedded server is started here, on first use)."""
        with self._lock:
            if self._client is None:
                if self.base_url is not None:
                    self._client = SandboxClient(
                        self.base_url, self.bearer_token, timeout=self._timeout
                    )
                else:
                    self._client = self._start_embedded()
            return self._client

    def _start_embedded(self) -> SandboxClient:
        embedded = EmbeddedSandboxServer()
        _run_apart(embedded.start())
        self._embedded = embedded
        return SandboxClient(
            EMBEDDED_URL, embedded.token, timeout=self._timeout, uds=embedded.socket_path
        )

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.client.run_sync(coroutine)

    # Lifecycle: closing releases nothing on a remote server; an embedded one stops.

    def _detach(self) -> tuple[SandboxClient | None, EmbeddedSandboxServer | None]:
        with self._lock:
            client, self._client = self._client, None
            embedded, self._embedded = self._embedded, None
        return client, embedded

    def close(self) -> None:
        """Close the connections (and stop the embedded server with its sandboxes)."""
        client, embedded = self._detach()
        if client is not None:
            _run_apart(client.aclose())
        if embedded is not None:
            _run_apart(embedded.stop())

    async def aclose(self) -> None:
        """:meth:`close` from async code."""
        client, embedded = self._detach()
        if client is not None:
            await client.aclose()
        if embedded is not None:
            await embedded.stop()

    def __enter__(self) -> SandboxManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> SandboxManager:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def cleanup(self) -> None:
        """Embedded: stop the local server and every sandbox on it. Remote: refused, as our
        server refuses ``/cleanup`` (it would destroy other clients' sandboxes)."""
        if self.embed_mode:
            self.close()
            return
        raise SandboxRequestError(
            "cleanup is not offered by remote sandbox servers: release your sandboxes"
        )

    async def cleanup_async(self) -> None:
        """:meth:`cleanup` from async code."""
        if self.embed_mode:
            await self.aclose()
            return
        self.cleanup()

    # The protocol's operations.

    async def create_from_pool_async(
        self, sandbox_type: SandboxType | str | None = None, meta: dict[str, Any] | None = None
    ) -> str:
        """A new sandbox of ``sandbox_type`` (the default type when None); its id."""
        kind = _type_name(sandbox_type or self.default_type[0])
        return await self.client.create_from_pool(kind, meta)

    def create_from_pool(
        self, sandbox_type: SandboxType | str | None = None, meta: dict[str, Any] | None = None
    ) -> str:
        """A new sandbox of ``sandbox_type`` (the default type when None); its id."""
        return self._run(self.create_from_pool_async(sandbox_type, meta))

    async def create_async(
        self,
        sandbox_type: SandboxType | str | None = None,
        mount_dir: str | None = None,
        storage_path: str | None = None,
        environment: dict[str, str] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> str:
        """A new sandbox with ``environment`` variables set (our server refuses
        ``mount_dir`` and ``storage_path``); its id."""
        kind = _type_name(sandbox_type or self.default_type[0])
        return await self.client.create(kind, mount_dir, storage_path, environment, meta)

    def create(
        self,
        sandbox_type: SandboxType | str | None = None,
        mount_dir: str | None = None,
        storage_path: str | None = None,
        environment: dict[str, str] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> str:
        """A new sandbox with ``environment`` variables set (our server refuses
        ``mount_dir`` and ``storage_path``); its id."""
        return self._run(
            self.create_async(sandbox_type, mount_dir, storage_path, environment, meta)
        )

    async def release_async(self, identity: str) -> bool:
        """Release a sandbox; False when the server did not know it."""
        return await self.client.release(identity)

    def release(self, identity: str) -> bool:
        """Release a sandbox; False when the server did not know it."""
        return self._run(self.release_async(identity))

    async def start_async(self, identity: str) -> bool:
        """Start a stopped sandbox."""
        return await self.client.start(identity)

    def start(self, identity: str) -> bool:
        """Start a stopped sandbox."""
        return self._run(self.start_async(identity))

    async def stop_async(self, identity: str) -> bool:
        """Stop a sandbox's processes; it keeps its workspace until released."""
        return await self.client.stop(identity)

    def stop(self, identity: str) -> bool:
        """Stop a sandbox's processes; it keeps its workspace until released."""
        return self._run(self.stop_async(identity))

    async def get_status_async(self, identity: str) -> str:
        """``running`` or ``exited``."""
        return await self.client.get_status(identity)

    def get_status(self, identity: str) -> str:
        """``running`` or ``exited``."""
        return self._run(self.get_status_async(identity))

    async def get_info_async(self, identity: str) -> dict[str, Any]:
        """What the server tells about a sandbox (``ContainerModel`` fields and ours)."""
        return await self.client.get_info(identity)

    def get_info(self, identity: str) -> dict[str, Any]:
        """What the server tells about a sandbox (``ContainerModel`` fields and ours)."""
        return self._run(self.get_info_async(identity))

    async def check_health_async(self, identity: str) -> bool:
        """True when the sandbox is there to run tools."""
        return await self.client.check_health(identity)

    def check_health(self, identity: str) -> bool:
        """True when the sandbox is there to run tools."""
        return self._run(self.check_health_async(identity))

    async def list_tools_async(
        self, identity: str, tool_type: str | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """``{tool_type: {name: {"name", "json_schema"}}}``."""
        return await self.client.list_tools(identity, tool_type)

    def list_tools(
        self, identity: str, tool_type: str | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """``{tool_type: {name: {"name", "json_schema"}}}``."""
        return self._run(self.list_tools_async(identity, tool_type))

    async def call_tool_async(
        self, identity: str, tool_name: str | None = None, arguments: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Run a tool; its MCP ``CallToolResult`` as a dict."""
        if not tool_name:
            raise SandboxRequestError("call_tool needs a tool_name")
        result = await self.client.call_tool(identity, tool_name, arguments or {})
        return result.model_dump()

    def call_tool(
        self, identity: str, tool_name: str | None = None, arguments: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Run a tool; its MCP ``CallToolResult`` as a dict."""
        return self._run(self.call_tool_async(identity, tool_name, arguments))

    async def add_mcp_servers_async(
        self, identity: str, server_configs: dict[str, Any], overwrite: bool = False
    ) -> Any:
        """Add MCP servers to a sandbox (our server refuses, saying what it offers)."""
        return await self.client.add_mcp_servers(identity, server_configs, overwrite)

    def add_mcp_servers(
        self, identity: str, server_configs: dict[str, Any], overwrite: bool = False
    ) -> Any:
        """Add MCP servers to a sandbox (our server refuses, saying what it offers)."""
        return self._run(self.add_mcp_servers_async(identity, server_configs, overwrite))

    async def get_session_mapping_async(self, session_ctx_id: str) -> list[str]:
        """The ids of the sandboxes created for ``session_ctx_id``."""
        return await self.client.get_session_mapping(session_ctx_id)

    def get_session_mapping(self, session_ctx_id: str) -> list[str]:
        """The ids of the sandboxes created for ``session_ctx_id``."""
        return self._run(self.get_session_mapping_async(session_ctx_id))

    async def list_session_keys_async(self) -> list[str]:
        """Every session context with sandboxes on the server."""
        return await self.client.list_session_keys()

    def list_session_keys(self) -> list[str]:
        """Every session context with sandboxes on the server."""
        return self._run(self.list_session_keys_async())


__all__ = ["SandboxManager"]
