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
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from agentscope_serverless.errors import (
    ConfigurationError,
    SandboxCapacityError,
    SandboxNotFoundError,
    SandboxQuotaError,
    SandboxRequestError,
    SandboxUnavailableError,
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
    FIRST_HOST_UID,
    WORKSPACE,
    HostUids,
    Limits,
    Toolchain,
    bwrap_command,
    check_free_uids,
    check_reachable,
)
from agentscope_serverless.sandbox_server.jail import (
    CPU,
    DISK,
    FREEZE,
    MEMORY,
    NO_USERNS,
    PROCESSES,
    SYSCALLS,
    HostIsolation,
    MiB,
    SandboxCgroup,
    host_memory,
    how_to_enforce,
    make_template,
    make_workspace,
    remove_tree,
    remove_workspace,
    workspace_room,
)
from agentscope_serverless.sandbox_server.process import SandboxProcess

logger = logging.getLogger(__name__)

VERSION = "agentscope-serverless-sandbox"
SESSION_CTX_KEY = "session_ctx_id"
# Who a sandbox is for, and how many sandboxes that owner may hold at once (set by the
# client, e.g. the sandbox access API for each user; the server's own cap applies too).
OWNER_KEY = "owner_id"
OWNER_CAP_KEY = "owner_max_sandboxes"
MAX_META_KEYS = 32
# As deep as the project accepts JSON anywhere: whatever is accepted can be sent back.
MAX_META_DEPTH = 100
MAX_META_BYTES = 64 * 1024
SHUTTING_DOWN = (
    "the sandbox server is shutting down (its sandboxes are released, their calls in "
    "progress stopped)"
)
# What a refused create tells the client to wait before trying again, in seconds.
RETRY_AFTER_SECONDS = 10
# The host's memory kept for the server itself (its interpreter, the request bodies it holds,
# see bodylimit), never promised to sandboxes.
SERVER_MEMORY_BYTES = 1024**3

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
    max_sandboxes_per_owner: int = 64
    max_output_bytes: int = 1024**2
    # Run even when a configured total cannot be enforced by the kernel here.
    weaker_isolation: bool = False
    # Freeze a sandbox's processes between calls.
    freeze_between_calls: bool = True
    # The host uid of the first sandbox (run as root): each runs as one of its own.
    first_sandbox_uid: int = FIRST_HOST_UID
    # How many times the memory the host can give sandboxes their limits may add up to (1.0:
    # never more; past 1, sandboxes all using theirs would run the host out of memory).
    memory_overcommit: float = 1.0
    # The memory of the host (None: found at start, see jail.host_memory).
    host_memory_bytes: int | None = None

    @property
    def sandbox_memory_bytes(self) -> int:
        """The memory one sandbox may take: its total, or (no total) a process's limit."""
        return max(1, self.limits.total_memory_bytes or self.limits.memory_bytes)

    def configured_bounds(self) -> list[str]:
        """The bounds this configuration asks for (a zero size turns a total off)."""
        limits = self.limits
        wanted = {
            MEMORY: limits.total_memory_bytes > 0,
            PROCESSES: limits.total_processes > 0,
            CPU: limits.cpus > 0,
            FREEZE: self.freeze_between_calls,
            DISK: limits.workspace_bytes > 0,
            NO_USERNS: True,
            SYSCALLS: True,
        }
        return [bound for bound, on in wanted.items() if on]


@dataclass
class _Sandbox:
    sandbox_id: str
    sandbox_type: str
    meta: dict[str, Any]
    directory: Path
    process: SandboxProcess
    cgroup: SandboxCgroup | None = None
    uid: int | None = None
    created_at: float = field(default_factory=time.time)
    last_used_at: float = field(default_factory=time.time)
    stopped: bool = False
    # Stops killing its processes now: until they are gone, it is not exited yet.
    halting: int = 0

    @property
    def status(self) -> str:
        """``running`` (its process runs, or starts on the next call) or ``exited``."""
        return EXITED if self.stopped and not self.halting else RUNNING

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


