"""Agent state over HTTP, scoped to the caller's user.

| Method and path | What |
|---|---|
| ``POST /state/{session_id}`` | save a state (the next round, or ``round_id``) |
| ``GET /state/{session_id}?round_id=`` | a saved state (the latest round by default) |
| ``GET /state/{session_id}/rounds`` | the saved rounds |
| ``DELETE /state/{session_id}`` | delete every round of the session's state |
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, Field

from agentscope_serverless.errors import NotFoundError
from agentscope_serverless.http.auth import CurrentUser, KeyedRoute
from agentscope_serverless.http.context import AppContext, get_context
from agentscope_serverless.http.idempotency import kept_while, writes_in_session
from agentscope_serverless.http.params import RequestBody, SessionIdPath
from agentscope_serverless.services.agent_state.base import MAX_ROUND_ID, StateService

router = APIRouter(prefix="/state", tags=["state"], route_class=KeyedRoute)


async def _state(context: Annotated[AppContext, Depends(get_context)]) -> StateService:
    service = context.state
    return service


State = Annotated[StateService, Depends(_state)]


class StateSave(RequestBody):
    """A state to save; with ``round_id`` that round is overwritten."""

    state: dict[str, Any]
    # Strict: ``true`` would be read as round 1, and overwrite it.
    round_id: int | None = Field(None, ge=1, le=MAX_ROUND_ID, strict=True)


class StateSaved(BaseModel):
    """Where a state was saved."""

    session_id: str
    round_id: int


class StateOut(BaseModel):
    """A saved state and its round."""

    session_id: str
    round_id: int | None = Field(
        description="The state's round; null when the state service cannot tell which round "
        "is the latest (one written for AgentScope Runtime, whose export_state() gives the "
        "state only)."
    )
    state: dict[str, Any]


class Rounds(BaseModel):
    """The saved rounds of a session, ascending."""

    session_id: str
    rounds: list[int]


async def _has_state(request: Request, user_id: str, session_id: str) -> bool:
    """Whether the session still has a saved state: a keyed save's answer is replayed only
    then (its session deleted, or its state, or expired, the save runs anew)."""
    state: StateService = request.app.state.context.state
    return await state.export_latest_state(user_id, session_id) is not None


@router.post("/{session_id}", status_code=201, response_model=StateSaved, summary="Save state")
@kept_while(_has_state)
async def save_state(
    session_id: SessionIdPath, body: StateSave, user_id: CurrentUser, state: State, request: Request
) -> StateSaved:
    # Its kept answer goes with the session (DELETE /sessions/{id} forgets it).
    writes_in_session(request, session_id)
    round_id = await state.save_state(
        user_id, body.state, session_id=session_id, round_id=body.round_id
    )
    return StateSaved(session_id=session_id, round_id=round_id)


@router.get("/{session_id}", response_model=StateOut, summary="Export state")
async def export_state(
    session_id: SessionIdPath,
    user_id: CurrentUser,
    state: State,
    round_id: Annotated[
        int | None, Query(ge=1, le=MAX_ROUND_ID, description="Default: the latest.")
    ] = None,
) -> StateOut:
    if round_id is None:
        latest = await state.export_latest_state(user_id, session_id)
        if latest is None:
            raise NotFoundError(f"no saved state for session {session_id!r}")
        return StateOut(session_id=session_id, round_id=latest[0], state=latest[1])
    saved = await state.export_state(user_id, session_id, round_id)
    if saved is None:
        raise NotFoundError(f"no saved state for session {session_id!r} in round {round_id}")
    return StateOut(session_id=session_id, round_id=round_id, state=saved)


@router.get("/{session_id}/rounds", response_model=Rounds, summary="List saved rounds")
async def list_rounds(session_id: SessionIdPath, user_id: CurrentUser, state: State) -> Rounds:
    return Rounds(session_id=session_id, rounds=await state.list_rounds(user_id, session_id))


@router.delete("/{session_id}", status_code=204, summary="Delete state")
async def delete_state(session_id: SessionIdPath, user_id: CurrentUser, state: State) -> Response:
    await state.delete_state(user_id, session_id)
    return Response(status_code=204)


__all__ = ["router"]
