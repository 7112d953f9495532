"""Long-term memory over HTTP, scoped to the caller's user.

| Method and path | What |
|---|---|
| ``POST /memory`` | remember messages (optionally under a ``session_id``) |
| ``POST /memory/search`` | memories matching a query, best first (``top_k`` of them, or 1,000) |
| ``GET /memory?page_num=&page_size=`` | list memories, oldest first |
| ``DELETE /memory/{session_id}`` | forget one session's memories |
| ``DELETE /memory`` | forget all of the user's memories |
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from agentscope_serverless.errors import InvalidInputError
from agentscope_serverless.http.auth import CurrentUser, KeyedRoute
from agentscope_serverless.http.context import AppContext, get_context
from agentscope_serverless.http.idempotency import reads_only
from agentscope_serverless.http.params import OPTIONAL_ID_PATTERN, RequestBody, SessionIdPath
from agentscope_serverless.schemas.agent_schemas import Message, Role, TextContent
from agentscope_serverless.services._validation import MAX_ID_LENGTH
from agentscope_serverless.services.memory.base import MAX_PAGE_SIZE, MAX_TOP_K, MemoryService

router = APIRouter(prefix="/memory", tags=["memory"], route_class=KeyedRoute)


async def _memory(context: Annotated[AppContext, Depends(get_context)]) -> MemoryService:
    service = context.memory
    return service


Memory = Annotated[MemoryService, Depends(_memory)]


class MemoryAdd(RequestBody):
    """Messages to remember, optionally grouped under a session."""

    messages: list[Message] = Field(min_length=1)
    session_id: str | None = Field(None, max_length=MAX_ID_LENGTH, pattern=OPTIONAL_ID_PATTERN)


class MemoryAdded(BaseModel):
    """How many messages were remembered."""

    added: int


# A number of results as search_memory takes it: a whole number (``true`` is none), 1 to 1,000.
TopK = Annotated[int, Field(ge=1, le=MAX_TOP_K, strict=True)]


class MemoryFilters(BaseModel):
    """The ``filters`` of a search, as AgentScope's ``search_memory`` takes them (no other)."""

    model_config = ConfigDict(extra="forbid")

    top_k: TopK | None = None


class MemorySearch(RequestBody):
    """A keyword query; ``top_k`` (or ``filters.top_k``, as ``search_memory`` takes it) caps
    the number of results (:data:`MAX_TOP_K` without one)."""

    query: str = Field(min_length=1)
    top_k: TopK | None = None
    filters: MemoryFilters | None = None

    def results_asked(self) -> int | None:
        """The number of results asked for (None: the :data:`MAX_TOP_K` best); a ``top_k``
        and a ``filters.top_k`` that differ are refused, as neither can be the one meant."""
        named = self.filters.top_k if self.filters is not None else None
        if self.top_k is not None and named is not None and named != self.top_k:
            raise InvalidInputError(
                f"top_k ({self.top_k}) and filters.top_k ({named}) differ: give one of them",
                field="filters.top_k",
            )
        return named if self.top_k is None else self.top_k


class MemoryList(BaseModel):
    """Memories, as messages."""

    items: list[Message]


@router.post("", status_code=201, response_model=MemoryAdded, summary="Remember messages")
async def add_memory(body: MemoryAdd, user_id: CurrentUser, memory: Memory) -> MemoryAdded:
    await memory.add_memory(user_id, body.messages, session_id=body.session_id)
    return MemoryAdded(added=len(body.messages))


@router.post("/search", response_model=MemoryList, summary="Search memories")
@reads_only  # a retry reads anew: a search answered again would miss what was remembered since
async def search_memory(body: MemorySearch, user_id: CurrentUser, memory: Memory) -> MemoryList:
    query = Message(role=Role.USER, content=[TextContent(text=body.query)])
    top_k = body.results_asked()
    filters = {"top_k": top_k} if top_k is not None else None
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
