"""The ``a2a-sdk``'s routes for our agent, each authenticated like every other route.

The SDK's routes are plain Starlette endpoints; each is wrapped so the caller is authenticated
first (401 without a key), the request passes the checks every route runs (a body sent as JSON,
else a 415; valid Unicode and finite numbers in the body, ``Idempotency-Key``: on the JSON-RPC
route, a body they refuse is a JSON-RPC error, a parse error for one that cannot be read; an A2A
0.3 call with params its method cannot take, or a ``historyLength`` beyond 32 bits, is invalid
params, as in A2A 1.0; one without an id, of either version, or a body that is no JSON-RPC
request, is an invalid request saying why; a 0.3 call whose ``A2A-Version`` names another
version is not supported (-32009), as in A2A 1.0; params a 1.0 method cannot read are logged as
a warning, not a server error), and the A2A call context carries the user it acts as, which
scopes the tasks. On the JSON-RPC route, an ``Idempotency-Key`` is freed by an answer that is a
JSON-RPC error, a retry is the same call whatever its id and its answer carries its own, and the
key reused for another call, held by a call still under way or not claimable (its store down) is
a JSON-RPC error with the call's id. Every stream is sent as every other stream is (a server
told to stop waits for it; a run the stop cancels ends it with its canceled status), and writes
U+2028, U+2029 and U+0085 as JSON escapes; an HTTP+JSON stream failing before its first event
is the binding's error answer. Imported on the first A2A request (see
:mod:`agentscope_serverless.http.routers.a2a`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

from a2a.auth.user import User
from a2a.server.context import ServerCallContext
from a2a.server.routes import (
    DefaultServerCallContextBuilder,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.utils.constants import PROTOCOL_VERSION_0_3
from a2a.utils.error_handlers import build_rest_error_payload
from a2a.utils.errors import JSON_RPC_ERROR_CODE_MAP, VersionNotSupportedError
from a2a.utils.version_validator import validate_version
from pydantic import ValidationError
from sse_starlette.event import ensure_bytes
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router
from starlette.types import Message, Receive, Scope, Send

from agentscope_serverless.a2a_server import (
    A2A_PATH,
    SESSION_WRITER,
    RunsAgentExecutor,
    RunsRequestHandler,
    RunsTaskStore,
)
from agentscope_serverless.errors import (
    AgentScopeServerlessError,
    InvalidInputError,
    RequestInProgressError,
)
from agentscope_serverless.http.auth import bearer_scheme, get_caller
from agentscope_serverless.http.bodies import NotUtf8Charset, utf8_request
from agentscope_serverless.http.context import AppContext
from agentscope_serverless.http.errors import not_json_type, response_for
from agentscope_serverless.http.guards import (
    check_body,
    check_claims,
    check_request,
    request_body,
)
from agentscope_serverless.http.idempotency import (
    IDEMPOTENCY_HEADER,
    IDEMPOTENCY_KEY_PATTERN,
    Replay,
    fails_when,
    fingerprint_body,
    in_progress_response,
    replayed,
    writes_in_session,
)
from agentscope_serverless.http.middleware import BodyTooDeep, _route_path
from agentscope_serverless.http.params import EVENTS_ONLY, is_json_type, not_acceptable
from agentscope_serverless.http.sse import (
    EventStreamResponse,
    escape_line_breaks,
    escaping_line_breaks,
)
from agentscope_serverless.services.idempotency import StoredResponse

_USER_SCOPE_KEY = "agentscope.user_id"
Endpoint = Callable[[Request], Awaitable[Response]]


class _AuthenticatedUser(User):
    def __init__(self, user_id: str) -> None:
        self._user_id = user_id

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self._user_id


class _ContextBuilder(DefaultServerCallContextBuilder):
    """The A2A call context of an authenticated request: its user is the caller's user, and
    the session its run writes in is the request's (:func:`..idempotency.writes_in_session`):
    deleting the session forgets the call's ``Idempotency-Key``, whose kept answer quotes
    it."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state[SESSION_WRITER] = partial(writes_in_session, request)
        return context

    def build_user(self, request: Request) -> User:
        return _AuthenticatedUser(request.scope[_USER_SCOPE_KEY])