def check_meta(meta: dict[str, Any]) -> None:
    """Refuse a ``meta`` that ``get_info`` could not send back as it came: more than
    :data:`MAX_META_KEYS` keys, nesting deeper than :data:`MAX_META_DEPTH`, larger than
    :data:`MAX_META_BYTES` as JSON, or holding what JSON has no form for.

    >>> check_meta({"session_ctx_id": "s1_u1", "tags": ["a"]})
    >>> check_meta({"x": float("nan")})
    Traceback (most recent call last):
    ...
    agentscope_serverless.errors.SandboxRequestError: meta must be JSON (Unicode text, no NaN)
    """
    if len(meta) > MAX_META_KEYS:
        raise SandboxRequestError(f"meta has more than {MAX_META_KEYS} keys")
    if _nests_deeper_than(meta, MAX_META_DEPTH):
        raise SandboxRequestError(
            f"meta nests deeper than {MAX_META_DEPTH} levels of arrays and objects"
        )
    try:
        encoded = json.dumps(meta, ensure_ascii=False, allow_nan=False).encode()
    except (ValueError, TypeError):
        raise SandboxRequestError("meta must be JSON (Unicode text, no NaN)") from None
    if len(encoded) > MAX_META_BYTES:
        raise SandboxRequestError(f"meta is larger than {MAX_META_BYTES} bytes as JSON")


