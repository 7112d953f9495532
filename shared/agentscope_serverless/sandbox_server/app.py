"""The HTTP face of the sandbox server: AgentScope's sandbox manager protocol.

Every route but ``GET /health`` requires ``Authorization: Bearer <token>`` (compared in
constant time). Every operation of :data:`~agentscope_serverless.sandbox_protocol.OPERATIONS`
is ``POST /{operation}`` and ``POST /{operation}_async`` (the route AgentScope's async client
calls; same body, and its ``args``/``kwargs`` form). ``/cleanup`` is refused (403), ``/create``
takes no host ``mount_dir``, and ``get_info`` carries no tokens or host paths.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from agentscope_serverless.errors import (
    SandboxCapacityError,
    SandboxError,
    SandboxUnavailableError,
)
from agentscope_serverless.sandbox_protocol import (
    AddMcpServersRequest,
    CallToolRequest,
    CreateFromPoolRequest,
    CreateRequest,
    EmptyRequest,
    IdentityRequest,
    ListToolsRequest,
    SessionMappingRequest,
    async_body,
    status_for_error,
)
from agentscope_serverless.sandbox_server.bodylimit import (
    DEFAULT_BODIES_BYTES,
    MAX_BODY_BYTES,
    BodyLimit,
)
from agentscope_serverless.sandbox_server.manager import RETRY_AFTER_SECONDS, SandboxManager

logger = logging.getLogger(__name__)

PUBLIC_PATHS = frozenset({"/health"})
# Errors of a host out of what a request needs (descriptors, memory, processes): a 503 to
# retry, not a fault of the server.
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN})


def _reply(data: Any) -> dict[str, Any]:
    return {"data": data}


async def _call_tool(
    manager: SandboxManager, body: CallToolRequest, request: Request
) -> dict[str, Any]:
    """The result of the call ``body`` asks for, which is not run if its client leaves
    while it waits for its turn, and is stopped if its client leaves while it runs (the
    request is read whole: the next message is the client's leaving)."""
    left = asyncio.Event()

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            continue
        left.set()

    watcher = asyncio.create_task(watch())
    try:
        result = await manager.call_tool(
            body.identity, body.tool_name, body.arguments, client_left=left
        )
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    return result.model_dump()


def create_app(
    manager: SandboxManager, token: str, *, bodies_bytes: int = DEFAULT_BODIES_BYTES
) -> FastAPI:
    """The server's ASGI app; ``manager`` starts and stops with it, and it holds
    ``bodies_bytes`` of request bodies at once at most.

    >>> from pathlib import Path
    >>> from agentscope_serverless.sandbox_server.isolation import Toolchain
    >>> from agentscope_serverless.sandbox_server.manager import ServerConfig
    >>> toolchain = Toolchain("/usr/bin/bwrap", "/usr/bin/prlimit", "/usr/bin/python3")
    >>> app = create_app(SandboxManager(ServerConfig(Path("/tmp/sbx")), toolchain), "t0ken")
    """
    if not token:
        raise ValueError("the sandbox server needs a bearer token")
    expected = f"Bearer {token}".encode()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await manager.start()
        try:
            yield
        finally:
            await manager.close()

    app = FastAPI(
        title="agentscope-serverless sandbox server",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    # Inside the authentication below: an unauthenticated body is never read.
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES, budget=bodies_bytes)

    @app.middleware("http")
    async def authenticate(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if request.url.path not in PUBLIC_PATHS:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return JSONResponse(
                    {"detail": "missing or invalid bearer token"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
        length = request.headers.get("content-length", "0")
        if not length.isdigit() or int(length) > MAX_BODY_BYTES:
            return JSONResponse(
                {"detail": f"request body larger than {MAX_BODY_BYTES} bytes"}, status_code=413
            )
        return await call_next(request)

    @app.exception_handler(SandboxError)
    async def sandbox_error(request: Request, exc: SandboxError) -> JSONResponse:
        headers = None
        if isinstance(exc, SandboxCapacityError):
            headers = {"Retry-After": str(exc.retry_after)}
        return JSONResponse(
            {"detail": exc.message, "code": exc.code},
            status_code=status_for_error(exc),
            headers=headers,
        )

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'][1:]) or 'body'}: {err['msg']}"
            for err in exc.errors()
        )
        return JSONResponse({"detail": f"invalid request: {problems}"}, status_code=422)

    @app.exception_handler(OSError)
    async def system_error(request: Request, exc: OSError) -> JSONResponse:
        if exc.errno not in OUT_OF_RESOURCES:
            return await internal_error(request, exc)
        logger.error("%s failed: out of resources (%s)", request.url.path, exc)
        return JSONResponse(
            {
                "detail": "the sandbox server is out of resources "
                f"({os.strerror(exc.errno)}): retry in {RETRY_AFTER_SECONDS} s",
                "code": SandboxUnavailableError.code,
            },
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("%s failed", request.url.path)
        return JSONResponse({"detail": f"internal error in {request.url.path}"}, status_code=500)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return manager.health()

    @app.post("/create_from_pool")
    async def create_from_pool(body: CreateFromPoolRequest) -> dict[str, Any]:
        return _reply(await manager.create_from_pool(body.sandbox_type, body.meta))

    @app.post("/release")
    async def release(body: IdentityRequest) -> dict[str, Any]:
        return _reply(await manager.release(body.identity))

    @app.post("/get_info")
    async def get_info(body: IdentityRequest) -> dict[str, Any]:
        return _reply(manager.get_info(body.identity).model_dump())

    @app.post("/check_health")
    async def check_health(body: IdentityRequest) -> dict[str, Any]:
        return _reply(manager.check_health(body.identity))

    @app.post("/call_tool")
    async def call_tool(body: CallToolRequest, request: Request) -> dict[str, Any]:
        return _reply(await _call_tool(manager, body, request))

    @app.post("/list_tools")
    async def list_tools(body: ListToolsRequest) -> dict[str, Any]:
        return _reply(manager.list_tools(body.identity, body.tool_type))

    @app.post("/get_session_mapping")
    async def get_session_mapping(body: SessionMappingRequest) -> dict[str, Any]:
        return _reply(manager.get_session_mapping(body.session_ctx_id))

    _add_protocol_routes(app, manager)
    return app


Handler = Callable[[Any, Request], Awaitable[Any]]


def _protocol_handlers(manager: SandboxManager) -> dict[str, tuple[type[BaseModel], Handler]]:
    """Every operation: the model of its body and what it replies (the reply's ``data``)."""

    async def create_from_pool(body: CreateFromPoolRequest, request: Request) -> str:
        return await manager.create_from_pool(body.sandbox_type, body.meta)

    async def create(body: CreateRequest, request: Request) -> str:
        return await manager.create(
            body.sandbox_type,
            body.meta,
            mount_dir=body.mount_dir,
            storage_path=body.storage_path,
            environment=body.environment,
        )

    async def release(body: IdentityRequest, request: Request) -> bool:
        return await manager.release(body.identity)

    async def start(body: IdentityRequest, request: Request) -> bool:
        return await manager.start_sandbox(body.identity)

    async def stop(body: IdentityRequest, request: Request) -> bool:
        return await manager.stop_sandbox(body.identity)

    async def get_status(body: IdentityRequest, request: Request) -> str:
        return manager.get_status(body.identity)

    async def get_info(body: IdentityRequest, request: Request) -> dict[str, Any]:
        return manager.get_info(body.identity).model_dump()

    async def check_health(body: IdentityRequest, request: Request) -> bool:
        return manager.check_health(body.identity)

    async def call_tool(body: CallToolRequest, request: Request) -> dict[str, Any]:
        return await _call_tool(manager, body, request)

    async def list_tools(body: ListToolsRequest, request: Request) -> dict[str, Any]:
        return manager.list_tools(body.identity, body.tool_type)

    async def add_mcp_servers(body: AddMcpServersRequest, request: Request) -> None:
        manager.add_mcp_servers(body.identity, body.server_configs, body.overwrite)

    async def get_session_mapping(body: SessionMappingRequest, request: Request) -> list[str]:
        return manager.get_session_mapping(body.session_ctx_id)

    async def list_session_keys(body: EmptyRequest, request: Request) -> list[str]:
        return manager.list_session_keys()

    return {
        "create_from_pool": (CreateFromPoolRequest, create_from_pool),
        "create": (CreateRequest, create),
        "release": (IdentityRequest, release),
        "start": (IdentityRequest, start),
        "stop": (IdentityRequest, stop),
        "get_status": (IdentityRequest, get_status),
        "get_info": (IdentityRequest, get_info),
        "check_health": (IdentityRequest, check_health),
        "call_tool": (CallToolRequest, call_tool),
        "list_tools": (ListToolsRequest, list_tools),
        "add_mcp_servers": (AddMcpServersRequest, add_mcp_servers),
        "get_session_mapping": (SessionMappingRequest, get_session_mapping),
        "list_session_keys": (EmptyRequest, list_session_keys),
    }


async def _json_object(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = await request.json()
    except (ValueError, RecursionError):
        raise RequestValidationError(
            [{"loc": ("body",), "msg": "the body is not valid JSON", "type": "json_invalid"}]
        ) from None
    if not isinstance(body, dict):
        raise RequestValidationError(
            [{"loc": ("body",), "msg": "the body must be a JSON object", "type": "dict_type"}]
        )
    return body


def _route(name: str, model: type[BaseModel], handler: Handler, *, twin: bool) -> Any:
    async def endpoint(request: Request) -> dict[str, Any]:
        body = await _json_object(request)
        try:
            if twin:
                body = async_body(name, body)
            arguments = model.model_validate(body)
        except ValidationError as exc:
            raise RequestValidationError(
                [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]
            ) from None
        except ValueError as exc:
            raise RequestValidationError(
                [{"loc": ("body",), "msg": str(exc), "type": "value_error"}]
            ) from None
        return _reply(await handler(arguments, request))

    endpoint.__name__ = f"{name}_async" if twin else name
    return endpoint


def _add_protocol_routes(app: FastAPI, manager: SandboxManager) -> None:
    """The operations not routed above, and the ``_async`` twin of every operation."""
    existing = {getattr(route, "path", None) for route in app.routes}
    for name, (model, handler) in _protocol_handlers(manager).items():
        if f"/{name}" not in existing:
            app.post(f"/{name}")(_route(name, model, handler, twin=False))
        app.post(f"/{name}_async")(_route(name, model, handler, twin=True))

    async def cleanup() -> JSONResponse:
        return JSONResponse(
            {
                "detail": "cleanup is not offered: it would destroy every client's sandboxes; "
                "release your own with /release"
            },
            status_code=403,
        )

    app.post("/cleanup")(cleanup)
    app.post("/cleanup_async")(cleanup)


__all__ = ["create_app"]