def _guarded_endpoint(endpoint: Endpoint, ping_interval: float, *, streams: bool) -> Endpoint:
    """``endpoint`` behind the checks every route runs (:mod:`..guards`): the key, then (on
    an HTTP+JSON route that ``streams``) an ``Accept`` taking ``text/event-stream``, the
    body's text and numbers, the user it names and the ``Idempotency-Key`` claim. Their
    errors reach the app's handlers, as any route's do, but on the JSON-RPC route: JSON-RPC
    errors (see :func:`_read`, :func:`_claim_refused`). A stream it answers pings every
    ``ping_interval`` seconds of silence (``SSE_PING_INTERVAL_SECONDS``), as every other
    stream does: the SDK's have no option for it and pinged every 15 s, so a proxy closing
    a connection idle for less dropped an A2A stream while its agent was silent."""

    async def guarded(request: Request) -> Response:
        request = utf8_request(request)
        caller = await get_caller(request, await bearer_scheme(request))
        request.scope[_USER_SCOPE_KEY] = caller.user_id()
        refusal = not_acceptable(request.headers.get("accept"), EVENTS_ONLY) if streams else None
        if refusal is not None:
            raise refusal
        # The SDK reads a body as JSON whatever its content type: one not sent as JSON is
        # refused, as every route reading JSON refuses it.
        content_type = request.headers.get("content-type")
        if request.method == "POST" and not is_json_type(content_type) and await request.body():
            return not_json_type(content_type)
        idempotency_key = _idempotency_key(request)
        # The route's path, not the URL's: under a root path (an API Gateway stage) the URL
        # is /prod/a2a, and the JSON-RPC route was served as an HTTP+JSON one.
        if _route_path(request.scope) != A2A_PATH:
            await check_request(request, caller, idempotency_key)
        else:
            body, refused = await _read(request)
            if refused is not None:
                return refused
            call_id = _call_id(body)
            if idempotency_key is not None and isinstance(body, dict):
                fingerprint_body(request, _without_id(body))
            try:
                await check_claims(request, caller, idempotency_key, body)
            except Replay as replay:
                return _replayed_call(replay.response, call_id)
            except AgentScopeServerlessError as exc:
                return _claim_refused(request, call_id, exc)
            refused = (
                _null_refused(body, await request.body())
                or _request_refused(body)
                or _notification_refused(body)
                or _params_refused(body)
                or _history_length_refused(body)
                or await _version_refused(body, request)
            )
            if refused is not None:
                return _answer(request, refused, ping_interval)
            if not isinstance(call_id, float):
                return _answer(request, await endpoint(request), ping_interval)
            # The SDK takes a string or an integer as id: it reads one standing in for a
            # number with a fraction, which its answer carries back.
            request.read_as({**body, "id": _STAND_IN_ID})
            answer = await endpoint(request)
            return _answer(request, answer, ping_interval, call_id)
        return _answer(request, await _first_event_read(await endpoint(request)), ping_interval)

    return guarded


async def _first_event_read(response: Response) -> Response:
    """An HTTP+JSON answer, its first event read when it is a stream: a stream failing before
    any event (a message the agent refuses: a file part, no content) is the binding's error,
    as ``message:send`` answers it. The SDK's A2A 0.3 routes started the stream first, then
    broke it off: a 200 whose body never ended."""
    if not isinstance(response, EventSourceResponse):
        return response
    events = aiter(response.body_iterator)
    try:
        first = await anext(events)
    except StopAsyncIteration:
        return response
    except Exception as exc:  # as the SDK's error handler answers any (it has logged it)
        error = build_rest_error_payload(exc)
        return JSONResponse(error, status_code=error["error"]["code"])
    response.body_iterator = _chained(first, events)
    return response


