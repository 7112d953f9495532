"""The sandboxes of one server: creation, the session mapping, tool calls, idle reaping.

The manager's own state (which sandboxes exist, which session owns which) lives in the
server process, apart from the sandbox processes: a sandbox process that dies is started
again on the next call, and the mapping never changes because of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from agentscope_serverless.errors import (
    SandboxCapacityError,
    SandboxNotFoundError,
    SandboxRequestError,
)
from agentscope_serverless.sandbox_protocol import (
    ALLOWED_DIRECTORY,
    BASE,
    FILESYSTEM,
    PATH_ARGUMENTS,
    SANDBOX_TYPE_ALIASES,
    TOOL_SPECS,
    TOOLS_BY_NAME,
    CallToolResult,
    SandboxInfo,
    ToolSpec,
    tools_by_type,
)
from agentscope_serverless.sandbox_server import agent
from agentscope_serverless.sandbox_server.environment import EXITED, RUNNING, check_environment
from agentscope_serverless.sandbox_server.isolation import (
    SANDBOX_GID,
    SANDBOX_UID,
    WORKSPACE,
    Limits,
    Toolchain,
    bwrap_command,
    check_reachable,
    write_identity_files,
)
from agentscope_serverless.sandbox_server.process import SandboxProcess

logger = logging.getLogger(__name__)

VERSION = "agentscope-serverless-sandbox"
SESSION_CTX_KEY = "session_ctx_id"
MAX_META_KEYS = 32

# Which tools each sandbox type offers. As in AgentScope, where every sandbox image serves
# the generic tools, a filesystem sandbox runs code too; both types offer every tool.
TOOLS_OF_TYPE: dict[str, tuple[ToolSpec, ...]] = {
    BASE: TOOL_SPECS,
    FILESYSTEM: TOOL_SPECS,
}


@dataclass(frozen=True)
class ServerConfig:
    """Where the server keeps sandboxes and how it bounds them."""

    root: Path
    limits: Limits = field(default_factory=Limits)
    idle_timeout_seconds: float = 1800.0
    max_sandboxes: int = 64
    max_output_bytes: int = 1024**2


@dataclass
class _Sandbox:
    sandbox_id: str
    sandbox_type: str
    meta: dict[str, Any]
    directory: Path
    process: SandboxProcess
    created_at: float = field(default_factory=time.time)
    last_used_at: float = field(default_factory=time.time)
    stopped: bool = False

    @property
    def status(self) -> str:
        """``running`` (its process runs, or starts on the next call) or ``exited``."""
        return EXITED if self.stopped else RUNNING

    def info(self, timeout: float) -> SandboxInfo:
        return SandboxInfo(
            session_id=self.sandbox_id,
            container_id=self.sandbox_id,
            container_name=self.sandbox_id,
            version=f"{VERSION}-{self.sandbox_type}",
            meta=self.meta,
            timeout=int(timeout),
            sandbox_id=self.sandbox_id,
            sandbox_type=self.sandbox_type,
            status=self.status,
            created_at=self.created_at,
            last_used_at=self.last_used_at,
        )


def check_workspace_path(path: str) -> None:
    """Refuse a path that is absolute (outside ``/workspace``) or climbs with ``..``.

    >>> check_workspace_path("notes/a.txt")
    >>> check_workspace_path("../etc/passwd")
    Traceback (most recent call last):
    ...
    agentscope_serverless.errors.SandboxRequestError: path '../etc/passwd' leaves the workspace
    """
    if "\x00" in path:
        raise SandboxRequestError("path must not contain NUL characters")
    pure = PurePosixPath(path)
    workspace = PurePosixPath(WORKSPACE)
    if pure.is_absolute() and pure != workspace and workspace not in pure.parents:
        raise SandboxRequestError(f"path {path!r} is outside the workspace ({WORKSPACE})")
    if ".." in pure.parts:
        raise SandboxRequestError(f"path {path!r} leaves the workspace")


class SandboxManager:
    """Creates, finds, runs and releases the sandboxes of one server.

    >>> async def demo(manager: SandboxManager) -> None:
    ...     sandbox_id = await manager.create_from_pool("base", {"session_ctx_id": "s1_u1"})
    ...     result = await manager.call_tool(sandbox_id, "run_ipython_cell", {"code": "1 + 1"})
    ...     await manager.release(sandbox_id)
    """

    def __init__(self, config: ServerConfig, toolchain: Toolchain) -> None:
        self.config = config
        self._toolchain = toolchain
        self._sandboxes: dict[str, _Sandbox] = {}
        self._sessions: dict[str, list[str]] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._warming: set[asyncio.Task[None]] = set()
        self._run_as: tuple[int, int] | None = None
        self._identity_files: tuple[Path, Path] | None = None
        self._agent_source = Path(agent.__file__).read_text()

    async def start(self) -> None:
        """Prepare the root directory and start reaping idle sandboxes."""
        root = self.config.root
        (root / "sandboxes").mkdir(parents=True, exist_ok=True)
        # Sandbox processes run as an unprivileged uid that must reach (not list) their dirs.
        root.chmod(0o711)
        (root / "sandboxes").chmod(0o711)
        self._identity_files = write_identity_files(root / "etc")
        if os.geteuid() == 0:
            self._run_as = (SANDBOX_UID, SANDBOX_GID)
            check_reachable(root / "sandboxes", SANDBOX_UID)
        self._reaper = asyncio.create_task(self._reap_forever())

    async def close(self) -> None:
        """Stop reaping and release every sandbox."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        for sandbox_id in list(self._sandboxes):
            await self.release(sandbox_id)

    async def create(
        self,
        sandbox_type: str,
        meta: dict[str, Any] | None,
        *,
        mount_dir: str | None = None,
        storage_path: str | None = None,
        environment: dict[str, str] | None = None,
    ) -> str:
        """``create``: a new sandbox, with ``environment`` set for its code and commands.

        A host ``mount_dir`` or a ``storage_path`` is refused: sandboxes see only their own
        workspace.
        """
        if mount_dir or storage_path:
            raise SandboxRequestError(
                "mount_dir and storage_path are not accepted: a sandbox sees only its own "
                f"workspace ({ALLOWED_DIRECTORY}); put files there with write_file"
            )
        return await self.create_from_pool(
            sandbox_type, meta, environment=check_environment(environment)
        )

    async def create_from_pool(
        self,
        sandbox_type: str,
        meta: dict[str, Any] | None,
        *,
        environment: dict[str, str] | None = None,
    ) -> str:
        """A new sandbox of ``sandbox_type``; ``meta["session_ctx_id"]`` maps it to a session."""
        sandbox_type = SANDBOX_TYPE_ALIASES.get(sandbox_type, sandbox_type)
        if sandbox_type not in TOOLS_OF_TYPE:
            raise SandboxRequestError(
                f"unsupported sandbox type {sandbox_type!r}; "
                f"this server offers: {', '.join(TOOLS_OF_TYPE)}"
            )
        meta = dict(meta or {})
        if len(meta) > MAX_META_KEYS:
            raise SandboxRequestError(f"meta has more than {MAX_META_KEYS} keys")
        session_ctx_id = meta.get(SESSION_CTX_KEY)
        if session_ctx_id is not None and not isinstance(session_ctx_id, str):
            raise SandboxRequestError("meta.session_ctx_id must be a string")
        if len(self._sandboxes) >= self.config.max_sandboxes:
            raise SandboxCapacityError(
                f"this server already runs {self.config.max_sandboxes} sandboxes"
            )
        sandbox_id = f"sbx-{uuid.uuid4().hex}"
        directory = self.config.root / "sandboxes" / sandbox_id
        workspace = directory / "workspace"
        await asyncio.to_thread(self._make_directories, directory, workspace)
        sandbox = _Sandbox(
            sandbox_id=sandbox_id,
            sandbox_type=sandbox_type,
            meta=meta,
            directory=directory,
            process=SandboxProcess(
                self._command(workspace, environment or {}),
                log_path=directory / "agent.log",
                run_as=self._run_as,
            ),
        )
        self._sandboxes[sandbox_id] = sandbox
        if session_ctx_id:
            self._sessions.setdefault(session_ctx_id, []).append(sandbox_id)
        if sandbox_type == BASE:
            task = asyncio.create_task(sandbox.process.warm_up())
            self._warming.add(task)
            task.add_done_callback(self._warming.discard)
        logger.info("created sandbox %s (%s)", sandbox_id, sandbox_type)
        return sandbox_id

    async def release(self, identity: str) -> bool:
        """Stop a sandbox and delete its workspace; False when there is no such sandbox."""
        sandbox = self._sandboxes.pop(identity, None)
        if sandbox is None:
            return False
        session_ctx_id: str | None = sandbox.meta.get(SESSION_CTX_KEY)
        ids = self._sessions.get(session_ctx_id, []) if session_ctx_id else []
        if session_ctx_id and identity in ids:
            ids.remove(identity)
            if not ids:
                del self._sessions[session_ctx_id]
        await sandbox.process.stop()
        await asyncio.to_thread(shutil.rmtree, sandbox.directory, True)
        logger.info("released sandbox %s", identity)
        return True

    def get_info(self, identity: str) -> SandboxInfo:
        """What the server knows about a sandbox."""
        return self._get(identity).info(self.config.idle_timeout_seconds)

    async def start_sandbox(self, identity: str) -> bool:
        """``start``: a stopped sandbox runs again (its process starts now)."""
        sandbox = self._get(identity)
        sandbox.stopped = False
        sandbox.last_used_at = time.time()
        await sandbox.process.warm_up()
        return True

    async def stop_sandbox(self, identity: str) -> bool:
        """``stop``: end the sandbox's processes (Python variables are lost; the workspace
        and the sandbox stay). Its tools refuse calls until ``start``."""
        sandbox = self._get(identity)
        sandbox.stopped = True
        await sandbox.process.halt()
        return True

    def get_status(self, identity: str) -> str:
        """``get_status``: ``running`` or ``exited`` (after ``stop``)."""
        return self._get(identity).status

    def list_session_keys(self) -> list[str]:
        """``list_session_keys``: every session context that has live sandboxes."""
        return list(self._sessions)

    def add_mcp_servers(
        self, identity: str, server_configs: dict[str, Any], overwrite: bool = False
    ) -> None:
        """``add_mcp_servers``: refused with the reason and what each sandbox offers.

        An MCP server config is a command to run (or a URL to reach); this server runs no
        command outside a tool call and gives sandboxes no network, so it adds none.
        """
        sandbox = self._get(identity)
        servers = server_configs.get("mcpServers")
        if not isinstance(servers, dict) or not servers:
            raise SandboxRequestError(
                'server_configs must be {"mcpServers": {name: config}} with at least one server'
            )
        offered = ", ".join(spec.name for spec in TOOLS_OF_TYPE[sandbox.sandbox_type])
        raise SandboxRequestError(
            f"this sandbox server does not add MCP servers ({', '.join(map(str, servers))}): "
            "they would run commands outside a tool call or reach the network, which "
            f"sandboxes cannot; a {sandbox.sandbox_type} sandbox offers its built-in tools: "
            f"{offered} (see list_tools)"
        )

    def check_health(self, identity: str) -> bool:
        """True when the sandbox can run tools: it exists (its process starts again on
        demand) and is not stopped."""
        return not self._get(identity).stopped

    def list_tools(self, identity: str, tool_type: str | None) -> dict[str, Any]:
        """The sandbox's tools in AgentScope's shape, ``{tool_type: {name: {"name",
        "json_schema"}}}``: all of them, or those of ``tool_type``."""
        sandbox = self._get(identity)
        return tools_by_type(TOOLS_OF_TYPE[sandbox.sandbox_type], tool_type)

    def get_session_mapping(self, session_ctx_id: str) -> list[str]:
        """The ids of the live sandboxes created for ``session_ctx_id``."""
        return list(self._sessions.get(session_ctx_id, []))

    async def call_tool(
        self, identity: str, tool_name: str, arguments: dict[str, Any]
    ) -> CallToolResult:
        """Run one tool in the sandbox."""
        sandbox = self._get(identity)
        if sandbox.stopped:
            raise SandboxRequestError(f"sandbox {identity!r} is stopped: start it first")
        spec = TOOLS_BY_NAME.get(tool_name)
        if spec is None or spec not in TOOLS_OF_TYPE[sandbox.sandbox_type]:
            offered = ", ".join(s.name for s in TOOLS_OF_TYPE[sandbox.sandbox_type])
            raise SandboxRequestError(
                f"a {sandbox.sandbox_type} sandbox has no tool {tool_name!r}; it offers: {offered}"
            )
        try:
            validated = spec.arguments.model_validate(arguments).model_dump()
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
                for err in exc.errors()
            )
            raise SandboxRequestError(f"bad arguments for {tool_name}: {problems}") from None
        for name in PATH_ARGUMENTS:
            if name in validated:
                check_workspace_path(validated[name])
        for path in validated.get("paths", ()):
            check_workspace_path(path)
        sandbox.last_used_at = time.time()
        try:
            return await sandbox.process.call(
                tool_name, validated, time_limit=self.config.limits.call_timeout_seconds
            )
        finally:
            sandbox.last_used_at = time.time()

    async def reap_idle(self, now: float | None = None) -> list[str]:
        """Release the sandboxes unused for longer than the idle timeout; their ids."""
        now = time.time() if now is None else now
        idle = [
            sandbox_id
            for sandbox_id, sandbox in self._sandboxes.items()
            if now - sandbox.last_used_at > self.config.idle_timeout_seconds
            and not sandbox.process.calls_in_flight
        ]
        for sandbox_id in idle:
            logger.info("reaping idle sandbox %s", sandbox_id)
            await self.release(sandbox_id)
        return idle

    async def _reap_forever(self) -> None:
        interval = max(0.5, min(30.0, self.config.idle_timeout_seconds / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reap_idle()
            except Exception:
                logger.exception("reaping idle sandboxes failed")

    def _get(self, identity: str) -> _Sandbox:
        sandbox = self._sandboxes.get(identity)
        if sandbox is None:
            raise SandboxNotFoundError(f"no sandbox {identity!r} (released, reaped or unknown)")
        return sandbox

    def _make_directories(self, directory: Path, workspace: Path) -> None:
        directory.mkdir(mode=0o711)
        workspace.mkdir(mode=0o700)
        if self._run_as is not None:
            os.chown(workspace, *self._run_as)

    def _command(self, workspace: Path, environment: dict[str, str]) -> list[str]:
        assert self._identity_files is not None, "start() the manager first"
        limits = self.config.limits
        config = json.dumps(
            {
                "max_output": self.config.max_output_bytes,
                "cpu_seconds": limits.cpu_seconds,
                # Shell commands are separate processes: they get every limit afresh.
                "shell_prefix": [self._toolchain.prlimit, *limits.prlimit_arguments(), "--"],
                "environment": environment,
            }
        )
        program = [self._toolchain.python, "-I", "-u", "-c", self._agent_source, config]
        return bwrap_command(
            self._toolchain, self.config.limits, workspace, self._identity_files, program
        )


__all__ = ["SandboxManager", "ServerConfig", "check_workspace_path"]
