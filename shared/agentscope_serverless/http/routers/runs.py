"""Stored runs over HTTP, scoped to the caller's user: status, resume, cancel.

| Method and path | What |
|---|---|
| ``GET /runs?session_id=`` | the runs of a session, oldest first |
| ``GET /runs/{run_id}`` | a run's status (404 when missing or another user's) |
| ``GET /runs/{run_id}/events`` | the run's events as SSE: those stored after ``Last-Event-ID`` |
|  | (or ``?after=``), then the new ones live, until the run ends (on Lambda, or until the |
|  | function's time limit is near: resume then after the last id received); 409 for a |
|  | background task or an A2A task; 406 for an ``Accept`` not taking ``text/event-stream`` |
| ``POST /runs/{run_id}/cancel`` | cancel the run, wherever it executes (202; 409 if it ended, |
|  | or is a background task or an A2A task) |

A run that ended in a session since deleted or expired (``SESSION_TTL_SECONDS``) went with its
conversation: it is 404 to each route, and not listed.

Each event is sent as ``id: <sequence_number>`` and ``data: <event JSON>``, so a client that
loses the stream resumes with ``Last-Event-ID`` set to the last id it received. Both it and
``after`` are decimal digits, after a ``-`` for a number below 0, and at least -1 (-1, or
neither, replays every event); a blank ``Last-Event-ID`` is none.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, Field

from agentscope_serverless.errors import ConflictError, NotFoundError
from agentscope_serverless.http.auth import CurrentUser, KeyedRoute
from agentscope_serverless.http.context import AppContext, get_context
from agentscope_serverless.http.openapi import error_answer
from agentscope_serverless.http.params import EVENTS_ONLY, not_acceptable
from agentscope_serverless.http.sse import EventStreamResponse, encode
from agentscope_serverless.services.runs.base import RunRecord, RunsService
from agentscope_serverless.time_limit import seconds_left

router = APIRouter(prefix="/runs", tags=["runs"], route_class=KeyedRoute)

Context = Annotated[AppContext, Depends(get_context)]
# An event's sequence number as a client sends it back. Python's int() also reads "1_0",
# "+3", " 3 " and digits of other scripts, which no event id is written as.
_SEQUENCE_NUMBER = re.compile(r"-?[0-9]+")


class RunNotFoundError(NotFoundError):
    """No such run for this user."""

    code = "RUN_NOT_FOUND"

    def __init__(self, message: str = "run not found") -> None:
        super().__init__(message)


class RunView(BaseModel):
    """A run's status (a background task's result or error too)."""

    id: str
    session_id: str | None
    kind: str
    status: str
    cancel_requested: bool
    created_at: float
    updated_at: float
    result: Any = None
    error: dict[str, Any] | None = None

    @classmethod
    def of(cls, record: RunRecord) -> RunView:
        return cls.model_validate(record.model_dump(exclude={"user_id", "name"}))


class RunList(BaseModel):
    """The runs of a session."""

    items: list[RunView]


def _runs(context: AppContext) -> RunsService:
    return context.runs


async def read_record(
    context: AppContext, read: Callable[[], Awaitable[RunRecord | None]]
) -> RunRecord | None:
    """The record ``read`` answers, read again after the first write delay when missing."""
    record = await read()
    if record is None and context.recorder is not None:
        # A run just started (by another process) is stored within its first write delay.
        await asyncio.sleep(context.recorder.first_write_delay)
        record = await read()
    return record


async def _found(context: AppContext, read: Callable[[], Awaitable[RunRecord | None]]) -> RunRecord:
    record = await read_record(context, read)
    if record is None:
        raise RunNotFoundError()
    return record


async def _record(context: AppContext, user_id: str, run_id: str) -> RunRecord:
    return await _found(context, lambda: _runs(context).get_run(user_id, run_id))


def _goes_with_its_session(record: RunRecord) -> bool:
    """Whether ``record`` is gone once its session is: a run that ended in a session that
    expired (``SESSION_TTL_SECONDS``; its runs are kept longer) is gone with its
    conversation, as with a deleted session. A run in progress, or an A2A task (stored
    before its run opens its session), is read whatever its session."""
    return record.finished and record.kind != "a2a_task" and record.session_id is not None


async def _readable(context: AppContext, user_id: str, run_id: str) -> RunRecord:
    """The record of a run, unless it went with its session (see
    :func:`_goes_with_its_session`)."""
    record = await _record(context, user_id, run_id)
    if (
        _goes_with_its_session(record)
        and record.session_id is not None
        and not await context.session_history.has_session(user_id, record.session_id)
    ):
        raise RunNotFoundError("the run's session was deleted or has expired")
    return record


def _refuse_a_task(record: RunRecord, *, task: str, a2a_task: str) -> None:
    """Refuse (409, saying ``task`` or ``a2a_task``) a record that is no run of the agent: a
    background task's, or an A2A task's. Only a run has events, and watches for its
    cancellation: following either was an empty stream, cancelling either marked it and
    it went on."""
    if record.kind == "task":
        raise ConflictError(task)
    if record.kind == "a2a_task":
        raise ConflictError(a2a_task)


def _written_as_sequence_number(value: Any) -> Any:
    """``value`` as given; text other than decimal digits (after a ``-`` for a number below
    0) raises ValueError."""
    if isinstance(value, str) and _SEQUENCE_NUMBER.fullmatch(value) is None:
        raise ValueError("must be decimal digits, after a '-' for a number below 0")
    return value


def _blank_as_none(value: Any) -> Any:
    """``value`` as given, but None for blank text (a header sent empty)."""
    if isinstance(value, str) and not value.strip():
        return None
    return value


# An event's sequence number as a client sends it back (``Last-Event-ID``, ``?after=``):
# checked as the request's parameters are, so a bad one is a 422 naming itself. The bound
# is the number's: put on the union (behind the validators), pydantic writes it as ``ge``,
# which is no keyword of JSON Schema.
Position = Annotated[
    Annotated[int, Field(ge=-1)] | None, BeforeValidator(_written_as_sequence_number)
]


def _position(last_event_id: int | None, after: int | None) -> int:
    """The sequence number to send the events after: ``after``'s, else ``Last-Event-ID``'s,
    else -1 (every event)."""
    if after is not None:
        return after
    return -1 if last_event_id is None else last_event_id


@router.get("", summary="List a session's runs")
async def list_runs(
    user_id: CurrentUser,
    context: Context,
    session_id: Annotated[str, Query(min_length=1, max_length=512)],
) -> RunList:
    records = await _runs(context).list_runs(user_id, session_id)
    if any(_goes_with_its_session(record) for record in records) and not (
        await context.session_history.has_session(user_id, session_id)
    ):
        # Listed as each is read (GET /runs/{run_id}): the ended runs of a session that
        # expired went with it.
        records = [record for record in records if not _goes_with_its_session(record)]
    return RunList(items=[RunView.of(record) for record in records])


@router.get("/{run_id}", summary="A run's status")
async def get_run(run_id: str, user_id: CurrentUser, context: Context) -> RunView:
    return RunView.of(await _readable(context, user_id, run_id))


@router.get(
    "/{run_id}/events",
    summary="Replay and follow a run's events",
    response_model=None,
    # Its success is only ever a stream (its errors are JSON, see http.openapi).
    response_class=EventStreamResponse,
    status_code=200,
    responses={
        200: {"description": "The run's events."},
        **error_answer(406, "`Accept` does not take `text/event-stream`."),
    },
)
async def run_events(
    request: Request,
    run_id: str,
    user_id: CurrentUser,
    context: Context,
    last_event_id: Annotated[
        Position,
        BeforeValidator(_blank_as_none),
        Header(alias="Last-Event-ID", description="The last event id received."),
    ] = None,
    after: Annotated[
        Position, Query(description="Send the events after this sequence number.")
    ] = None,
) -> EventStreamResponse:
    refusal = not_acceptable(request.headers.get("accept"), EVENTS_ONLY)
    if refusal is not None:
        raise refusal
    position = _position(last_event_id, after)
    _refuse_a_task(
        await _readable(context, user_id, run_id),
        task=f"a background task has no events: read its status at GET /tasks/{run_id}",
        a2a_task="an A2A task is followed with A2A's SubscribeToTask",
    )
    runs = _runs(context)

    async def chunks() -> AsyncIterator[bytes]:
        async for sequence, data in runs.follow(user_id, run_id, position):
            yield encode(data, id=sequence)

    # On Lambda, the stream ends before the invocation's time limit (its client resumes).
    return EventStreamResponse(
        chunks(), ping_interval=context.settings.sse_ping_interval_seconds, ends_in=seconds_left()
    )


@router.post("/{run_id}/cancel", status_code=202, summary="Cancel a run")
async def cancel_run(run_id: str, user_id: CurrentUser, context: Context) -> JSONResponse:
    _refuse_a_task(
        await _readable(context, user_id, run_id),
        task="a background task cannot be cancelled",
        a2a_task="an A2A task is cancelled with A2A's CancelTask",
    )
    record = await _found(context, lambda: _runs(context).request_cancel(user_id, run_id))
    if record.finished:
        raise ConflictError(f"the run has already ended ({record.status})")
    if context.recorder is not None:
        context.recorder.cancel_local(user_id, run_id)
    return JSONResponse(RunView.of(record).model_dump(mode="json"), status_code=202)


__all__ = ["RunNotFoundError", "read_record", "router"]