async def _chained(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for event in rest:
        yield event


def _answer(
    request: Request, response: Response, ping_interval: float, call_id: float | None = None
) -> Response:
    """``response`` as sent: a stream pinging every ``ping_interval`` seconds of silence and
    writing U+2028, U+2029 and U+0085 as JSON escapes (the SDK writes them as they are, and
    its streaming client, reading lines with ``str.splitlines``, broke an event holding
    one); given the ``call_id`` of a call the SDK read with :data:`_STAND_IN_ID`, its
    answers (each event of a stream) carrying it. On the JSON-RPC route, an answer that is
    an error (a stream whose first event is one) frees its ``Idempotency-Key`` as an HTTP
    error would: answered with a 200, it was kept, and the retry of a call that failed for a
    while (its store down) got the error."""
    json_rpc = _route_path(request.scope) == A2A_PATH
    if isinstance(response, EventSourceResponse):
        stream = _EscapedStream(_stopping_gracefully(response, ping_interval, call_id))
        if json_rpc:
            fails_when(request, lambda: stream.failed)
        return stream
    if call_id is not None:
        response = _carrying_id(response, call_id)
    if json_rpc and _is_error(getattr(response, "body", b"")):
        fails_when(request, lambda: True)
    return response


# The id the SDK reads in place of a number with a fraction (JSON-RPC allows one, the SDK
# refuses it); the answer carries the call's own.
_STAND_IN_ID = "agentscope-serverless:number-id"


def _carrying_id(response: Response, call_id: float) -> Response:
    """The JSON ``response`` (a JSON-RPC answer) carrying ``call_id``."""
    body = bytes(response.body)
    carrying = _with_id(body, call_id)
    if carrying == body:
        return response
    headers = {
        name: value
        for name, value in response.headers.items()
        if name not in ("content-length", "content-type")
    }
    return Response(
        carrying, status_code=response.status_code, headers=headers, media_type=response.media_type
    )


def _stopping_gracefully(
    response: EventSourceResponse, ping_interval: float, call_id: float | None
) -> Response:
    """The SDK's stream ``response`` sent as every other stream is
    (:class:`..sse.EventStreamResponse`): a server told to stop waits for it as for any open
    request, and a run the stop cancels sends its canceled status, the stream's last event,
    before it ends. Sent as the SDK's ``EventSourceResponse``, which watches for the server's
    stop itself, it was cut at once, with no final event, while its task ran on. Given a
    ``call_id``, each event carries it (see :func:`_answer`)."""
    sep = response.sep

    async def chunks() -> AsyncIterator[bytes]:
        async for event in response.body_iterator:
            chunk = ensure_bytes(event, sep)
            yield chunk if call_id is None else _events_with_id(chunk, call_id)

    headers = {
        name: value
        for name, value in response.headers.items()
        if name not in ("content-type", "content-length", "connection", "cache-control")
    }
    stream = EventStreamResponse(chunks(), ping_interval=ping_interval, headers=headers)
    stream.status_code = response.status_code
    stream.background = response.background
    return stream


class _EscapedStream(Response):
    """An SSE ``response`` written through :func:`..sse.escaping_line_breaks`, telling once
    its first event is read whether it is a JSON-RPC error (``failed``)."""

    def __init__(self, response: Response) -> None:
        self.response = response
        self.failed = False
        self._head: bytes | None = b""  # None once the first event is read

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        escaped = escaping_line_breaks(send)

        async def watched(message: Message) -> None:
            if self._head is not None and message["type"] == "http.response.body":
                self._read(bytes(message.get("body", b"")))
            await escaped(message)

        await self.response(scope, receive, watched)

    def _read(self, chunk: bytes) -> None:
        assert self._head is not None
        self._head += chunk
        *events, self._head = _EVENT_END.split(self._head)
        for event in events:
            lines = event.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
            data = b"\n".join(
                line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")
            )
            if data:  # not a comment (a ping)
                self.failed = b"event: error" in lines or _is_error(data)
                self._head = None
                return


_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


def _is_error(body: bytes) -> bool:
    """Whether ``body`` is a JSON-RPC error answer."""
    if b'"error"' not in body:  # an answer is read again only when it may be one
        return False
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    return isinstance(answer, dict) and "error" in answer


CallId = str | int | float | None


def _call_id(body: Any) -> CallId:
    call_id = body.get("id") if isinstance(body, dict) else None
    return call_id if _is_id(call_id) else None


def _is_id(value: Any) -> bool:
    """Whether ``value`` is a JSON-RPC id: a string, a number or null."""
    return value is None or (isinstance(value, str | int | float) and not isinstance(value, bool))


def _without_id(body: dict[str, Any]) -> bytes:
    """The call ``body`` without its ``id`` (the same call, retried, has another), as JSON
    written one way whatever the call's spacing and order of members."""
    call = {name: value for name, value in body.items() if name != "id"}
    text = json.dumps(call, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return text.encode()


def _replayed_call(stored: StoredResponse, call_id: CallId) -> Response:
    """The kept answer of a call, answering its retry: with the retry's id, which a JSON-RPC
    answer carries (a stream's events, each). A kept answer that is not JSON-RPC (an answer
    too large to keep, said as a 409) is a JSON-RPC error holding it."""
    if not 200 <= stored.status < 300:
        kept = _json_loads(stored.body)
        error = kept.get("error") if isinstance(kept, dict) else None
        kept_error = {"status": stored.status, **(error if isinstance(error, dict) else {})}
        message = str(kept_error.get("message", "the answer kept for this Idempotency-Key"))
        return _json_rpc_error(call_id, -32600, message, kept_error)
    if stored.headers.get("content-type", "").startswith("text/event-stream"):
        return replayed(stored, _events_with_id(stored.body, call_id))
    return replayed(stored, _with_id(stored.body, call_id))


def _events_with_id(events: bytes, call_id: CallId) -> bytes:
    """The SSE ``events`` (whole ones), each JSON-RPC answer carrying ``call_id``."""
    lines = events.split(b"\n")
    for at, line in enumerate(lines):
        if line.startswith(b"data:"):
            data, ending = line[5:].removeprefix(b" "), b""
            if data.endswith(b"\r"):
                data, ending = data[:-1], b"\r"
            lines[at] = b"data: " + _with_id(data, call_id) + ending
    return b"\n".join(lines)


def _with_id(answer: bytes, call_id: CallId) -> bytes:
    """The JSON-RPC ``answer`` carrying ``call_id``; anything else as it is."""
    parsed = _json_loads(answer)
    if not isinstance(parsed, dict) or "jsonrpc" not in parsed or parsed.get("id") == call_id:
        return answer
    parsed["id"] = call_id
    text = json.dumps(parsed, ensure_ascii=False, separators=(",", ":"))
    return escape_line_breaks(text).encode()


def _json_loads(text: bytes) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _claim_refused(request: Request, call_id: Any, exc: AgentScopeServerlessError) -> Response:
    """The JSON-RPC error answering a call the checks of its user and ``Idempotency-Key``
    refuse (the key reused for another call, still held by a call under way, its store
    unreachable...), with the call's id: an internal error (-32603) for a server error, else
    an invalid request (-32600). Its data is the error's answer on the other routes (status,
    code, message, and ``retry_after``: the seconds its ``Retry-After`` says, which this
    answer carries too). They were that answer: an HTTP error whose body no JSON-RPC client
    reads."""
    if isinstance(exc, RequestInProgressError):
        http = in_progress_response(request, exc)
    else:
        http = response_for(exc)
    data = {"status": http.status_code, **json.loads(bytes(http.body))["error"]}
    retry_after = http.headers.get("Retry-After")
    if retry_after is not None:
        data["retry_after"] = int(retry_after)
    code = -32603 if http.status_code >= 500 else -32600
    answer = _json_rpc_error(call_id, code, exc.message, data)
    if retry_after is not None:
        answer.headers["Retry-After"] = retry_after
    return answer


# The protocol's historyLength is a 32-bit integer. The SDK's A2A 0.3 methods (their names
# hold a '/') answer a larger one with an internal error, logged as a server error; its 1.0
# methods with invalid params, as this does.
_MAX_HISTORY_LENGTH = 2**31 - 1


def _json_rpc_error(request_id: Any, code: int, message: str, data: Any = None) -> Response:
    error = {"code": code, "message": message, "data": data}
    return JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": error})


def _invalid_params(body: dict[str, Any], message: str, data: Any = None) -> Response:
    return _json_rpc_error(body.get("id"), -32602, message, data)


def _invalid_request(request_id: Any, message: str, data: Any = None) -> Response:
    return _json_rpc_error(request_id, -32600, message, data)


async def _read(request: Request) -> tuple[Any, Response | None]:
    """The JSON-RPC call's body (see :func:`..guards.request_body`), and the JSON-RPC error
    refusing it when the checks every route runs refuse it (422 on the other routes), with
    the fields at fault in its data as their error has them: a body that cannot be read
    (not UTF-8, said to be in another charset, nesting too deeply, an integer too long) is a
    parse error saying why, where the SDK said "Expecting value" of one that is not UTF-8;
    text that is not Unicode, or a number JSON cannot carry, invalid params (in the params)
    or an invalid request."""
    try:
        body = await request_body(request)
    except InvalidInputError as exc:
        return None, _json_rpc_error(None, -32700, exc.message, {"fields": exc.errors})
    except (BodyTooDeep, NotUtf8Charset) as exc:
        return None, _json_rpc_error(None, -32700, exc.detail)
    try:
        check_body(body)
    except InvalidInputError as exc:
        where, data = exc.errors[0]["loc"][1:2], {"fields": exc.errors}
        request_id = _call_id(body) if where != ["id"] else None
        if where == ["params"]:
            return body, _invalid_params({"id": request_id}, exc.message, data)
        return body, _invalid_request(request_id, exc.message, data)
    return body, None


def _null_refused(body: Any, raw: bytes) -> Response | None:
    """The JSON-RPC error refusing a body of JSON ``null``, which the SDK answers as an
    invalid request logged as a server error with its traceback. (Parsed, it is None, as
    a body that is not JSON, the SDK's to answer: so the body's bytes tell.)"""
    if body is None and raw.strip(b" \t\r\n") == b"null":
        return _invalid_request(None, "a JSON-RPC request is an object")
    return None


def _request_refused(body: Any) -> Response | None:
    """The JSON-RPC error refusing a body that is no JSON-RPC request, saying why: not an
    object (a batch, an array, is not supported), its ``jsonrpc`` not "2.0", its method no
    string, its id neither a string, a number nor null, its params neither an object nor
    an array. The SDK answers it as an invalid request (or invalid params) saying no more,
    logged as a server error with its traceback. A body that is not JSON (None) is the
    SDK's to answer (a parse error)."""
    if body is None:
        return None
    if isinstance(body, list):
        return _invalid_request(None, "batches of requests (an array) are not supported")
    if not isinstance(body, dict):
        return _invalid_request(None, "a JSON-RPC request is an object")
    request_id = body.get("id")
    if not _is_id(request_id):
        return _invalid_request(None, "id must be a string, a number or null")
    if body.get("jsonrpc") != "2.0":
        return _invalid_request(request_id, 'jsonrpc must be "2.0"')
    if not isinstance(body.get("method"), str) or not body["method"]:
        return _invalid_request(request_id, "method must be a string")
    if "params" in body and not isinstance(body["params"], dict | list):
        return _invalid_request(request_id, "params must be an object or an array")
    return None


def _notification_refused(body: Any) -> Response | None:
    """The JSON-RPC error refusing an A2A call without an id (or a null one), an invalid
    request, running nothing: A2A takes no notifications, its methods' requests need an id
    (A2A 0.3's SDK's own server answers one with an error). The SDK's 0.3 methods answer it
    as an invalid request, with its validation's dump (quoting the call) logged as a server
    error; its 1.0 methods run it (the agent, for a message) and answer it with a null id,
    where JSON-RPC sends no answer to a notification. This says what is missing."""
    if not isinstance(body, dict) or body.get("id") is not None:
        return None
    # Imported once the SDK's routes are: importing it first is an import cycle of the SDK.
    from a2a.compat.v0_3.jsonrpc_adapter import JSONRPC03Adapter
    from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher

    method = body.get("method")
    if not isinstance(method, str):
        return None
    if method in JSONRPC03Adapter.METHOD_TO_MODEL:
        protocol = "A2A 0.3"
    elif method in JsonRpcDispatcher.METHOD_TO_MODEL:
        protocol = "A2A"
    else:
        return None
    message = f"{method} needs an id (a string or a number): {protocol} takes no notifications"
    error = {"code": -32600, "message": message, "data": None}
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error})


