"""An async client of the sandbox manager protocol (AgentScope's, and our server's).

Each operation is ``POST {base_url}/{operation}`` with JSON arguments and the bearer token;
the ``data`` of the reply is returned, and a non-2xx reply raises a typed
:class:`~agentscope_serverless.errors.SandboxError`. Every call has one time limit, for the
whole answer (a server sending it byte by byte is given up on too) and its retries together,
and reads at most ``max_reply_bytes`` of it; an answer that is not HTTP, JSON or the protocol
is an error of the same kind (a 2xx that is not the protocol's:
:class:`~agentscope_serverless.errors.SandboxUnavailableError`, describing the answer without
quoting it), never another exception, and no error text holds the bearer token, even from a
server that echoes the request (one too short to be a secret, under
:data:`~agentscope_serverless.log.MIN_SECRET_LENGTH` characters, is left as it is). A request
that never reached the server (connection refused) is retried for every operation; other
failures (timeouts, 502/503/504) are retried only for the idempotent operations, never for
``create_from_pool``, ``create``, ``call_tool`` or ``add_mcp_servers``; a retry starts only
while enough of the time limit is left.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from agentscope_serverless.errors import (
    SandboxCapacityError,
    SandboxError,
    SandboxQuotaError,
    SandboxRequestError,
    SandboxUnavailableError,
)
from agentscope_serverless.log import redact, redacted
from agentscope_serverless.sandbox_protocol import (
    BASE,
    AddMcpServersRequest,
    CallToolRequest,
    CallToolResult,
    CreateFromPoolRequest,
    CreateRequest,
    IdentityRequest,
    ListToolsRequest,
    SessionMappingRequest,
    error_for_status,
)
from agentscope_serverless.services.sandbox._sync import BackgroundLoop
from agentscope_serverless.unpacking import AnswerTooLarge, unpacking

T = TypeVar("T")

IDEMPOTENT_OPERATIONS = frozenset(
    {
        "release",
        "start",
        "stop",
        "get_status",
        "get_info",
        "check_health",
        "list_tools",
        "get_session_mapping",
        "list_session_keys",
    }
)
RETRY_STATUSES = frozenset({502, 503, 504})
DEFAULT_TIMEOUT_SECONDS = 90.0
DEFAULT_CONNECT_TIMEOUT_SECONDS = 5.0
# A retry starts only when this much of the call's time limit (at most a quarter of it) is
# left after its backoff: an attempt with less would rarely get its answer.
MIN_RETRY_SECONDS = 1.0
# Our server's largest answer is a tool result of three texts of 1 MiB (its default output
# limit) in JSON: under 20 MiB. A server with a larger output limit needs a larger cap.
DEFAULT_MAX_REPLY_BYTES = 64 * 1024**2
MAX_DETAIL_LENGTH = 1000
DEFAULT_RETRY_AFTER_SECONDS = 10
MAX_RETRY_AFTER_SECONDS = 3600
# The session a health check asks the mapping of: its answer shows the token is taken.
HEALTH_PROBE_SESSION = "health-check"
JSON_CONTENT = {"Content-Type": "application/json"}


def _json(body: bytes) -> Any:
    """``body`` parsed as JSON; ValueError when it is not JSON a parser can follow."""
    try:
        return json.loads(body)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _kind(value: Any) -> str:
    """What a JSON value is, in a few words (never its contents).

    >>> _kind([1]), _kind("x"), _kind(None), _kind(True), _kind(2.5)
    ('a list', 'a text', 'null', 'a boolean', 'a number')
    """
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a text"
    if isinstance(value, bool):
        return "a boolean"
    return "null" if value is None else "a number"


def _unreadable(operation: str, what: str) -> SandboxUnavailableError:
    """The error of a 2xx answer that is not the protocol's, ``what`` saying how (a
    description, never the answer's contents)."""
    return SandboxUnavailableError(
        f"{operation} failed: the sandbox server answered something unreadable ({what})"
    )


def _request_body(operation: str, arguments: dict[str, Any]) -> bytes:
    """``arguments`` as JSON in ASCII, as AgentScope's client sends them: text that is not
    UTF-8 (a lone surrogate, half of an emoji a model wrote) goes as its escape, for the
    sandbox to report on; NaN and infinities, which JSON has no form for, are refused."""
    try:
        return json.dumps(arguments, allow_nan=False).encode()
    except ValueError:
        raise SandboxRequestError(
            f"{operation}: the arguments hold NaN or an infinity, which JSON cannot carry"
        ) from None
    except TypeError as exc:
        raise SandboxRequestError(f"{operation}: the arguments are not JSON ({exc})") from None