def _nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether dicts and lists in ``value`` nest more than ``limit`` levels deep (walked
    level by level, so no depth overflows the stack)."""
    level = [value]
    for _ in range(limit):
        level = [
            child
            for item in level
            if isinstance(item, dict | list)
            for child in (item.values() if isinstance(item, dict) else item)
        ]
        if not level:
            return False
    return any(isinstance(item, dict | list) for item in level)


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

    def __init__(
        self, config: ServerConfig, toolchain: Toolchain, host: HostIsolation | None = None
    ) -> None:
        self.config = config
        self._toolchain = toolchain
        self._host = host
        self._sandboxes: dict[str, _Sandbox] = {}
        self._sessions: dict[str, list[str]] = {}
        self._creating: dict[str | None, int] = {}
        # Per session: a future for each of its sandboxes being made, done once it is.
        self._making: dict[str, set[asyncio.Future[None]]] = {}
        self._releasing = 0
        # Sandboxes released (or failed) whose files or cgroup could not be removed yet.
        self._unremoved: dict[Path, SandboxCgroup | None] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._warming: set[asyncio.Task[None]] = set()
        self._uids: HostUids | None = None
        self._closing = False
        self._template: Path | None = None
        self._disk_room = threading.Lock()
        self._host_memory = config.host_memory_bytes
        self._agent_source = Path(agent.__file__).read_text()

    @property
    def closing(self) -> bool:
        """True once :meth:`close` began: no sandbox is created any more."""
        return self._closing

    @property
    def host(self) -> HostIsolation:
        """What the kernel enforces for this server's sandboxes."""
        assert self._host is not None, "start() the manager first"
        return self._host

    async def start(self) -> None:
        """Prepare the root directory, find what the host enforces (refusing to run with a
        configured bound it cannot enforce, unless told to run weaker) and start reaping."""
        root = self.config.root
        (root / "sandboxes").mkdir(parents=True, exist_ok=True)
        # Sandbox processes run as an unprivileged uid that must reach (not list) their dirs.
        root.chmod(0o711)
        (root / "sandboxes").chmod(0o711)
        if self._host is None:
            self._host = await asyncio.to_thread(HostIsolation.probe, root)
        if self._host_memory is None:
            self._host_memory = await asyncio.to_thread(host_memory)
        if self._memory_for_sandboxes() < self.config.sandbox_memory_bytes:
            self._host.close()
            raise ConfigurationError(
                f"this host cannot give one sandbox its memory: {self._memory_room()}; lower "
                "--memory-mb (or raise --memory-overcommit)"
            )
        await asyncio.to_thread(self._remove_leftovers)
        missing = self._host.missing(self.config.configured_bounds())
        if missing and not self.config.weaker_isolation:
            self._host.close()
            raise ConfigurationError(
                f"this host cannot enforce the sandbox bounds: {', '.join(missing)} "
                f"({how_to_enforce(missing)}, or pass --weaker-isolation to run without them)"
            )
        if os.geteuid() == 0:
            uids = HostUids(self.config.first_sandbox_uid, self.config.max_sandboxes)
            try:
                check_free_uids(uids.all)
                for uid in uids.all:
                    check_reachable(root / "sandboxes", uid)
            except ConfigurationError:
                self._host.close()
                raise
            self._uids = uids
        if self._host.disk is not None and self.config.limits.workspace_bytes > 0:
            # Made once; each sandbox's workspace is a (sparse) copy of it, given to its uid.
            self._template = await asyncio.to_thread(
                make_template,
                self._host.disk,
                root / "template" / "workspace.img",
                self.config.limits.workspace_bytes,
            )
        self._reaper = asyncio.create_task(self._reap_forever())

    async def stop_serving(self) -> None:
        """Create no sandbox any more and release every one (the server begins to shut
        down): calls in flight end at once, answering that the server is shutting down."""
        self._closing = True
        await asyncio.gather(*(self.release(sandbox_id) for sandbox_id in list(self._sandboxes)))

    async def close(self) -> None:
        """Stop reaping and creating, and release every sandbox."""
        self._closing = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        await asyncio.gather(*(self.release(sandbox_id) for sandbox_id in list(self._sandboxes)))
        for task in list(self._warming):
            task.cancel()
        await asyncio.gather(*self._warming, return_exceptions=True)
        if self._unremoved:
            await asyncio.to_thread(self._remove_unremoved)
        if self._host is not None:
            await asyncio.to_thread(self._host.close)

    def health(self) -> dict[str, Any]:
        """Capacity in use and the bounds enforced (what ``GET /health`` says); when full,
        the ``reason``."""
        in_use = self._in_use()
        fitting = min(
            self.config.max_sandboxes,
            self._memory_for_sandboxes() // self.config.sandbox_memory_bytes,
        )
        host = self._host
        enforced = host.enforced if host is not None else []
        configured = self.config.configured_bounds()
        health: dict[str, Any] = {
            "status": "ok",
            "sandboxes": in_use,
            "max_sandboxes": self.config.max_sandboxes,
            "available": max(0, fitting - in_use),
            "max_sandboxes_per_owner": self.config.max_sandboxes_per_owner,
            "enforced": [bound for bound in configured if bound in enforced],
            "not_enforced": [bound for bound in configured if bound not in enforced],
        }
        reason = self._full(in_use) or self._disk_full()
        if reason is not None:
            health.update(status="full", available=0, reason=reason)
        return health

    def _in_use(self) -> int:
        """Sandboxes counted against the capacity: alive, being made or being released."""
        return len(self._sandboxes) + sum(self._creating.values()) + self._releasing

    def _full(self, in_use: int) -> str | None:
        """Why no sandbox more can be made now (None: one can)."""
        if in_use >= self.config.max_sandboxes:
            return f"this server already runs {self.config.max_sandboxes} sandboxes"
        if (in_use + 1) * self.config.sandbox_memory_bytes > self._memory_for_sandboxes():
            return self._memory_room(in_use + 1)
        return None

    def _memory_for_sandboxes(self) -> int:
        """The memory the sandboxes' limits may add up to."""
        host = self._host_memory or 0
        return int(max(0, host - SERVER_MEMORY_BYTES) * self.config.memory_overcommit)

    def _memory_room(self, sandboxes: int = 1) -> str:
        """The host's memory for sandboxes against what ``sandboxes`` of them may take."""
        size = self.config.sandbox_memory_bytes
        overcommit = self.config.memory_overcommit
        times = f", {overcommit:g} times over" if overcommit != 1 else ""
        return (
            f"the host's memory gives sandboxes {self._memory_for_sandboxes() / MiB:.0f} MiB "
            f"({(self._host_memory or 0) / MiB:.0f} MiB less {SERVER_MEMORY_BYTES / MiB:.0f} "
            f"MiB kept for the server{times}), and {sandboxes} "
            f"{'sandbox' if sandboxes == 1 else 'sandboxes'} of {size / MiB:.0f} MiB each may "
            f"take {sandboxes * size / MiB:.0f} MiB"
        )

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
        check_meta(meta)
        session_ctx_id = meta.get(SESSION_CTX_KEY)
        if session_ctx_id is not None and not isinstance(session_ctx_id, str):
            raise SandboxRequestError("meta.session_ctx_id must be a string")
        owner = meta.get(OWNER_KEY)
        if owner is not None and not isinstance(owner, str):
            raise SandboxRequestError(f"meta.{OWNER_KEY} must be a string")
        owner_cap = meta.get(OWNER_CAP_KEY, self.config.max_sandboxes_per_owner)
        if not isinstance(owner_cap, int) or isinstance(owner_cap, bool) or owner_cap < 1:
            raise SandboxRequestError(f"meta.{OWNER_CAP_KEY} must be a positive integer")
        try:
            self._check_capacity(owner, min(owner_cap, self.config.max_sandboxes_per_owner))
        except SandboxQuotaError:
            # Connects of one session at once each make its sandbox, their copies holding
            # the owner's share: one refused for it is answered once those are made, so that
            # it finds the session's sandbox among them.
            await self._made_for(session_ctx_id)
            raise
        if self._closing:
            raise SandboxUnavailableError(SHUTTING_DOWN)
        if not session_ctx_id:
            return await self._make(sandbox_type, meta, owner, environment)
        made = asyncio.get_running_loop().create_future()
        self._making.setdefault(session_ctx_id, set()).add(made)
        try:
            return await self._make(sandbox_type, meta, owner, environment)
        finally:
            made.set_result(None)
            pending = self._making[session_ctx_id]
            pending.discard(made)
            if not pending:
                del self._making[session_ctx_id]

    async def _made_for(self, session_ctx_id: str | None) -> None:
        """Wait until the sandboxes being made for ``session_ctx_id`` are made (or failed)."""
        pending = self._making.get(session_ctx_id) if session_ctx_id else None
        if pending:
            await asyncio.wait(set(pending))

    async def _make(
        self,
        sandbox_type: str,
        meta: dict[str, Any],
        owner: str | None,
        environment: dict[str, str] | None,
    ) -> str:
        """A new sandbox of ``sandbox_type``, its capacity checked already."""
        session_ctx_id: str | None = meta.get(SESSION_CTX_KEY)
        sandbox_id = f"sbx-{uuid.uuid4().hex}"
        directory = self.config.root / "sandboxes" / sandbox_id
        # Held, like the capacity, until the sandbox's processes and files are gone.
        uid = self._uids.take() if self._uids is not None else None
        run_as = None if uid is None else (uid, uid)
        self._creating[owner] = self._creating.get(owner, 0) + 1
        try:
            workspace, cgroup = await asyncio.to_thread(
                self._make_jail, sandbox_id, directory, run_as
            )
        except BaseException:
            self._give_back(uid)
            raise
        finally:
            self._creating[owner] -= 1
            if not self._creating[owner]:
                del self._creating[owner]
        if self.closing:  # shut down while this sandbox was being made
            await asyncio.to_thread(self._remove_jail, directory, cgroup)
            self._give_back(uid)
            raise SandboxUnavailableError(SHUTTING_DOWN)
        limits = self.config.limits
        disable_userns = self.host.disables_userns
        syscall_filter = self.host.syscall_filter
        program = self._program()
        sandbox = _Sandbox(
            sandbox_id=sandbox_id,
            sandbox_type=sandbox_type,
            meta=meta,
            directory=directory,
            process=SandboxProcess(
                lambda fds: bwrap_command(
                    self._toolchain,
                    limits,
                    workspace,
                    program,
                    fds,
                    disable_userns=disable_userns,
                    syscall_filter=syscall_filter,
                    environment=environment,
                ),
                max_output=self.config.max_output_bytes,
                run_as=run_as,
                cgroup=cgroup,
                setpriv=self.host.setpriv,
                freeze=self.config.freeze_between_calls,
            ),
            cgroup=cgroup,
            uid=uid,
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

    def _check_capacity(self, owner: str | None, owner_cap: int) -> None:
        full = self._full(self._in_use())
        if full is not None:
            raise SandboxCapacityError(
                f"{full}: release sandboxes or retry in {RETRY_AFTER_SECONDS} s",
                retry_after=RETRY_AFTER_SECONDS,
            )
        if owner is None:
            return
        held = self._creating.get(owner, 0) + sum(
            1 for sandbox in self._sandboxes.values() if sandbox.meta.get(OWNER_KEY) == owner
        )
        if held >= owner_cap:
            raise SandboxQuotaError(
                f"this owner already holds {owner_cap} sandboxes (its share); release one "
                f"or retry in {RETRY_AFTER_SECONDS} s",
                retry_after=RETRY_AFTER_SECONDS,
            )

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
        # Still counted against the capacity until its processes and files are gone.
        self._releasing += 1
        try:
            await sandbox.process.stop()
            await asyncio.to_thread(self._remove_jail, sandbox.directory, sandbox.cgroup)
        finally:
            self._releasing -= 1
            self._give_back(sandbox.uid)
        logger.info("released sandbox %s", identity)
        return True

    def _give_back(self, uid: int | None) -> None:
        if self._uids is not None and uid is not None:
            self._uids.give_back(uid)

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
        """``stop``: end the sandbox's processes now, a call's included (Python variables
        are lost; the workspace and the sandbox stay). Its tools refuse calls until
        ``start``, those waiting for their turn too."""
        sandbox = self._get(identity)
        sandbox.stopped = True
        sandbox.halting += 1
        try:
            await sandbox.process.halt()
        finally:
            sandbox.halting -= 1
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
        self,
        identity: str,
        tool_name: str,
        arguments: dict[str, Any],
        *,
        client_left: asyncio.Event | None = None,
    ) -> CallToolResult:
        """Run one tool in the sandbox, once the calls before it there have ended: it waits
        for them the call's time limit at most, and only until ``client_left`` is set, which
        stops it too if it runs by then."""
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
            result = await sandbox.process.call(
                tool_name,
                validated,
                time_limit=self.config.limits.call_timeout_seconds,
                client_left=client_left,
            )
        except SandboxNotFoundError:
            if self._closing:
                raise SandboxUnavailableError(SHUTTING_DOWN) from None
            raise
        finally:
            sandbox.last_used_at = time.time()
        if self._closing and sandbox.process.released:
            raise SandboxUnavailableError(SHUTTING_DOWN)
        return result

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
                if self._unremoved:
                    await asyncio.to_thread(self._remove_unremoved)
            except Exception:
                logger.exception("reaping idle sandboxes failed")

    def _get(self, identity: str) -> _Sandbox:
        sandbox = self._sandboxes.get(identity)
        if sandbox is None and self._closing:
            raise SandboxUnavailableError(SHUTTING_DOWN)
        if sandbox is None:
            raise SandboxNotFoundError(f"no sandbox {identity!r} (released, reaped or unknown)")
        return sandbox

    def _make_jail(
        self, name: str, directory: Path, owner: tuple[int, int] | None
    ) -> tuple[Path, SandboxCgroup | None]:
        """The sandbox's directory, capped workspace (``owner``'s) and cgroup (all or
        nothing)."""
        limits = self.config.limits
        host = self.host
        directory.mkdir(mode=0o711)
        cgroup = None
        try:
            if host.cgroups.bounds:
                cgroup = host.cgroups.create(
                    name,
                    memory=limits.total_memory_bytes,
                    processes=limits.total_processes,
                    cpus=limits.cpus,
                )
            if host.disk is not None and self._template is not None:
                with self._disk_room:  # one workspace counted and made at a time
                    self._check_disk_room()
                    workspace = make_workspace(host.disk, directory, self._template)
            else:
                workspace = directory / "workspace"
                workspace.mkdir(mode=0o700)
            if owner is not None:
                os.chown(workspace, *owner)
        except BaseException:
            self._remove_jail(directory, cgroup)
            raise
        return workspace, cgroup

    def _check_disk_room(self) -> None:
        full = self._disk_full()
        if full is not None:
            raise SandboxCapacityError(
                f"{full}: release sandboxes or retry in {RETRY_AFTER_SECONDS} s",
                retry_after=RETRY_AFTER_SECONDS,
            )

    def _disk_full(self) -> str | None:
        """Why the host's disk has no room for one workspace more (None: it has)."""
        if self._template is None:
            return None
        size = self.config.limits.workspace_bytes
        free, needed = workspace_room(self.config.root / "sandboxes", size)
        if free >= needed:
            return None
        return (
            f"the sandbox host's disk has {free / MiB:.0f} MiB free, and its workspaces "
            f"may take {needed / MiB:.0f} MiB with one more ({size / MiB:.0f} MiB each)"
        )

    def _remove_leftovers(self) -> None:
        # Sandboxes of an earlier server on this root that did not shut down cleanly.
        for directory in (self.config.root / "sandboxes").iterdir():
            logger.info("removing sandbox %s left by an earlier server", directory.name)
            if self.host.disk is not None:
                with contextlib.suppress(OSError):
                    remove_workspace(self.host.disk, directory)
            remove_tree(directory)

    def _remove_jail(self, directory: Path, cgroup: SandboxCgroup | None) -> None:
        """Remove a sandbox's cgroup, workspace and directory; what cannot be removed now
        (the server out of descriptors, when nothing opening a file works) is removed by
        the reaper later."""
        try:
            if cgroup is not None:
                cgroup.remove()
            host = self.host
            if host.disk is not None:
                remove_workspace(host.disk, directory)
            remove_tree(directory)
        except OSError as exc:
            logger.warning("cannot remove sandbox %s yet: %s", directory.name, exc)
        if os.path.lexists(directory):
            self._unremoved[directory] = cgroup
        else:
            self._unremoved.pop(directory, None)

    def _remove_unremoved(self) -> None:
        """Remove the sandboxes whose removal failed before."""
        for directory, cgroup in list(self._unremoved.items()):
            self._remove_jail(directory, cgroup)

    def _program(self) -> list[str]:
        limits = self.config.limits
        config = json.dumps(
            {
                "max_output": self.config.max_output_bytes,
                "cpu_seconds": limits.cpu_seconds,
                # Shell commands are separate processes: they get every limit afresh.
                "shell_prefix": [self._toolchain.prlimit, *limits.prlimit_arguments(), "--"],
            }
        )
        return [self._toolchain.python, "-I", "-u", "-c", self._agent_source, config]


__all__ = [
    "OWNER_CAP_KEY",
    "OWNER_KEY",
    "RETRY_AFTER_SECONDS",
    "SandboxManager",
    "ServerConfig",
    "check_meta",
    "check_workspace_path",
]
