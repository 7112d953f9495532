"""The HTTP face of the sandbox server: AgentScope's sandbox manager protocol.

Every route but ``GET /health`` requires ``Authorization: Bearer <token>`` (compared in
constant time). Only the protocol's operations exist: there is no ``/cleanup``, no
``/create`` with a host ``mount_dir``, and ``get_info`` carries no tokens or host paths.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from agentscope_serverless.errors import SandboxCapacityError, SandboxError
from agentscope_serverless.sandbox_protocol import (
    CallToolRequest,
    CreateFromPoolRequest,
    IdentityRequest,
    ListToolsRequest,
    SessionMappingRequest,
    status_for_error,
)
from agentscope_serverless.sandbox_server.bodylimit import BodyLimit
from agentscope_serverless.sandbox_server.manager import SandboxManager

logger = logging.getLogger(__name__)

PUBLIC_PATHS = frozenset({"/health"})
MAX_BODY_BYTES = 64 * 1024**2


def _reply(data: Any) -> dict[str, Any]:
    return {"data": data}


def create_app(manager: SandboxManager, token: str) -> FastAPI:
    """The server's ASGI app; ``manager`` starts and stops with it.

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
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)

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
    async def call_tool(body: CallToolRequest) -> dict[str, Any]:
        result = await manager.call_tool(body.identity, body.tool_name, body.arguments)
        return _reply(result.model_dump())

    @app.post("/list_tools")
    async def list_tools(body: ListToolsRequest) -> dict[str, Any]:
        return _reply(manager.list_tools(body.identity, body.tool_type))

    @app.post("/get_session_mapping")
    async def get_session_mapping(body: SessionMappingRequest) -> dict[str, Any]:
        return _reply(manager.get_session_mapping(body.session_ctx_id))

    return app


__all__ = ["create_app"]