def _retry_after(value: str) -> int:
    """Seconds of a ``Retry-After`` header, at most an hour (a date or garbage: 10).

    >>> _retry_after("30"), _retry_after("86400000"), _retry_after("soon")
    (30, 3600, 10)
    """
    if not (value.isascii() and value.isdigit()):
        return DEFAULT_RETRY_AFTER_SECONDS
    return min(int(value), MAX_RETRY_AFTER_SECONDS) if len(value) <= 5 else MAX_RETRY_AFTER_SECONDS


@dataclass(frozen=True)
class _Reply:
    """A server's answer, read whole (within the client's cap)."""

    status_code: int
    reason_phrase: str
    headers: httpx.Headers
    body: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    def detail(self) -> str:
        """What the server says went wrong: its ``detail``, else its text."""
        try:
            body = _json(self.body)
        except ValueError:
            return self.body.decode("utf-8", errors="replace") or self.reason_phrase
        return str(body.get("detail") if isinstance(body, dict) else body)


def _error(operation: str, failure: str, reply: _Reply) -> SandboxError:
    error_class = error_for_status(reply.status_code)
    if issubclass(error_class, SandboxCapacityError):
        # The server's share (per owner) or its total: same status, a code says which.
        quota = reply.body.find(f'"{SandboxQuotaError.code}"'.encode()) >= 0
        return (SandboxQuotaError if quota else SandboxCapacityError)(
            f"{operation} failed: {failure}",
            retry_after=_retry_after(reply.headers.get("retry-after", "")),
        )
    error = error_class(f"{operation} failed: {failure}")
    if reply.status_code == 503 and "retry-after" in reply.headers:
        # Out of resources for a while: the caller is told when to come back, as it was.
        error.retry_after = _retry_after(reply.headers["retry-after"])
    return error


