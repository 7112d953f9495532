"""Running the agent: ``POST /process`` and the OpenAI-compatible endpoints.

``/process`` takes an :class:`AgentRequest`; with ``stream`` (the default) it answers with
Server-Sent Events (one ``data: <event JSON>`` per event of the run, CONTRACT §7, and
``: ping`` comments while the agent is silent), otherwise with the final
:class:`AgentResponse` as JSON. The session id (given, or a new uuid) is returned in the
``X-Session-Id`` header too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from agentscope_serverless.errors import (
    InvalidInputError,
    NotFoundError,
    RunNotEndedError,
)
from agentscope_serverless.http import conversations, sdk_retries
from agentscope_serverless.http import openai_compat as compat
from agentscope_serverless.http.auth import (
    CurrentCaller,
    KeyedRoute,
    bearer_scheme,
    get_caller,
    header_text,
    no_other_user,
)
from agentscope_serverless.http.bodies import utf8_request
from agentscope_serverless.http.context import AppContext, get_context
from agentscope_serverless.http.errors import (
    ERROR_CODE_STATE,
    ErrorResponse,
    asks_retry,
    error_body,
    error_response,
    status_of_code,
)
from agentscope_serverless.http.guards import guard_request
from agentscope_serverless.http.idempotency import (
    IDEMPOTENCY_HEADER,
    ends_with_client,
    fails_when,
    seed_run,
    writes_in_session,
)
from agentscope_serverless.http.idempotency import fingerprint as idempotency_fingerprint
from agentscope_serverless.http.openapi import Answers, answers, error_answer
from agentscope_serverless.http.params import (
    ANSWER_TYPES,
    COMPATIBLE_PREFIX,
    RUN_HEADER,
    SESSION_HEADER,
    not_acceptable,
)
from agentscope_serverless.http.routers.runs import read_record
from agentscope_serverless.http.sse import EventStreamResponse, RunEventStream, encode
from agentscope_serverless.metrics import run_metrics
from agentscope_serverless.recorder import RecordedRun, RunRecorder
from agentscope_serverless.runner import for_turn_only
from agentscope_serverless.schemas.agent_schemas import (
    AgentRequest,
    AgentResponse,
    Error,
    Event,
    Message,
    RunStatus,
    with_seeded_ids,
)
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services._once import new_uuid
from agentscope_serverless.services._turn import repeats_earlier_request
from agentscope_serverless.services._validation import (
    clean_session_id,
    new_or_clean_session_id,
    refuse_blank_user_messages,
    refuse_images_no_model_takes,
)
from agentscope_serverless.services.runs.base import RunKind, RunRecord, RunsService
from agentscope_serverless.time_limit import seconds_left

_T = TypeVar("_T")

# When this process started: the ``created`` of the agent as an OpenAI model.
STARTED = int(time.time())

Context = Annotated[AppContext, Depends(get_context)]
# The status logged for a request whose client left before its answer (nginx's).
CLIENT_LEFT = 499
# The request guards, declared on the route itself too so that its direct path (see
# ``_AgentRoute``) runs exactly what FastAPI would (FastAPI solves a dependency once).
Guarded = Annotated[None, Depends(guard_request)]
SessionHeader = Annotated[
    str | None, Header(alias=SESSION_HEADER, description="The session to continue.")
]


_STREAM_OR_JSON: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-Sent Events (`stream: true`) or the JSON object.",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}
_NO_SUCH_RESPONSE = error_answer(404, "No such response of the caller's user.")


@dataclass
class _Call:
    """An OpenAI-compatible call: its run, its session, and the history a new session starts
    with; for a call naming no session, the conversation it sent and the part of it before
    its turn (to find its session again, see :mod:`..conversations`)."""

    run: AgentRequest
    session_id: str
    history: list[Message]
    conversation: list[Message] | None = None
    before: list[Message] | None = None
    # The id of a message the session holds before the turn (what a note names).
    held: str | None = None


async def _compatible_run(
    context: AppContext,
    messages: list[Message],
    session_id: str | None,
    user_id: str,
    **options: Any,
) -> _Call:
    """The run of an OpenAI-compatible call, in its session: the one given, else the one of
    the conversation the call continues, else a new one.

    Only the messages after the last assistant message are new input (see
    :func:`compat.split_turn` for a conversation that ends with one): clients resend the
    whole conversation with each call. With a given session, the earlier ones are in its
    history already, as in the session of the conversation they continue. Otherwise they
    are the new session's history, stored but not given to memory again: the call that sent
    them new gave them; so are they when the given session does not exist (yet, or any
    more: its history expired), else the agent would answer without the conversation.
    Messages for the turn alone (``instructions``) stay its input.
    """
    given = clean_session_id(session_id)
    history, turn = compat.split_turn(messages)
    if given is not None:
        run = _run_request(context, input=turn, session_id=given, user_id=user_id, **options)
        new = bool(history) and not await context.session_history.has_session(user_id, given)
        return _Call(run, given, history if new else [])
    shown = [*history, *(m for m in turn if not for_turn_only(m))]
    resumed = await conversations.resumed(context, user_id, history)
    # The message a note of the conversation before the turn names (the new session's
    # history is stored with the ids of its messages).
    held = resumed[1] if resumed else (history[-1].id if history else None)
    session = resumed[0] if resumed else new_uuid()
    run = _run_request(context, input=turn, session_id=session, user_id=user_id, **options)
    return _Call(run, session, [] if resumed else history, shown, history, held)


def _run_request(context: AppContext, **fields: Any) -> AgentRequest:
    """A run's request as the app's request model (see :meth:`AgentApp.run_request`)."""
    app = context.agent_app
    return AgentRequest(**fields) if app is None else app.run_request(**fields)


def _cancel_on_disconnect(body: BaseModel) -> bool | None:
    """What the request's ``cancel_on_disconnect`` says (None: nothing); a value other than
    a boolean is refused, not taken for what Python makes of it ("false" is true)."""
    value = (body.model_extra or {}).get("cancel_on_disconnect")
    if value is not None and not isinstance(value, bool):
        raise InvalidInputError(
            "cancel_on_disconnect must be true or false", field="cancel_on_disconnect"
        )
    return value


def _header_session_id(request: Request) -> str | None:
    """The session the ``X-Session-Id`` header names; given more than once, refused (which
    one wins differs between proxies and frameworks)."""
    values = request.headers.getlist(SESSION_HEADER)
    if len(values) > 1:
        raise InvalidInputError(
            f"the {SESSION_HEADER} header is given more than once", field=SESSION_HEADER
        )
    return header_text(values[0], name=SESSION_HEADER) if values else None


def _session_headers(session_id: str, run_id: str | None = None) -> dict[str, str]:
    # Header values must be printable ASCII; other ids are still in the body.
    safe = session_id.isascii() and session_id.isprintable()
    headers = {SESSION_HEADER: session_id} if safe else {}
    if run_id:
        headers[RUN_HEADER] = run_id
    return headers


async def _recorded(
    context: AppContext,
    request: Request,
    run: AgentRequest,
    *,
    kind: RunKind,
    cancel_on_disconnect: bool = False,
    fingerprint: str | None = None,
    input_seed: str | None = None,
    echo: dict[str, Any] | None = None,
) -> RecordedRun:
    """The run of ``run`` started, recorded in the runs store (see :mod:`..recorder`), or
    streamed without storing when runs are not stored (``RUNS_BACKEND=none``)."""
    assert run.user_id is not None
    if run.session_id is not None:
        writes_in_session(request, run.session_id)
    await seed_run(request, context.recorder.runs if context.recorder is not None else None)
    events = context.require_runner().stream_query(run)
    recorder = context.recorder or RunRecorder(
        None, metrics=run_metrics(context.settings.metrics_namespace)
    )
    return await recorder.start(
        events,
        user_id=run.user_id,
        kind=kind,
        cancel_on_disconnect=cancel_on_disconnect,
        session_id=run.session_id,
        fingerprint=fingerprint,
        input_seed=input_seed,
        echo=echo,
    )


@dataclass(frozen=True)
class _Turn:
    """The run answering an OpenAI-compatible call: started for it, or (for an SDK's retry)
    the one its first try started."""

    run_id: str
    session_id: str
    events: AsyncIterator[Event]
    # The run started for the call (None for a retry's).
    recorded: RecordedRun | None = None

    async def answer(self, request: Request, made: Coroutine[Any, Any, _T]) -> _T | None:
        """The answer ``made`` of the run's events, or None when the client left first."""
        return await _unless_client_leaves(self.recorded, made, request)


async def _last_response(events: AsyncIterator[Event]) -> AgentResponse:
    """The last of a run's events: its final response."""
    last: Event | None = None
    async for event in events:
        last = event
    if not isinstance(last, AgentResponse):  # the run was deleted as it was read
        raise NotFoundError("the run of this request is gone")
    return last


async def _openai_turn(
    context: AppContext,
    request: Request,
    call: _Call,
    echo: dict[str, Any] | None = None,
    *,
    cancel_on_disconnect: bool = False,
) -> _Turn:
    """The run of an OpenAI-compatible call, started unless the call is an SDK's retry of a
    request that started one (see :mod:`..sdk_retries`); ``echo`` is kept with its record.
    A new session gets the call's history first."""
    run, session_id = call.run, call.session_id
    assert run.user_id is not None
    fingerprint = idempotency_fingerprint(request, await request.body())
    runs = context.recorder.runs if context.recorder is not None else None
    earlier = await sdk_retries.earlier_run(runs, request, run.user_id, fingerprint)
    original = sdk_retries.original_run(earlier)
    if runs is not None and original is not None:
        # On Lambda, followed until the invocation's time ends (the run goes on elsewhere).
        events = sdk_retries.stored_events(runs, run.user_id, original.id, ends_in=seconds_left())
        session_id = original.session_id or session_id
        run = _seeded(run, original.input_seed)
        retried = dataclasses.replace(call, run=run, session_id=session_id)
        return _Turn(original.id, session_id, _noted(context, retried, events))
    seed = sdk_retries.input_seed(request, earlier)
    again = earlier is not None and seed == earlier.input_seed
    if again and earlier is not None and await _moves_to(context, earlier, session_id):
        # A retry running again after its try stopped goes on in that try's session (which
        # holds the conversation, and maybe the input), not in one of its own.
        session_id = earlier.session_id or session_id
        run = run.model_copy(update={"session_id": session_id})
        call = dataclasses.replace(call, run=run, session_id=session_id, history=[])
    if call.history:
        session = Session(id=session_id, user_id=run.user_id)
        await context.session_history.append_message(session, call.history)
    if cancel_on_disconnect:
        ends_with_client(request)
    if again:
        repeats_earlier_request()  # whose run may have stored the input
    run = _seeded(run, seed)
    recorded = await _recorded(
        context,
        request,
        run,
        kind="openai",
        cancel_on_disconnect=cancel_on_disconnect,
        fingerprint=fingerprint,
        input_seed=seed,
        echo=echo,
    )
    # Its answer is a 200 however the run ends (a failed response, as OpenAI's).
    fails_when(request, lambda: _failed_worth_retry(recorded))
    noted = _noted(context, dataclasses.replace(call, run=run), recorded.events(), recorded.final)
    return _Turn(recorded.run_id, session_id, noted, recorded)


async def _moves_to(context: AppContext, earlier: RunRecord, session_id: str) -> bool:
    """Whether a retry that runs again goes on in the session of its ``earlier`` try rather
    than in ``session_id`` (a new one, for a call naming none): when that session is
    another, and is still there."""
    user_id, earlier_session = earlier.user_id, earlier.session_id
    if not earlier_session or earlier_session == session_id:
        return False
    return await context.session_history.has_session(user_id, earlier_session)


def _seeded(run: AgentRequest, seed: str | None) -> AgentRequest:
    """``run`` with the ids its input is stored with: seeded by ``seed``, else its own."""
    if seed is None:
        return run
    return run.model_copy(update={"input": with_seeded_ids(run.input, seed)})


def _noted(
    context: AppContext,
    call: _Call,
    events: AsyncIterator[Event],
    ended: Callable[[], Awaitable[AgentResponse]] | None = None,
) -> AsyncIterator[Event]:
    """The run's events, noting a conversation of a call naming no session as it ends (as
    ``ended`` tells, when the client leaves first)."""
    if call.conversation is None:
        return events
    assert call.run.user_id is not None
    asked = next((m.id for m in reversed(call.run.input) if not for_turn_only(m)), None)
    return conversations.noted(
        events,
        context,
        call.run.user_id,
        call.session_id,
        call.conversation,
        call.before,
        call.held,
        asked,
        ended,
    )


async def _final(run: RecordedRun, request: Request) -> AgentResponse | None:
    """The run's final event, or None when the client left first: a run that ends with its
    client (``cancel_on_disconnect``, or not stored) is then cancelled."""
    return await _unless_client_leaves(run, run.final(), request)


async def _unless_client_leaves(
    run: RecordedRun | None, answer: Coroutine[Any, Any, _T], request: Request
) -> _T | None:
    """``answer`` (read from ``run``), or None when the client left first: a run that ends
    with its client (``cancel_on_disconnect``, or not stored) is then cancelled."""
    if run is None or not run.cancel_on_disconnect:
        return await answer
    final = asyncio.ensure_future(answer)
    leaving: asyncio.Future[Any] | None = None
    try:
        while True:
            # The body was read: the next message is the client leaving.
            leaving = asyncio.ensure_future(request.receive())
            await asyncio.wait((final, leaving), return_when=asyncio.FIRST_COMPLETED)
            if final.done():
                return final.result()
            if leaving.result().get("type") == "http.disconnect":
                return None
    finally:
        if leaving is not None:
            leaving.cancel()
        final.cancel()  # when the client left: the run's reader detaches, cancelling it


def _failed_worth_retry(run: RecordedRun) -> bool:
    """Whether ``run`` ended with an error the answer not streamed asks a retry for: a 5xx
    (its store did not answer, its time ran out...), a 429 (the sandbox server is at
    capacity), any error saying when to retry."""
    error = run.error
    if error is None:
        return False
    return error.retry_after is not None or asks_retry(status_of_code(error.code))


def _retry_after(error: Error | None, headers: dict[str, str]) -> dict[str, str]:
    """``headers`` with ``Retry-After`` when ``error`` says when to retry."""
    if error is not None and error.retry_after is not None:
        headers["Retry-After"] = str(error.retry_after)
    return headers


def _failure(response: AgentResponse, headers: dict[str, str]) -> JSONResponse:
    """The error answer of a chat completion whose run failed or was canceled, with
    ``headers`` (its run's and session's ids, which a client quotes or reads the run by).

    A failed run answers with its error, as its stream and ``/process`` show it (its message
    is the agent's, secrets taken out), not the generic 500 of a server fault. OpenAI's SDKs
    retry a 409 and a 5xx, and a retry would find the failed run and answer with it again:
    ``X-Should-Retry: false`` tells them not to, unless the run failed as unavailable (a 503:
    its store did not answer), when a retry runs again (see :mod:`..sdk_retries`), its input
    stored once, and may well succeed.
    """
    if response.error is None:
        assert response.status == RunStatus.Canceled
        error, status = compat.RUN_CANCELED, 409
        answer = error_response(status, error.code, error.message)
    else:
        error = response.error
        status = status_of_code(error.code)
        answer = ErrorResponse(error_body(error.code, error.message, status=status), status)
    answer.headers.update(_retry_after(response.error, headers))
    if status != 503:
        answer.headers["X-Should-Retry"] = "false"
    return answer


def _run_goes_on(exc: sdk_retries.FollowCutError, headers: dict[str, str]) -> ErrorResponse:
    """The answer not streamed of an SDK's retry whose invocation's time ended before the
    run it follows: a 504 ``TIME_LIMIT`` the SDK retries (the run goes on elsewhere)."""
    answer = ErrorResponse(error_body(exc.code, exc.message, status=504), 504, headers)
    answer.headers["X-Should-Retry"] = "true"
    return answer


async def _ending_if_cut(
    chunks: AsyncIterator[bytes], ending: Callable[[sdk_retries.FollowCutError], bytes]
) -> AsyncIterator[bytes]:
    """``chunks``, ended by ``ending`` when the run they follow outlasts the invocation."""
    try:
        async for chunk in chunks:
            yield chunk
    except sdk_retries.FollowCutError as exc:
        yield ending(exc)


def _cut_chat_line(exc: sdk_retries.FollowCutError) -> bytes:
    """The line ending a retry's chat completion stream cut at the time limit: an error,
    as a failed run's (the SDK raises it; a chat completion is not read again)."""
    return encode(json.dumps(error_body(exc.code, exc.message, status=504)))


def _cut_responses_event(exc: sdk_retries.FollowCutError, turn: _Turn) -> bytes:
    """The event ending a retry's responses stream cut at the time limit: an ``error``
    saying where to read on (as ``GET .../responses/{id}?stream=true`` resumes)."""
    answer = AgentResponse(id=turn.run_id)
    resume = (
        f"GET {COMPATIBLE_PREFIX}/responses/{compat.response_id(answer, turn.session_id)}"
        "?stream=true&starting_after=<the last sequence_number received>"
    )
    message = (
        "this invocation's time ran out before the response ended; it goes on: read on "
        f"with {resume}"
    )
    payload = {"type": "error", "code": exc.code, "message": message, "param": None}
    return encode(json.dumps(payload), event="error")


def _with_body_model(endpoint: Callable[..., Any], model: type[AgentRequest]) -> None:
    """Validate ``endpoint``'s ``body`` parameter with ``model`` (an AgentRequest subclass)."""
    signature = inspect.signature(endpoint)
    parameters = [
        p.replace(annotation=model) if p.name == "body" else p
        for p in signature.parameters.values()
    ]
    endpoint.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]


