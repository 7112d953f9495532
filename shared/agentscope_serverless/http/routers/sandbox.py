"""Sandbox access over HTTP: the caller's sandboxes for one of their sessions.

| Method and path | What |
|---|---|
| ``POST /sandboxes/{session_id}`` | connect: the session's sandboxes of ``types``, made if needed |
| ``GET /sandboxes/{session_id}`` | the session's sandboxes (none are made) |
| ``GET /sandboxes/{session_id}/tools`` | the tools each of the session's sandboxes offers |
| ``POST /sandboxes/{session_id}/tools/{tool_name}`` | run a tool; the body is its arguments |
| ``DELETE /sandboxes/{session_id}`` | release the session's sandboxes |

Sandboxes are keyed by ``(session_id, user)``, the user being the authenticated caller, so
a user only ever reaches their own sandboxes: the same session id of another user is
another set of sandboxes. A tool runs on the session's sandbox of ``sandbox_type`` when the
query names one, else on the sandbox of the type the built-in tool needs, else on the
session's only sandbox. A tool that fails in the sandbox (an exception, a non-zero exit
status) is a 200 result with ``isError`` set; a session without sandboxes is a 404.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from pydantic import BaseModel, Field

from agentscope_serverless.errors import InvalidInputError, SandboxNotFoundError
from agentscope_serverless.http.auth import CurrentUser, KeyedRoute
from agentscope_serverless.http.context import AppContext, get_context
from agentscope_serverless.http.openapi import error_answer
from agentscope_serverless.http.params import RequestBody, SessionIdPath
from agentscope_serverless.sandbox_protocol import BASE, MAX_TOOL_NAME_LENGTH, CallToolResult
from agentscope_serverless.services.sandbox.box import Sandbox
from agentscope_serverless.services.sandbox.service import SandboxService, canonical_type
from agentscope_serverless.services.sandbox.tools import BUILTIN_TOOLS, select_sandbox

router = APIRouter(prefix="/sandboxes", tags=["sandboxes"], route_class=KeyedRoute)

_BUILTIN = {tool.name: tool for tool in BUILTIN_TOOLS}
# The status logged for a request whose client left before its answer (nginx's).
CLIENT_LEFT = 499


async def _sandbox_service(context: Annotated[AppContext, Depends(get_context)]) -> SandboxService:
    service = context.sandbox
    return service


Sandboxes = Annotated[SandboxService, Depends(_sandbox_service)]


class ConnectRequest(RequestBody):
    """The sandbox types a session needs (one ``base`` sandbox by default); under another
    name (``env_types``, as ``connect`` takes them) they are refused, not ignored."""

    types: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=lambda: [BASE], min_length=1, max_length=8
    )


class SandboxOut(BaseModel):
    """One sandbox of a session."""

    sandbox_id: str
    sandbox_type: str


class SessionSandboxes(BaseModel):
    """A session's sandboxes."""

    session_id: str
    sandboxes: list[SandboxOut]


class SandboxTools(SandboxOut):
    """One sandbox and the tools it offers: ``{tool_type: {name: {"name", "json_schema"}}}``."""

    tools: Any


class SessionTools(BaseModel):
    """The tools of each of a session's sandboxes."""

    session_id: str
    sandboxes: list[SandboxTools]


class Released(BaseModel):
    """Whether the session had sandboxes to release."""

    session_id: str
    released: bool


def _listing(session_id: SessionIdPath, boxes: list[Sandbox]) -> SessionSandboxes:
    return SessionSandboxes(
        session_id=session_id,
        sandboxes=[SandboxOut(sandbox_id=b.sandbox_id, sandbox_type=b.sandbox_type) for b in boxes],
    )


async def _existing(
    service: SandboxService, session_id: SessionIdPath, user_id: str
) -> list[Sandbox]:
    boxes = await service.sandboxes_async(session_id, user_id)
    if not boxes:
        raise SandboxNotFoundError(
            f"session {session_id!r} has no sandbox: connect first (POST /sandboxes/{{session_id}})"
        )
    return boxes