class SandboxClient:
    """Talks to one sandbox server; async methods, plus :meth:`run_sync` for sync callers.

    ``uds`` reaches the server on a Unix socket (the embedded server) instead of TCP.
    ``timeout`` bounds each call, from sending it to the last byte of its answer, its retries
    (each with what is left of it) included; connecting takes at most ``connect_timeout`` of
    it. An answer longer than ``max_reply_bytes`` is refused.

    >>> async def demo() -> None:
    ...     client = SandboxClient("http://127.0.0.1:8000", "secret-token")
    ...     sandbox_id = await client.create_from_pool("base", {"session_ctx_id": "s1"})
    ...     result = await client.call_tool(sandbox_id, "run_ipython_cell", {"code": "1 + 1"})
    ...     await client.aclose()
    """

    def __init__(
        self,
        base_url: str,
        bearer_token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_SECONDS,
        retries: int = 2,
        retry_backoff: float = 0.2,
        uds: str | None = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Accept": "application/json"}
        if bearer_token:
            self._headers["Authorization"] = f"Bearer {bearer_token}"
            # Out of every error and log line (a server may echo the request in its errors).
            redact([bearer_token])
        self._timeout = httpx.Timeout(timeout, connect=connect_timeout)
        # httpx's timeouts bound each read: a server trickling its answer never trips them.
        self._deadline = timeout
        self._min_retry_time = min(MIN_RETRY_SECONDS, timeout / 4)
        self._max_reply_bytes = max_reply_bytes
        self._retries = max(0, retries)
        self._retry_backoff = retry_backoff
        self._uds = uds
        # An httpx client belongs to the event loop it was first used on: keep one per loop.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient]
        self._clients = weakref.WeakKeyDictionary()
        self._background = BackgroundLoop("sandbox-client")

    def __repr__(self) -> str:
        return f"SandboxClient({self.base_url!r})"

    def run_sync(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run one of this client's coroutines from synchronous code (inside a loop or not)."""
        return self._background.run(coroutine)

    async def aclose(self) -> None:
        """Close the connections of every event loop this client was used on."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()
        background = self._background.loop
        leftover = self._clients.pop(background, None) if background is not None else None
        closing = leftover.aclose() if leftover is not None else None
        await asyncio.to_thread(self._background.close, closing)

    async def health(self) -> bool:
        """True when ``GET /health`` answers 2xx with JSON (it needs no token) and the
        server takes this client's token: an operation that needs it and changes nothing
        (the mapping of a session no one has) answers 2xx too, with the protocol's
        ``{"data": [...]}`` (a server answering anything to anything is no sandbox server)."""
        probe = SessionMappingRequest(session_ctx_id=HEALTH_PROBE_SESSION).model_dump()
        try:
            reply = await self._request("GET", f"{self.base_url}/health")
            if not reply.is_success:
                return False
            _json(reply.body)
            reply = await self._request(
                "POST",
                f"{self.base_url}/get_session_mapping",
                content=_request_body("get_session_mapping", probe),
                headers=JSON_CONTENT,
            )
            if not reply.is_success:
                return False
            mapping = self._data("get_session_mapping", reply)
        except (httpx.HTTPError, TimeoutError, AnswerTooLarge, ValueError, SandboxError):
            return False
        return mapping is None or isinstance(mapping, list)

    async def create_from_pool(
        self, sandbox_type: str = BASE, meta: dict[str, Any] | None = None
    ) -> str:
        """A new sandbox of ``sandbox_type``; returns its id."""
        body = CreateFromPoolRequest(sandbox_type=sandbox_type, meta=meta)
        data = await self._call("create_from_pool", body.model_dump())
        if not isinstance(data, str) or not data:
            raise SandboxUnavailableError(
                f"create_from_pool: the server gave no {sandbox_type} sandbox"
            )
        return data

    async def create(
        self,
        sandbox_type: str = BASE,
        mount_dir: str | None = None,
        storage_path: str | None = None,
        environment: dict[str, str] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> str:
        """A new sandbox with ``environment`` variables; returns its id (our server refuses
        ``mount_dir`` and ``storage_path``)."""
        body = CreateRequest(
            sandbox_type=sandbox_type,
            mount_dir=mount_dir,
            storage_path=storage_path,
            environment=environment,
            meta=meta,
        )
        data = await self._call("create", body.model_dump())
        if not isinstance(data, str) or not data:
            raise SandboxUnavailableError(f"create: the server gave no {sandbox_type} sandbox")
        return data

    async def start(self, identity: str) -> bool:
        """Start a stopped sandbox; True when it runs."""
        return bool(await self._call("start", IdentityRequest(identity=identity).model_dump()))

    async def stop(self, identity: str) -> bool:
        """Stop a sandbox's processes (it stays, with its workspace, until released)."""
        return bool(await self._call("stop", IdentityRequest(identity=identity).model_dump()))

    async def get_status(self, identity: str) -> str:
        """The sandbox's status (our server: ``running`` or ``exited``)."""
        body = IdentityRequest(identity=identity).model_dump()
        return str(await self._call("get_status", body))

    async def list_session_keys(self) -> list[str]:
        """Every session context with live sandboxes on the server."""
        data = await self._call("list_session_keys", {})
        if not isinstance(data, list):
            raise _unreadable("list_session_keys", f"'data' is {_kind(data)}, not a list")
        return [str(item) for item in data]

    async def add_mcp_servers(
        self, identity: str, server_configs: dict[str, Any], overwrite: bool = False
    ) -> Any:
        """Ask the server to add MCP servers to a sandbox (our server refuses, saying why)."""
        body = AddMcpServersRequest(
            identity=identity, server_configs=server_configs, overwrite=overwrite
        )
        return await self._call("add_mcp_servers", body.model_dump())

    async def release(self, identity: str) -> bool:
        """Release a sandbox; False when the server did not know it."""
        return bool(await self._call("release", IdentityRequest(identity=identity).model_dump()))

    async def get_info(self, identity: str) -> dict[str, Any]:
        """What the server tells about a sandbox."""
        data = await self._call("get_info", IdentityRequest(identity=identity).model_dump())
        if not isinstance(data, dict):
            raise _unreadable("get_info", f"'data' is {_kind(data)}, not an object")
        return data

    async def check_health(self, identity: str) -> bool:
        """True when the sandbox is healthy."""
        body = IdentityRequest(identity=identity).model_dump()
        return bool(await self._call("check_health", body))

    async def call_tool(
        self, identity: str, tool_name: str, arguments: dict[str, Any] | None = None
    ) -> CallToolResult:
        """Run a tool in a sandbox; its result (a failed tool has ``isError`` set)."""
        body = CallToolRequest(identity=identity, tool_name=tool_name, arguments=arguments or {})
        data = await self._call("call_tool", body.model_dump())
        try:
            return CallToolResult.model_validate(data)
        except ValueError:
            raise _unreadable("call_tool", "'data' is not a tool's result") from None

    async def list_tools(self, identity: str, tool_type: str | None = None) -> dict[str, Any]:
        """The tools a sandbox offers: ``{tool_type: {name: {"name", "json_schema"}}}``."""
        body = ListToolsRequest(identity=identity, tool_type=tool_type).model_dump()
        data = await self._call("list_tools", body)
        if not isinstance(data, dict):
            raise _unreadable("list_tools", f"'data' is {_kind(data)}, not an object")
        return data

    async def get_session_mapping(self, session_ctx_id: str) -> list[str]:
        """The ids of the sandboxes created for ``session_ctx_id`` (``[]`` when none)."""
        body = SessionMappingRequest(session_ctx_id=session_ctx_id).model_dump()
        data = await self._call("get_session_mapping", body)
        if data is None:
            return []
        if not isinstance(data, list):
            raise _unreadable("get_session_mapping", f"'data' is {_kind(data)}, not a list")
        return [str(item) for item in data]

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            transport = httpx.AsyncHTTPTransport(uds=self._uds) if self._uds else None
            client = httpx.AsyncClient(
                headers=self._headers,
                timeout=self._timeout,
                transport=transport,
                event_hooks=unpacking(max_bytes=self._max_reply_bytes),
            )
            self._clients[loop] = client
        return client

    async def _request(
        self, method: str, url: str, *, deadline: float | None = None, **kwargs: Any
    ) -> _Reply:
        """The whole answer to one request, within ``deadline`` seconds (by default the
        client's time limit) and the size cap."""
        async with asyncio.timeout(self._deadline if deadline is None else deadline):
            async with self._http().stream(method, url, **kwargs) as response:
                body = bytearray()
                # Unpacked bytes (see unpacking()): a compressed answer is capped at
                # its real size.
                async for chunk in response.aiter_bytes():
                    body += chunk
                return _Reply(
                    response.status_code, response.reason_phrase, response.headers, bytes(body)
                )

    async def _call(self, operation: str, arguments: dict[str, Any]) -> Any:
        retry_any_failure = operation in IDEMPOTENT_OPERATIONS
        url = f"{self.base_url}/{operation}"
        body = _request_body(operation, arguments)
        clock = asyncio.get_running_loop()
        ends = clock.time() + self._deadline
        attempt = 0
        while True:
            reply: _Reply | None = None
            try:
                reply = await self._request(
                    "POST", url, deadline=ends - clock.time(), content=body, headers=JSON_CONTENT
                )
            except httpx.ConnectError:
                failure = "cannot connect to the sandbox server"
                retryable = True
            except (httpx.TimeoutException, TimeoutError):
                failure = f"the sandbox server did not answer in time ({self._deadline:g} s)"
                retryable = retry_any_failure
            except AnswerTooLarge:
                cap = self._max_reply_bytes
                failure = f"the sandbox server's answer is larger than {cap} bytes"
                retryable = False
            except httpx.TransportError as exc:
                failure = f"the connection to the sandbox server failed ({type(exc).__name__})"
                retryable = retry_any_failure
            except httpx.HTTPError as exc:  # e.g. a body its Content-Encoding cannot decode
                failure = f"the sandbox server's answer could not be read ({type(exc).__name__})"
                retryable = retry_any_failure
            else:
                if reply.is_success:
                    return self._data(operation, reply)
                # Redacted before it is cut: no part of the token either.
                detail = redacted(reply.detail())[:MAX_DETAIL_LENGTH]
                failure = f"{reply.status_code} {detail}"
                retryable = retry_any_failure and reply.status_code in RETRY_STATUSES
            backoff = self._retry_backoff * 2**attempt
            time_left = ends - clock.time() - backoff
            if not retryable or attempt >= self._retries or time_left < self._min_retry_time:
                if reply is not None and not reply.is_success:
                    raise _error(operation, failure, reply)
                raise SandboxUnavailableError(f"{operation} failed: {failure}")
            await asyncio.sleep(backoff)
            attempt += 1

    def _data(self, operation: str, reply: _Reply) -> Any:
        """The ``data`` of a 2xx answer; an answer that is not the protocol's raises
        :class:`SandboxUnavailableError`, saying what it is without quoting it."""
        try:
            body = _json(reply.body)
        except ValueError:
            kind = reply.headers.get("content-type", "").partition(";")[0].strip()
            safe = kind.isascii() and kind.isprintable() and len(kind) <= 100 and "/" in kind
            of_kind = f" of {redacted(kind)}" if safe else ""
            raise _unreadable(operation, f"{len(reply.body)} bytes{of_kind}, not JSON") from None
        if not isinstance(body, dict):
            raise _unreadable(operation, f"JSON {_kind(body)}, not an object with 'data'")
        if "data" not in body:
            raise _unreadable(operation, "a JSON object without 'data'")
        return body["data"]


__all__ = ["IDEMPOTENT_OPERATIONS", "SandboxClient"]