class _AgentRoute(KeyedRoute):
    """The agent's route, whose common case skips FastAPI's per-request dependency solving.

    A request without ``Idempotency-Key`` (whose claim must come before the body's message
    ids are made) is authenticated first; when its JSON body is a valid request, it is then
    guarded and run by direct calls of the very dependencies the route declares; anything
    else is handled by FastAPI as declared, so every other error answer is FastAPI's own.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        declared = super().get_route_handler()
        endpoint = self.endpoint
        model = inspect.signature(endpoint).parameters["body"].annotation

        async def handle(request: Request) -> Response:
            request = utf8_request(request)
            refusal = not_acceptable(request.headers.get("accept"), ANSWER_TYPES)
            if refusal is not None:
                # After the key, as every other refusal: a caller without one gets a 401.
                await get_caller(request, await bearer_scheme(request))
                raise refusal
            if IDEMPOTENCY_HEADER in request.headers:
                return await declared(request)
            # Before the body is read: validating a large one costs more than parsing it,
            # and a caller without a key gets nothing of that work.
            caller = await get_caller(request, await bearer_scheme(request))
            body = await _valid_body(request, model)
            if body is None:
                return await declared(request)
            await guard_request(request, caller, None)
            response: Response = await endpoint(body, caller, request.app.state.context, request)
            return response

        return handle


async def _valid_body(request: Request, model: type[AgentRequest]) -> AgentRequest | None:
    """The request's body as ``model`` when it is JSON that validates, else None."""
    content_type = request.headers.get("content-type", "")
    if content_type.partition(";")[0].strip().lower() != "application/json":
        return None
    try:
        return model.model_validate(await request.json())
    except (ValueError, ValidationError):
        return None