def _params_refused(body: Any) -> Response | None:
    """The JSON-RPC error refusing an A2A 0.3 call, a request as JSON-RPC has it, whose params
    its method cannot take. The SDK's 0.3 methods answer it as an invalid request (-32600),
    logged as a server error with its traceback; its 1.0 methods with invalid params."""
    if not isinstance(body, dict) or not isinstance(body.get("params", {}), dict | list):
        return None
    # Imported once the SDK's routes are: importing it first is an import cycle of the SDK.
    from a2a.compat.v0_3.jsonrpc_adapter import JSONRPC03Adapter

    method = body.get("method")
    model = JSONRPC03Adapter.METHOD_TO_MODEL.get(method) if isinstance(method, str) else None
    if model is None:
        return None
    try:
        model.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors()
        if any(error["loc"][:1] != ("params",) for error in errors):
            return None  # not a request (its id, its version): the SDK's to answer
        problems = "; ".join(
            f"{'.'.join(str(at) for at in error['loc'][1:]) or 'params'}: {error['msg']}"
            for error in errors
        )
        return _invalid_params(body, f"invalid params of {method}: {problems}")
    return None


def _history_length_refused(body: Any) -> Response | None:
    """The JSON-RPC error refusing an A2A 0.3 call whose historyLength is beyond 32 bits."""
    if not isinstance(body, dict) or "/" not in str(body.get("method")):
        return None
    params = body.get("params")
    configuration = params.get("configuration") if isinstance(params, dict) else None
    for holder in (params, configuration):
        length = holder.get("historyLength") if isinstance(holder, dict) else None
        if isinstance(length, int) and length > _MAX_HISTORY_LENGTH:
            message = f"historyLength must be at most {_MAX_HISTORY_LENGTH}, got {length}"
            return _invalid_params(body, message)
    return None


