"""Session history over HTTP, scoped to the caller's user.

| Method and path | What |
|---|---|
| ``POST /sessions`` | create a session (idempotent; a new uuid without ``session_id``) |
| ``GET /sessions?limit=&cursor=`` | list sessions, oldest first, a page at a time |
| ``GET /sessions/{id}`` | a session with its messages (404 when missing) |
| ``DELETE /sessions/{id}`` | delete a session: its history, runs, agent state, requests' keys |
| ``GET /sessions/{id}/messages?limit=&cursor=`` | a page of a session's messages |
| ``POST /sessions/{id}/messages`` | append messages (creates the session if needed) |
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, Field

from agentscope_serverless.errors import MethodNotImplementedError, SessionNotFoundError
from agentscope_serverless.http.auth import CurrentUser, KeyedRoute
from agentscope_serverless.http.context import AppContext, get_context
from agentscope_serverless.http.idempotency import writes_in_session
from agentscope_serverless.http.params import (
    OPTIONAL_ID_PATTERN,
    Cursor,
    RequestBody,
    SessionIdPath,
)
from agentscope_serverless.log import logger
from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.schemas.pagination import Page
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services._validation import (
    MAX_ID_LENGTH,
    refuse_blank_user_messages,
    refuse_images_no_model_takes,
)
from agentscope_serverless.services.agent_state.base import StateService
from agentscope_serverless.services.session_history.base import MAX_PAGE_SIZE, SessionHistoryService

router = APIRouter(prefix="/sessions", tags=["sessions"], route_class=KeyedRoute)


async def _history(context: Annotated[AppContext, Depends(get_context)]) -> SessionHistoryService:
    service = context.session_history
    return service


History = Annotated[SessionHistoryService, Depends(_history)]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE, description="Items per page.")]


class SessionCreate(RequestBody):
    """A session to create; without ``session_id`` the server picks a uuid."""

    session_id: str | None = Field(None, max_length=MAX_ID_LENGTH, pattern=OPTIONAL_ID_PATTERN)


class SessionSummary(BaseModel):
    """A session without its messages."""

    id: str
    user_id: str


class SessionPage(BaseModel):
    """A page of sessions; pass ``next_cursor`` back for the next one."""

    items: list[SessionSummary]
    next_cursor: str | None = None


# The most messages one append takes: each comes back in the answer (with its defaults, some
# 300 bytes for a word), which a Lambda function returns up to 6 MB; and the append takes
# the event loop until all are checked.
MAX_APPENDED_MESSAGES = 1000


class MessagesIn(RequestBody):
    """Messages to append, in order (at most 1,000)."""

    messages: list[Message] = Field(min_length=1, max_length=MAX_APPENDED_MESSAGES)


class MessagesOut(BaseModel):
    """The messages as stored."""

    messages: list[Message]


@router.post("", status_code=201, response_model=SessionSummary, summary="Create a session")
async def create_session(
    body: SessionCreate, user_id: CurrentUser, history: History, request: Request
) -> SessionSummary:
    session = await history.create_session(user_id, body.session_id)
    writes_in_session(request, session.id)
    return SessionSummary(id=session.id, user_id=session.user_id)


@router.get("", response_model=SessionPage, summary="List sessions")
async def list_sessions(
    user_id: CurrentUser, history: History, limit: Limit = 50, cursor: Cursor = None
) -> SessionPage:
    page = await history.list_sessions_page(user_id, limit=limit, cursor=cursor or None)
    return SessionPage(
        items=[SessionSummary(id=s.id, user_id=s.user_id) for s in page.items],
        next_cursor=page.next_cursor,
    )


@router.get("/{session_id}", response_model=Session, summary="Get a session with its messages")
async def get_session(session_id: SessionIdPath, user_id: CurrentUser, history: History) -> Session:
    session = await history.get_session(user_id, session_id)
    if session is None:
        raise SessionNotFoundError(user_id, session_id)
    return session


@router.delete("/{session_id}", status_code=204, summary="Delete a session")
async def delete_session(
    session_id: SessionIdPath,
    user_id: CurrentUser,
    context: Annotated[AppContext, Depends(get_context)],
) -> Response:
    # A run started while the session was deleted (a client sending its next turn at once)
    # read what was deleted, and would store its turn after it: deleted again.
    await context.erase_while_runs_start(
        lambda: _delete_session_once(context, user_id, session_id),
        user_id,
        session_id,
        "the session was deleted",
    )
    return Response(status_code=204)


async def _delete_session_once(context: AppContext, user_id: str, session_id: str) -> None:
    # The session's runs in progress are stopped first (else one would store its turn in
    # the session again), then its stored runs go: their events hold its conversation, and
    # a retry after a failure still finds them.
    await context.stop_runs(user_id, session_id)
    runs = context.current.runs
    if runs is not None:
        await runs.delete_session_runs(user_id, session_id)
    state = context.current.state
    if state is not None:
        # Its agent's state (an AgentScope agent's state_dict) holds its conversation too.
        await _delete_agent_state(state, user_id, session_id)
    await context.session_history.delete_session(user_id, session_id)
    if context.idempotency is not None:
        # A replayed request would answer as if the session still were.
        await context.idempotency.delete_session_records(user_id, session_id)
    sandbox = context.current.sandbox
    if sandbox is not None:
        # Its sandboxes' workspaces hold what its agent wrote.
        await sandbox.release_async(session_id, user_id)


async def _delete_agent_state(state: StateService, user_id: str, session_id: str) -> None:
    """Delete the session's agent state; a state service that cannot (one written for
    AgentScope Runtime without ``delete_state``) keeps it, which is logged."""
    try:
        await state.delete_state(user_id, session_id)
    except MethodNotImplementedError as exc:
        logger.warning(
            "the session's agent state is kept: its state service cannot delete it",
            extra={"session_id": session_id, "error": str(exc)},
        )


@router.get(
    "/{session_id}/messages", response_model=Page[Message], summary="Read a session's messages"
)
async def list_messages(
    session_id: SessionIdPath,
    user_id: CurrentUser,
    history: History,
    limit: Limit = 100,
    cursor: Cursor = None,
) -> Page[Message]:
    return await history.list_messages(user_id, session_id, limit=limit, cursor=cursor or None)


@router.post(
    "/{session_id}/messages",
    status_code=201,
    response_model=MessagesOut,
    summary="Append messages to a session",
)
async def append_messages(
    session_id: SessionIdPath,
    body: MessagesIn,
    user_id: CurrentUser,
    history: History,
    request: Request,
) -> MessagesOut:
    refuse_blank_user_messages(body.messages, field="messages")
    refuse_images_no_model_takes(body.messages, field="messages")
    writes_in_session(request, session_id)
    session = Session(id=session_id, user_id=user_id)
    await history.append_new_messages(session, body.messages, field="message")
    return MessagesOut(messages=[m for m in session.messages if isinstance(m, Message)])


__all__ = ["router"]