def build_router(
    endpoint_path: str = "/process", request_model: type[AgentRequest] = AgentRequest
) -> APIRouter:
    """The process router: ``endpoint_path`` and the two OpenAI-compatible endpoints."""
    router = APIRouter(tags=["agent"], route_class=KeyedRoute)

    async def process(
        body: AgentRequest,
        caller: CurrentCaller,
        context: Context,
        request: Request,
        _: Guarded = None,
    ) -> Response:
        refuse_blank_user_messages(body.input, field="input")
        refuse_images_no_model_takes(body.input, field="input")
        user_id = caller.user_id(body.user_id)
        session_id = new_or_clean_session_id(body.session_id)
        run = body.model_copy(update={"user_id": user_id, "session_id": session_id})
        cancel_on_disconnect = _cancel_on_disconnect(body) is True
        if cancel_on_disconnect:
            ends_with_client(request)
        recorded = await _recorded(
            context, request, run, kind="process", cancel_on_disconnect=cancel_on_disconnect
        )
        headers = _session_headers(session_id, recorded.run_id)
        if not body.stream:
            final = await _final(recorded, request)
            if final is None:
                return Response(status_code=CLIENT_LEFT)
            status = 200
            if final.error is not None:
                status = status_of_code(final.error.code)
                # For the request's log line and its metric, as an error's answer leaves it.
                request.scope.setdefault("state", {})[ERROR_CODE_STATE] = final.error.code
            return Response(
                final.model_dump_json(),
                status_code=status,
                media_type="application/json",
                headers=_retry_after(final.error, headers),
            )
        fails_when(request, lambda: _failed_worth_retry(recorded))
        return RunEventStream(
            recorded, ping_interval=context.settings.sse_ping_interval_seconds, headers=headers
        )

    _with_body_model(process, request_model)
    router.add_api_route(
        endpoint_path,
        process,
        route_class_override=_AgentRoute,
        methods=["POST"],
        response_model=None,
        summary="Run the agent",
        description=(
            "Streams the run as Server-Sent Events (`stream: true`, the default) or returns "
            "the final AgentResponse (`stream: false`)."
        ),
        responses={
            200: {
                "description": "The run's events (text/event-stream) or the final response.",
                "model": AgentResponse,
                "content": {"text/event-stream": {}},
            },
            **error_answer(406),
            **error_answer(429),
        },
        openapi_extra=answers(Answers.RUN, Answers.FAILED_RUN),
    )

    @router.post(
        f"{COMPATIBLE_PREFIX}/chat/completions",
        summary="OpenAI chat completions",
        responses={**_STREAM_OR_JSON, **error_answer(429)},
        openapi_extra=answers(Answers.RUN, Answers.FAILED_RUN, Answers.FAILED_RUN_NOT_RETRIED),
    )
    async def chat_completions(
        body: compat.ChatCompletionRequest,
        caller: CurrentCaller,
        context: Context,
        request: Request,
        x_session_id: SessionHeader = None,
    ) -> Response:
        compat.check_chat_request(body)
        # A client closing its stream stops the run, as OpenAI's: nothing reads a chat
        # completion again (unless the request says "cancel_on_disconnect": false). One not
        # streamed goes on: an SDK's retry after a timeout gets its answer.
        said = _cancel_on_disconnect(body)
        cancel = body.stream and said is not False
        # The name the client gave its limit, for an agent calling a model to give it so.
        named_limit = {}
        if body.max_tokens is None and body.max_completion_tokens is not None:
            named_limit["max_completion_tokens"] = body.max_completion_tokens
        call = await _compatible_run(
            context,
            compat.chat_messages(body.messages),
            compat.session_id_of(_header_session_id(request), body.metadata, field=body.session_id),
            caller.user_id(body.user),
            stream=body.stream,
            model=body.model,
            temperature=body.temperature,
            top_p=body.top_p,
            max_tokens=body.max_tokens or body.max_completion_tokens,
            **named_limit,
            seed=body.seed,
            stop=body.stop,
            frequency_penalty=body.frequency_penalty,
            presence_penalty=body.presence_penalty,
        )
        turn = await _openai_turn(context, request, call, cancel_on_disconnect=cancel)
        headers = _session_headers(turn.session_id, turn.run_id)
        if not body.stream:
            try:
                final = await turn.answer(request, _last_response(turn.events))
            except sdk_retries.FollowCutError as exc:
                return _run_goes_on(exc, headers)
            if final is None:
                return Response(status_code=CLIENT_LEFT)
            if final.status != RunStatus.Completed:
                return _failure(final, headers)
            return JSONResponse(compat.chat_completion(final, model=body.model), headers=headers)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chunks = compat.chat_completion_chunks(
            turn.events, model=body.model, include_usage=include_usage
        )
        return EventStreamResponse(
            _ending_if_cut(chunks, _cut_chat_line),
            ping_interval=context.settings.sse_ping_interval_seconds,
            headers=headers,
        )

    @router.post(
        f"{COMPATIBLE_PREFIX}/responses",
        summary="OpenAI responses",
        responses=_STREAM_OR_JSON,
        openapi_extra=answers(Answers.RUN),
    )
    async def responses(
        body: compat.ResponsesRequest,
        caller: CurrentCaller,
        context: Context,
        request: Request,
        x_session_id: SessionHeader = None,
    ) -> Response:
        compat.check_responses_request(body)
        named = compat.session_id_of(
            _header_session_id(request),
            body.metadata,
            body.conversation,
            field=body.session_id,
        )
        user_id = caller.user_id(body.user)
        session_id = named
        branched: list[Message] = []
        if body.previous_response_id is not None:
            await _refuse_deleted(
                context, user_id, body.previous_response_id, continued=named is None
            )
            if named is None:
                session_id, branched = await conversations.continued(
                    context, user_id, body.previous_response_id
                )
            else:
                await conversations.refuse_in_progress(context, user_id, body.previous_response_id)
        call = await _compatible_run(
            context,
            compat.responses_input(body),
            session_id,
            user_id,
            stream=body.stream,
            model=body.model,
            temperature=body.temperature,
            top_p=body.top_p,
            max_tokens=body.max_output_tokens,
        )
        echo = compat.responses_echo(body)
        # A response is read again from what its run keeps of the request (store: false
        # keeps nothing: it is not read again).
        kept = None
        if body.store is not False:
            kept = {"model": body.model, **echo, "input": compat.responses_input_items(body)}
        call.history = branched or call.history  # a branch starts with its conversation
        turn = await _openai_turn(context, request, call, kept)
        if turn.recorded is not None:  # a retry's run was noted by its first try
            noted = conversations.responded(
                turn.events, context, user_id, turn.session_id, turn.run_id
            )
            turn = dataclasses.replace(turn, events=noted)
        headers = _session_headers(turn.session_id, turn.run_id)
        shape: dict[str, Any] = {"model": body.model, "session_id": turn.session_id, "echo": echo}
        if not body.stream:
            # A failed run is a 200 with a ``failed`` response and its error, as OpenAI's.
            try:
                payload = await turn.answer(request, compat.responses_final(turn.events, **shape))
            except sdk_retries.FollowCutError as exc:
                return _run_goes_on(exc, headers)
            if payload is None:
                return Response(status_code=CLIENT_LEFT)
            return JSONResponse(payload, headers=headers)
        return EventStreamResponse(
            _ending_if_cut(
                compat.responses_events(turn.events, **shape),
                lambda exc: _cut_responses_event(exc, turn),
            ),
            ping_interval=context.settings.sse_ping_interval_seconds,
            headers=headers,
        )

    @router.get(
        f"{COMPATIBLE_PREFIX}/responses/{{response_id}}",
        summary="OpenAI response, read again",
        responses={
            200: {
                "description": "The response (JSON), or its events (`stream=true`).",
                "content": {"application/json": {}, "text/event-stream": {}},
            },
            **_NO_SUCH_RESPONSE,
        },
        openapi_extra=answers(Answers.RUN),
    )
    async def get_response(
        response_id: str,
        caller: CurrentCaller,
        context: Context,
        stream: Annotated[
            bool, Query(description="Its events, followed until it ends (the SDKs' resume).")
        ] = False,
        starting_after: Annotated[
            int, Query(description="Stream the events after this sequence number.")
        ] = -1,
    ) -> Response:
        user_id = caller.user_id()
        runs, record = await _stored_response(context, user_id, response_id)
        run_id, session_id = record.id, record.session_id or ""
        assert record.echo is not None
        shape = {"model": str(record.echo.get("model", "")), "session_id": session_id}
        headers = _session_headers(session_id, run_id)
        if stream:
            # On Lambda, it ends before the function's time limit: read on after its last.
            events = sdk_retries.stored_events(runs, user_id, run_id)
            return EventStreamResponse(
                compat.responses_events(
                    events, **shape, echo=record.echo, starting_after=starting_after
                ),
                ping_interval=context.settings.sse_ping_interval_seconds,
                headers=headers,
                ends_in=seconds_left(),
            )
        # A run still going is read as stored so far (the response in progress).
        events = sdk_retries.stored_events(runs, user_id, run_id, follow=record.finished)
        payload = await compat.responses_final(events, **shape, echo=record.echo)
        return JSONResponse(payload, headers=headers)

    @router.post(
        f"{COMPATIBLE_PREFIX}/responses/{{response_id}}/cancel",
        summary="OpenAI response, cancelled",
        responses=_NO_SUCH_RESPONSE,
        openapi_extra=answers(Answers.RUN),
    )
    async def cancel_response(
        response_id: str, caller: CurrentCaller, context: Context
    ) -> JSONResponse:
        """Cancel the response's run (it goes on when its client leaves), wherever it
        executes, and answer the response as the run ended: ``cancelled``, or as it was
        when it had ended already."""
        user_id = caller.user_id()
        runs, record = await _stored_response(context, user_id, response_id)
        assert record.echo is not None and context.recorder is not None
        if not record.finished:
            await runs.request_cancel(user_id, record.id)
            context.recorder.cancel_local(user_id, record.id)
        session_id = record.session_id or ""
        payload = await compat.responses_final(
            sdk_retries.stored_events(runs, user_id, record.id),
            model=str(record.echo.get("model", "")),
            session_id=session_id,
            echo=record.echo,
        )
        return JSONResponse(payload, headers=_session_headers(session_id, record.id))

    @router.delete(
        f"{COMPATIBLE_PREFIX}/responses/{{response_id}}",
        summary="OpenAI response, deleted",
        responses={
            **_NO_SUCH_RESPONSE,
            **error_answer(
                409, "The response is still in progress: cancel it, or wait for its end."
            ),
        },
    )
    async def delete_response(
        response_id: str, caller: CurrentCaller, context: Context
    ) -> dict[str, Any]:
        """Delete a response that has ended (its run and its events): it is read no more,
        and a later ``previous_response_id`` naming it is refused. Its turn stays in its
        session (``DELETE /sessions/{id}`` deletes that)."""
        user_id = caller.user_id()
        runs, record = await _stored_response(context, user_id, response_id)
        deleted = await runs.delete_run(user_id, record.id)
        if deleted is None:
            raise compat.ResponseNotFoundError(response_id)
        if not deleted.finished:
            raise RunNotEndedError(
                "the response is still in progress: cancel it (responses.cancel) or wait for "
                "its end before deleting it"
            )
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    @router.get(
        f"{COMPATIBLE_PREFIX}/responses/{{response_id}}/input_items",
        summary="OpenAI response's input items",
        responses=_NO_SUCH_RESPONSE,
    )
    async def list_input_items(
        response_id: str,
        caller: CurrentCaller,
        context: Context,
        limit: Annotated[int, Query(ge=1, le=100, description="Items per page.")] = 20,
        order: Annotated[
            Literal["asc", "desc"], Query(description="``desc``: the last item first.")
        ] = "desc",
        after: Annotated[
            str | None,
            Query(
                max_length=compat.MAX_ITEM_ID_LENGTH,
                description="The id of the item to list after.",
            ),
        ] = None,
    ) -> dict[str, Any]:
        """The items of the response's input (as its request gave them, each with an id), a
        page at a time, as OpenAI's ``input_items`` lists them."""
        _, record = await _stored_response(context, caller.user_id(), response_id)
        assert record.echo is not None
        items = list(record.echo.get("input") or [])
        if order == "desc":
            items.reverse()
        if after is not None:
            items = compat.input_items_after(items, after)
        page = items[:limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }

    # Chat clients (Open WebUI, LibreChat...) list models when connecting: the agent is one,
    # named after its app (the chat routes answer whatever model a request names).
    @router.get(f"{COMPATIBLE_PREFIX}/models", summary="OpenAI models: the agent")
    async def list_models(caller: CurrentCaller, context: Context) -> dict[str, Any]:
        no_other_user(caller)
        return {"object": "list", "data": [_model(context)]}

    @router.get(f"{COMPATIBLE_PREFIX}/models/{{model}}", summary="OpenAI model: the agent")
    async def get_model(model: str, caller: CurrentCaller, context: Context) -> dict[str, Any]:
        no_other_user(caller)
        described = _model(context)
        if model != described["id"]:
            raise NotFoundError(f"no model {model!r}: this server's model is {described['id']!r}")
        return described

    return router