def _sandbox_for(tool_name: str, boxes: list[Sandbox], sandbox_type: str | None) -> Sandbox:
    if sandbox_type is not None:
        for box in boxes:
            if box.sandbox_type == canonical_type(sandbox_type):
                return box
        raise SandboxNotFoundError(f"the session has no {sandbox_type!r} sandbox")
    builtin = _BUILTIN.get(tool_name)
    if builtin is not None:
        return select_sandbox(builtin, boxes)
    if len(boxes) == 1:
        return boxes[0]
    raise InvalidInputError(
        f"{tool_name!r} is none of the built-in tools ({', '.join(_BUILTIN)}), and the "
        "session has several sandboxes: for a tool of a sandbox server's own, say which "
        "sandbox offers it with the sandbox_type query parameter",
        field="sandbox_type",
    )


@router.post(
    "/{session_id}",
    response_model=SessionSandboxes,
    summary="Connect sandboxes",
    responses=error_answer(429),
)
async def connect(
    session_id: SessionIdPath,
    user_id: CurrentUser,
    service: Sandboxes,
    body: ConnectRequest | None = None,
) -> SessionSandboxes:
    types = (body or ConnectRequest()).types
    boxes = await service.connect_async(session_id, user_id, env_types=types)
    return _listing(session_id, boxes)


@router.get("/{session_id}", response_model=SessionSandboxes, summary="List sandboxes")
async def list_sandboxes(
    session_id: SessionIdPath, user_id: CurrentUser, service: Sandboxes
) -> SessionSandboxes:
    return _listing(session_id, await service.sandboxes_async(session_id, user_id))


@router.get("/{session_id}/tools", response_model=SessionTools, summary="List tools")
async def list_tools(
    session_id: SessionIdPath, user_id: CurrentUser, service: Sandboxes
) -> SessionTools:
    boxes = await _existing(service, session_id, user_id)
    return SessionTools(
        session_id=session_id,
        sandboxes=[
            SandboxTools(
                sandbox_id=box.sandbox_id,
                sandbox_type=box.sandbox_type,
                tools=await box.list_tools_async(),
            )
            for box in boxes
        ],
    )


@router.post(
    "/{session_id}/tools/{tool_name}", response_model=CallToolResult, summary="Call a tool"
)
async def call_tool(
    session_id: SessionIdPath,
    tool_name: Annotated[str, Path(min_length=1, max_length=MAX_TOOL_NAME_LENGTH)],
    user_id: CurrentUser,
    service: Sandboxes,
    request: Request,
    arguments: Annotated[dict[str, Any] | None, Body(description="The tool's arguments.")] = None,
    sandbox_type: Annotated[
        str | None, Query(min_length=1, max_length=64, description="Run on this sandbox type.")
    ] = None,
) -> dict[str, Any] | Response:
    boxes = await _existing(service, session_id, user_id)
    box = _sandbox_for(tool_name, boxes, sandbox_type)
    result = await _unless_client_leaves(box.call_tool_async(tool_name, arguments or {}), request)
    return Response(status_code=CLIENT_LEFT) if result is None else result


async def _unless_client_leaves(
    call: Coroutine[Any, Any, dict[str, Any]], request: Request
) -> dict[str, Any] | None:
    """The result of ``call``, or None when the client left first: the call is then
    cancelled, which closes its request to the sandbox server, and that server stops the
    tool's processes (a call made with an ``Idempotency-Key`` goes on, for its retry)."""
    answer = asyncio.ensure_future(call)
    leaving: asyncio.Future[Any] | None = None
    try:
        while True:
            # The body was read: the next message is the client leaving.
            leaving = asyncio.ensure_future(request.receive())
            await asyncio.wait((answer, leaving), return_when=asyncio.FIRST_COMPLETED)
            if answer.done():
                return answer.result()
            if leaving.result().get("type") == "http.disconnect":
                return None
    finally:
        if leaving is not None:
            leaving.cancel()
        answer.cancel()


@router.delete("/{session_id}", response_model=Released, summary="Release sandboxes")
async def release(session_id: SessionIdPath, user_id: CurrentUser, service: Sandboxes) -> Released:
    return Released(
        session_id=session_id, released=await service.release_async(session_id, user_id)
    )


__all__ = ["router"]