@validate_version(PROTOCOL_VERSION_0_3)
async def _speaks_0_3(context: ServerCallContext) -> None:
    """Nothing for a call whose ``A2A-Version`` is A2A 0.3's (or none), as the SDK reads it;
    :class:`VersionNotSupportedError` for another, after a warning."""


async def _version_refused(body: Any, request: Request) -> Response | None:
    """The JSON-RPC error refusing an A2A 0.3 call whose ``A2A-Version`` header names another
    version: version not supported (-32009), as the SDK's 1.0 methods answer one. Its 0.3
    methods answer it as an internal error (-32603), A2A 0.3 having no code for it."""
    # Imported once the SDK's routes are: importing it first is an import cycle of the SDK.
    from a2a.compat.v0_3.jsonrpc_adapter import JSONRPC03Adapter

    if not isinstance(body, dict) or body.get("method") not in JSONRPC03Adapter.METHOD_TO_MODEL:
        return None
    try:
        await _speaks_0_3(ServerCallContext(state={"headers": dict(request.headers)}))
    except VersionNotSupportedError as exc:
        code = JSON_RPC_ERROR_CODE_MAP[VersionNotSupportedError]
        return _json_rpc_error(body.get("id"), code, exc.message)
    return None


def _idempotency_key(request: Request) -> str | None:
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is not None and not (len(key) <= 255 and re.fullmatch(IDEMPOTENCY_KEY_PATTERN, key)):
        raise InvalidInputError(
            f"the {IDEMPOTENCY_HEADER} header must be 1 to 255 visible ASCII characters",
            field=IDEMPOTENCY_HEADER,
        )
    return key