async def _stored_response(
    context: AppContext, user_id: str, response_id: str
) -> tuple[RunsService, RunRecord]:
    """The runs store and the record of the run of a response of ``user_id`` (404 when it
    is none: not stored, made with ``store: false``, or a chat completion's)."""
    runs = context.recorder.runs if context.recorder is not None else None
    if runs is None:
        raise compat.ResponseNotFoundError(
            response_id, "responses are not kept: this server stores no runs"
        )
    found = compat.run_of_response(response_id)
    record = None
    if found is not None:
        record = await read_record(context, lambda: runs.get_run(user_id, found[0]))
    # A chat completion's run keeps no echo: its id is no response's.
    if found is None or record is None or record.echo is None:
        raise compat.ResponseNotFoundError(response_id)
    if record.session_id != found[1]:
        raise compat.ResponseNotFoundError(response_id)
    # Its runs are kept longer than a session that expired (SESSION_TTL_SECONDS): the
    # conversation goes with the session.
    if not await context.session_history.has_session(user_id, record.session_id):
        raise compat.ResponseNotFoundError(
            response_id, "the response's session was deleted or has expired"
        )
    return runs, record


async def _refuse_deleted(
    context: AppContext, user_id: str, response_id: str, *, continued: bool
) -> None:
    """Refuse (404) a ``previous_response_id`` naming a response its user deleted (any
    other names its session: see :func:`compat.session_id_of`), or, when the call
    ``continued`` its session, one whose session was deleted: the turn would start a session
    of the same id holding none of the conversation it continues."""
    runs = context.recorder.runs if context.recorder is not None else None
    found = compat.run_of_response(response_id)
    if runs is not None and found is not None and await runs.was_deleted(user_id, found[0]):
        raise compat.ResponseNotFoundError(
            response_id, "previous_response_id names a response that was deleted"
        )
    session = compat.session_of_response(response_id) if continued else None
    if session is not None and not await context.session_history.has_session(user_id, session):
        raise compat.ResponseNotFoundError(
            response_id,
            "previous_response_id names a response whose session this user does not have "
            "(it was deleted, or is another user's)",
        )
    if runs is not None and found is not None:
        # Its run goes with its session: gone, the session of that id (made again since)
        # holds none of its conversation. An id naming another session than its run's is
        # no response's (as a read of it says).
        record = await read_record(context, lambda: runs.get_run(user_id, found[0]))
        if (record is None and continued) or (record is not None and record.session_id != found[1]):
            raise compat.ResponseNotFoundError(response_id)


def _model(context: AppContext) -> dict[str, Any]:
    """The agent as an OpenAI model object."""
    app = context.agent_app
    name = app.app_name if app is not None and app.app_name else "agent"
    return {"id": name, "object": "model", "created": STARTED, "owned_by": "agentscope-serverless"}


__all__ = ["COMPATIBLE_PREFIX", "RUN_HEADER", "SESSION_HEADER", "build_router"]
