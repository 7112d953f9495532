"""``SandboxService``: connect sessions to sandboxes on a sandbox server, and release them.

Sandboxes are keyed by ``(session_id, user_id)`` through the server's session mapping
(:func:`session_ctx_id`), so a new process (a new Lambda instance) finds the same sandboxes
again. In an agent's run, a call naming no user acts for the run's user: an agent that
connects by session id alone gets its user's sandboxes, never those of another user's
session of the same id.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from agentscope_serverless.errors import (
    InvalidInputError,
    SandboxNotFoundError,
    SandboxQuotaError,
    SandboxUnavailableError,
)
from agentscope_serverless.log import logger
from agentscope_serverless.sandbox_protocol import BASE
from agentscope_serverless.services._turn import turn_user_id
from agentscope_serverless.services._validation import require_session_id, require_user_id
from agentscope_serverless.services.base import ServiceWithLifecycleManager, StartedGuard
from agentscope_serverless.services.sandbox.box import Sandbox
from agentscope_serverless.services.sandbox.client import DEFAULT_TIMEOUT_SECONDS, SandboxClient
from agentscope_serverless.services.sandbox.embedded import EmbeddedSandboxServer
from agentscope_serverless.services.sandbox.tools import infer_sandbox_types
from agentscope_serverless.settings import Settings

# AgentScope's sandbox types, longest first, to recognise a type in a server's image name.
KNOWN_SANDBOX_TYPES = (
    "filesystem",
    "training",
    "appworld",
    "browser",
    "mobile",
    "agentbay",
    "cloud",
    "bfcl",
    "base",
    "gui",
)


ASYNC_SUFFIX = "_async"
# Longest key sent to a server (its session mapping accepts up to 1100 characters).
MAX_SESSION_CTX_ID_LENGTH = 1024


def _escape(part: str) -> str:
    return part.replace("%", "%25").replace("_", "%5F")


def session_ctx_id(session_id: str, user_id: str | None = None) -> str:
    """The key of a session's sandboxes in the server's session mapping.

    ``f"{session_id}_{user_id}"`` as in AgentScope, but with ``%`` and ``_`` escaped in
    both ids, so two different pairs never share a key (unescaped, session ``a_b`` of user
    ``c`` and session ``a`` of user ``b_c`` would). Ids without ``%`` or ``_`` keep
    AgentScope's key. A key longer than the server accepts becomes ``%%`` and its SHA-256,
    which no escaped key can be (an escaped key never holds ``%%``).

    >>> session_ctx_id("s1", "u1")
    's1_u1'
    >>> session_ctx_id("a_b", "c"), session_ctx_id("a", "b_c")
    ('a%5Fb_c', 'a_b%5Fc')
    """
    key = _escape(session_id) if user_id is None else f"{_escape(session_id)}_{_escape(user_id)}"
    if len(key) > MAX_SESSION_CTX_ID_LENGTH:
        return "%%" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return key


def canonical_type(sandbox_type: str) -> str:
    """The type of the sandboxes of ``sandbox_type``: AgentScope's async classes ask for
    ``base_async``, ``filesystem_async``..., the same sandboxes as ``base``, ``filesystem``.

    >>> canonical_type("base_async"), canonical_type("filesystem")
    ('base', 'filesystem')
    """
    return sandbox_type.removesuffix(ASYNC_SUFFIX)


def sandbox_type_from_info(info: dict[str, Any]) -> str:
    """A sandbox's type from ``get_info``: our server says it; AgentScope's names an image."""
    declared = info.get("sandbox_type")
    if isinstance(declared, str) and declared:
        return canonical_type(declared)
    image = str(info.get("version") or info.get("container_name") or "").lower()
    for sandbox_type in KNOWN_SANDBOX_TYPES:
        if sandbox_type in image:
            return sandbox_type
    return BASE


def _first_of_type(boxes: Sequence[Sandbox], sandbox_type: str) -> Sandbox | None:
    return next((box for box in boxes if box.sandbox_type == sandbox_type), None)


def _requested_types(
    env_types: Sequence[str | None] | None,
    sandbox_types: Sequence[str | None] | None,
    tools: Iterable[Any] | None,
) -> list[str]:
    if (
        env_types is not None
        and sandbox_types is not None
        and list(env_types) != list(sandbox_types)
    ):
        raise InvalidInputError(
            "env_types and sandbox_types are synonyms; give one of them", field="sandbox_types"
        )
    # AgentScope skipped a None in the list (one built with conditions holds them).
    given = env_types if env_types is not None else sandbox_types or []
    types = [sandbox_type for sandbox_type in given if sandbox_type is not None]
    if tools is not None:
        types += infer_sandbox_types(tools)
    for sandbox_type in types:
        if not isinstance(sandbox_type, str) or not sandbox_type.strip():
            raise InvalidInputError("sandbox types must be non-blank strings", field="env_types")
    # One sandbox per type, whichever name asks for it: a session's base sandbox serves
    # base_async too, rather than a new one on each connect.
    unique = list(dict.fromkeys(canonical_type(t.strip()) for t in types))
    return unique or [BASE]


def _acting_user(user_id: str | None) -> str | None:
    """``user_id``, else (in an agent's run) the run's user."""
    return user_id if user_id is not None else turn_user_id()


class SandboxService(StartedGuard, ServiceWithLifecycleManager):
    """Sandboxes for sessions, on a remote sandbox server or on an embedded local one.

    With ``base_url`` (and the server's ``bearer_token``) sandboxes live on that server;
    without it, :meth:`start` launches a private local server (bubblewrap needed).

    >>> async def demo() -> None:
    ...     async with SandboxService("http://sandbox-server:8000", "token") as service:
    ...         [box] = await service.connect_async("session1", "user1", env_types=["base"])
    ...         box.run_ipython_cell("x = 1")
    ...         await service.release_async("session1", "user1")
    """

    def __init__(
        self,
        base_url: str | None = None,
        bearer_token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        max_sandboxes_per_user: int | None = None,
        weaker_isolation: bool = False,
    ) -> None:
        for name, value in (("base_url", base_url), ("bearer_token", bearer_token)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a string or None, not {type(value).__name__}")
        self.base_url = base_url
        self._bearer_token = bearer_token
        self._timeout = timeout
        # Each user's share of the server: past it, connecting raises SandboxQuotaError (429).
        self.max_sandboxes_per_user = max_sandboxes_per_user
        self._weaker_isolation = weaker_isolation
        self._client: SandboxClient | None = None
        self._embedded: EmbeddedSandboxServer | None = None
        self._created: set[str] = set()

    @classmethod
    def from_settings(cls, settings: Settings) -> SandboxService:
        """A service configured by ``SANDBOX_BASE_URL``, ``SANDBOX_BEARER_TOKEN``,
        ``SANDBOX_TIMEOUT_SECONDS``, ``SANDBOX_MAX_PER_USER`` and
        ``SANDBOX_WEAKER_ISOLATION``."""
        token = settings.sandbox_bearer_token
        return cls(
            settings.sandbox_base_url,
            token.get_secret_value() if token is not None else None,
            timeout=settings.sandbox_timeout_seconds,
            max_sandboxes_per_user=settings.sandbox_max_per_user,
            weaker_isolation=settings.sandbox_weaker_isolation,
        )

    def __repr__(self) -> str:
        where = self.base_url or "embedded"
        return f"SandboxService({where!r})"

    async def start(self) -> None:
        """Prepare the client (and launch the embedded server when there is no base URL)."""
        if self._started:
            return
        if self.base_url:
            self._client = SandboxClient(self.base_url, self._bearer_token, timeout=self._timeout)
        else:
            embedded = EmbeddedSandboxServer(weaker_isolation=self._weaker_isolation)
            await embedded.start()
            self._embedded = embedded
            self._client = SandboxClient(
                "http://embedded-sandbox",
                embedded.token,
                timeout=self._timeout,
                uds=embedded.socket_path,
            )
        self._created = set()
        self._set_started(True)

    async def stop(self) -> None:
        """Release the sandboxes this object created (never other clients' sandboxes).

        A server that cannot be reached keeps them (it reaps them once idle): stopping
        goes on, and says so in the log.
        """
        if not self._started:
            return
        self._set_started(False)
        client, self._client = self._client, None
        assert client is not None
        try:
            for sandbox_id in sorted(self._created):
                try:
                    await client.release(sandbox_id)
                except SandboxNotFoundError:
                    continue
                except SandboxUnavailableError as exc:
                    logger.warning(
                        "sandboxes not released: the sandbox server is unavailable",
                        extra={"error": exc.message, "sandboxes": len(self._created)},
                    )
                    break
            self._created.clear()
        finally:
            await client.aclose()
            embedded, self._embedded = self._embedded, None
            if embedded is not None:
                await embedded.stop()

    async def health(self) -> bool:
        """True when the sandbox server answers ``GET /health`` and takes the token."""
        if not self._started or self._client is None:
            return False
        return await self._client.health()

    async def connect_async(
        self,
        session_id: str,
        user_id: str | None = None,
        env_types: Sequence[str | None] | None = None,
        tools: Iterable[Any] | None = None,
        sandbox_types: Sequence[str | None] | None = None,
    ) -> list[Sandbox]:
        """The session's sandboxes, one per requested type: reused when the server already
        maps them to ``(session_id, user_id)``, created otherwise.

        Types come from ``env_types`` (or its synonym ``sandbox_types``) plus those the
        ``tools`` need; with neither, one ``base`` sandbox.

        Clients connecting one session at once (two Lambda instances) each make the
        sandboxes they do not find; all of them then use the session's first sandbox of
        each type, and each releases the others it made. One refused for the user's share
        (held by those copies) uses the session's sandbox too.
        """
        client = self.client
        user_id = _acting_user(user_id)
        key = self._key(session_id, user_id)
        wanted = _requested_types(env_types, sandbox_types, tools)
        found = await self.sandboxes_async(session_id, user_id)
        made: dict[str, Sandbox] = {}
        for sandbox_type in wanted:
            if not any(box.sandbox_type == sandbox_type for box in found):
                try:
                    sandbox_id = await client.create_from_pool(
                        sandbox_type, self._meta(key, user_id)
                    )
                except SandboxQuotaError:
                    # The user's share may be held by the copies other connects of this
                    # session made at once: the session's sandbox is among them.
                    found = await self.sandboxes_async(session_id, user_id)
                    if _first_of_type(found, sandbox_type) is None:
                        raise
                    continue
                self._created.add(sandbox_id)
                made[sandbox_type] = Sandbox(client, sandbox_id, sandbox_type)
        # The server maps a session's sandboxes in the order they were made.
        mapped = await self.sandboxes_async(session_id, user_id) if made else found
        boxes: list[Sandbox] = []
        for sandbox_type in wanted:
            box = (
                _first_of_type(mapped, sandbox_type)
                or made.get(sandbox_type)
                or _first_of_type(found, sandbox_type)
            )
            assert box is not None  # made, or found at first
            boxes.append(box)
        for box in made.values():
            if box not in boxes:
                with contextlib.suppress(SandboxNotFoundError):
                    await client.release(box.sandbox_id)
                self._created.discard(box.sandbox_id)
        return boxes

    async def sandboxes_async(self, session_id: str, user_id: str | None = None) -> list[Sandbox]:
        """The live sandboxes of ``(session_id, user_id)``, creating none (``[]`` when none)."""
        client = self.client
        boxes: list[Sandbox] = []
        key = self._key(session_id, _acting_user(user_id))
        for sandbox_id in await client.get_session_mapping(key):
            try:
                info = await client.get_info(sandbox_id)
            except SandboxNotFoundError:
                continue
            boxes.append(Sandbox(client, sandbox_id, sandbox_type_from_info(info)))
        return boxes

    def connect(
        self,
        session_id: str,
        user_id: str | None = None,
        env_types: Sequence[str | None] | None = None,
        tools: Iterable[Any] | None = None,
        sandbox_types: Sequence[str | None] | None = None,
    ) -> list[Sandbox]:
        """:meth:`connect_async` for synchronous code (also inside a running event loop)."""
        client = self.client
        # Resolved here: the call may run in a thread of its own, outside the run's context.
        user_id = _acting_user(user_id)
        return client.run_sync(
            self.connect_async(session_id, user_id, env_types, tools, sandbox_types)
        )

    async def release_async(self, session_id: str, user_id: str | None = None) -> bool:
        """Release every sandbox of ``(session_id, user_id)``; False when it had none."""
        client = self.client
        released = False
        key = self._key(session_id, _acting_user(user_id))
        for sandbox_id in await client.get_session_mapping(key):
            released = await client.release(sandbox_id) or released
            self._created.discard(sandbox_id)
        return released

    async def release_user_async(self, user_id: str) -> bool:
        """Release every sandbox of ``user_id``, whatever its session (erasing the user's
        data: a workspace holds what their agent wrote); False when they had none.

        A session's key names its user after its last ``_`` (:func:`session_ctx_id`); a key
        hashed for its length names none, and its sandboxes are the user's by their owner.
        """
        client = self.client
        user_id = require_user_id(user_id)
        released = False
        for key in await client.list_session_keys():
            session_part, _, user_part = key.rpartition("_")
            hashed = key.startswith("%%")
            if not hashed and (not session_part or user_part != _escape(user_id)):
                continue
            for sandbox_id in await client.get_session_mapping(key):
                if hashed and not await self._owned_by(sandbox_id, user_id):
                    continue
                with contextlib.suppress(SandboxNotFoundError):
                    released = await client.release(sandbox_id) or released
                self._created.discard(sandbox_id)
        return released

    def release(self, session_id: str, user_id: str | None = None) -> bool:
        """:meth:`release_async` for synchronous code (also inside a running event loop)."""
        client = self.client
        return client.run_sync(self.release_async(session_id, _acting_user(user_id)))

    async def _owned_by(self, sandbox_id: str, user_id: str) -> bool:
        try:
            info = await self.client.get_info(sandbox_id)
        except SandboxNotFoundError:
            return False
        meta = info.get("meta")
        return isinstance(meta, dict) and meta.get("owner_id") == user_id

    @property
    def client(self) -> SandboxClient:
        """The protocol client of the started service (for operations beyond sessions)."""
        self._ensure_started()
        assert self._client is not None
        return self._client

    def _meta(self, key: str, user_id: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"session_ctx_id": key}
        if user_id is not None:
            # The server counts a user's sandboxes across sessions and holds them to a share.
            meta["owner_id"] = user_id
            if self.max_sandboxes_per_user is not None:
                meta["owner_max_sandboxes"] = self.max_sandboxes_per_user
        return meta

    @staticmethod
    def _key(session_id: str, user_id: str | None) -> str:
        cleaned = require_session_id(session_id)
        if user_id is not None and (not isinstance(user_id, str) or not user_id.strip()):
            raise InvalidInputError("user_id must be a non-blank string", field="user_id")
        return session_ctx_id(cleaned, user_id)


__all__ = ["SandboxService", "sandbox_type_from_info", "session_ctx_id"]