# The HTTP+JSON routes answering only a stream (A2A 1.0's and 0.3's): SendStreamingMessage,
# SubscribeToTask.
_STREAMING_PATHS = ("/message:stream", ":subscribe")


def _guarded(routes: list[Any], ping_interval: float) -> list[Route]:
    # The SDK also mounts the HTTP+JSON routes under /{tenant}: that catch-all would shadow
    # other routes' 404/405 answers, so only the plain routes are kept.
    return [
        Route(
            route.path,
            _guarded_endpoint(
                route.endpoint, ping_interval, streams=route.path.endswith(_STREAMING_PATHS)
            ),
            methods=list(route.methods or ()),
        )
        for route in routes
        if isinstance(route, Route)
    ]


class _ClientErrorsAsWarnings(logging.Filter):
    """The SDK's records of a client's mistakes as warnings without traceback, which it logs
    as server errors: an A2A 1.0 call whose params its method cannot read (a string where a
    number goes, a historyLength past 32 bits...), answered as invalid params (-32602); a
    call for what the agent's card says it does not support (push notifications, the
    authenticated extended card), answered as not supported (-32003, -32004). Its params
    are not read before the SDK's: that would read a message of up to a megabyte twice."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.msg in _CLIENT_ERRORS:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text = None, None
        return True


_CLIENT_ERRORS = ("Failed to parse request params", "Validation failure: %s")
_CLIENT_ERRORS_AS_WARNINGS = _ClientErrorsAsWarnings()
# The SDK's loggers of those records: its JSON-RPC routes', and its request handler's
# checks of what the card says the agent supports.
_SDK_LOGGERS = (
    "a2a.server.routes.jsonrpc_dispatcher",
    "a2a.server.request_handlers.request_handler",
)


def build(context: AppContext) -> tuple[RunsRequestHandler, Router]:
    """The SDK's request handler over our runs, and its routes (JSON-RPC with 0.3 compatibility,
    HTTP+JSON) at ``/a2a``."""
    agent_app = context.agent_app
    assert agent_app is not None
    recorder = context.require_recorder()
    base_card = agent_app.a2a_card("http://localhost")
    handler = RunsRequestHandler(
        agent_executor=RunsAgentExecutor(
            context.require_runner(), recorder, make_request=agent_app.run_request
        ),
        task_store=RunsTaskStore(context.runs, first_write_delay=recorder.first_write_delay),
        agent_card=base_card,
    )
    for name in _SDK_LOGGERS:
        sdk_log = logging.getLogger(name)
        if _CLIENT_ERRORS_AS_WARNINGS not in sdk_log.filters:
            sdk_log.addFilter(_CLIENT_ERRORS_AS_WARNINGS)
    builder = _ContextBuilder()
    routes: list[Any] = [
        *create_jsonrpc_routes(handler, A2A_PATH, context_builder=builder, enable_v0_3_compat=True),
        *create_rest_routes(
            handler, context_builder=builder, enable_v0_3_compat=True, path_prefix=A2A_PATH
        ),
    ]
    ping_interval = context.settings.sse_ping_interval_seconds
    return handler, Router(routes=_guarded(routes, ping_interval))


__all__ = ["build"]
