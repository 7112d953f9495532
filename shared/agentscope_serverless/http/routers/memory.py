"""Long-term memory over HTTP, scoped to the caller's user.

| Method and path | What |
|---|---|
| ``POST /memory`` | remember messages (optionally under a ``session_id``) |
| ``POST /memory/search`` | memories matching a query, best first |
| ``GET /memory?page_num=&page_size=`` | list memories, oldest first |
| ``DELETE /memory/{session_id}`` | forget one session's memories |
| ``DELETE /memory`` | forget all of the user's memories |
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, Field

from agentscope_serverless.http.auth import CurrentUser, KeyedRoute
from agentscope_serverless.http.context import AppContext, get_context
from agentscope_serverless.http.params import OPTIONAL_ID_PATTERN, SessionIdPath
from agentscope_serverless.schemas.agent_schemas import Message, Role, TextContent
from agentscope_serverless.services._validation import MAX_ID_LENGTH
from agentscope_serverless.services.memory.base import MAX_PAGE_SIZE, MAX_TOP_K, MemoryService

router = APIRouter(prefix="/memory", tags=["memory"], route_class=KeyedRoute)


async def _memory(context: Annotated[AppContext, Depends(get_context)]) -> MemoryService:
    service = context.memory
    return service


Memory = Annotated[MemoryService, Depends(_memory)]


class MemoryAdd(BaseModel):
    """Messages to remember, optionally grouped under a session."""

    messages: list[Message] = Field(min_length=1)
    session_id: str | None = Field(None, max_length=MAX_ID_LENGTH, pattern=OPTIONAL_ID_PATTERN)


class MemoryAdded(BaseModel):
    """How many messages were remembered."""

    added: int


class MemorySearch(BaseModel):
    """A keyword query; ``top_k`` caps the number of results."""

    query: str = Field(min_length=1)
    top_k: int | None = Field(None, ge=1, le=MAX_TOP_K)


class MemoryList(BaseModel):
    """Memories, as messages."""

    items: list[Message]


@router.post("", status_code=201, response_model=MemoryAdded, summary="Remember messages")
async def add_memory(body: MemoryAdd, user_id: CurrentUser, memory: Memory) -> MemoryAdded:
    await memory.add_memory(user_id, body.messages, session_id=body.session_id)
    return MemoryAdded(added=len(body.messages))


@router.post("/search", response_model=MemoryList, summary="Search memories")
async def search_memory(body: MemorySearch, user_id: CurrentUser, memory: Memory) -> MemoryList:
    query = Message(role=Role.USER, content=[TextContent(text=body.query)])
    filters = {"top_k": body.top_k} if body.top_k is not None else None
    return MemoryList(items=await memory.search_memory(user_id, [query], filters=filters))


@router.get("", response_model=MemoryList, summary="List memories")
async def list_memory(
    user_id: CurrentUser,
    memory: Memory,
    page_num: Annotated[int, Query(ge=1)] = 1,
    page_size: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 10,
) -> MemoryList:
    filters = {"page_num": page_num, "page_size": page_size}
    return MemoryList(items=await memory.list_memory(user_id, filters=filters))


@router.delete("/{session_id}", status_code=204, summary="Forget one session's memories")
async def delete_session_memory(
    session_id: SessionIdPath, user_id: CurrentUser, memory: Memory
) -> Response:
    await memory.delete_memory(user_id, session_id)
    return Response(status_code=204)


@router.delete("", status_code=204, summary="Forget all memories of the user")
async def delete_all_memory(user_id: CurrentUser, memory: Memory) -> Response:
    await memory.delete_memory(user_id)
    return Response(status_code=204)


__all__ = ["router"]
