"""Middleware: request ids with one log line per request, the request body size limit, and
streams ended with their keys.

**Request context.** Every request gets a request id, on its response and its log lines.

On Lambda, the id is the invocation's (as Lambda's own log lines of it have it), and an
``X-Request-Id`` header the client sent, when it is a reasonable token (up to 128 letters,
digits, ``.``, ``_`` or ``-``), is logged beside it as ``client_request_id``; elsewhere the
id is the client's when it is such a token, otherwise a new one is made. The id is the
response's ``X-Request-Id`` header. A response without a ``Cache-Control`` of its own (an
event stream's and the chat page's have ``no-cache``) gets ``Cache-Control: no-store``: what
the API answers is a user's own data (an error too, a 401's included), and ``/health`` or the
OpenAPI document kept by a cache would hide what the server answers now. The request's
agent gets its id from ``TracingUtil.get_request_id()``, and the trace headers it came with
(``traceparent``, ``tracestate``, ``X-Amzn-Trace-Id``) from
``TracingUtil.get_trace_header()``. Every line of
the request also carries its trace ids, as Powertools names them: ``xray_trace_id``, the
``Root`` of its ``X-Amzn-Trace-Id`` (on Lambda, of the invocation's ``_X_AMZN_TRACE_ID``), and
``trace_id``, the trace id of a valid W3C ``traceparent`` (an invalid one is ignored). One JSON log
line per request records the method, the path (never the query string or headers; a path
longer than 1024 characters by its beginning and end), the status and the duration; a
failed request's also the error ``code`` its answer gave and, once authenticated, the
caller's ``user_id`` and ``key_id``. An
error no handler maps is answered here (a 500, or the answer of the application's own
handler of ``Exception``, logged as one line with its traceback), so the server never sees
it; one after the response began is logged the same way, and the
response left unfinished, for the server to cut. Every answer leaves with the status
:func:`~agentscope_serverless.http.errors.status_on` gives it: an invalid request on the
OpenAI-compatible routes is a 400, as OpenAI's, wherever it was refused.

A WebSocket handshake is such a request: its answer (the 101 accepting it, or the refusal)
carries the request id, a refusal ``no-store`` too, and its line is logged as it is answered
(method ``GET``, status 101 or the refusal's); the connection's lines after carry its id.
uvicorn's ERROR of a handshake "returned without completing" is not logged for one refused
with an HTTP answer (see :func:`~agentscope_serverless.log.handshake_refused`).

**Body limits.** A body larger than ``MAX_REQUEST_BYTES`` gets 413: when ``Content-Length``
says so, without reading it into the app, otherwise as soon as the bytes read exceed it
(chunked uploads). The rest of the body is read and dropped for a moment before the answer
(at most ``DRAIN_SECONDS`` and ``DRAIN_BYTES``), then the connection closes: a connection
closed while the client still sends is reset, and a client writing its whole body before
reading (httpx's async client, most SDKs) then sees a broken connection instead of the 413.
A client that asked ``Expect: 100-continue`` has sent no body: it is answered at once.
A compressed body (a ``Content-Encoding`` of gzip, deflate, br, zstd..., or a
``Transfer-Encoding`` of any coding but ``chunked``, ``gzip, chunked`` say) gets 415, refused
the same way: it is never decompressed, and read as it came it would be refused as text that
is not UTF-8. A transfer coding is refused as a content coding is, rather than with the 501
RFC 9112 suggests: to the client it is the same mistake, and a 5xx would be retried (OpenAI's
SDKs retry every one) to the same answer.
Both are refused only once the request's key holds, as any body is read only then: a caller
without a valid key gets its 401 at once, the body unread; a route needing no key
(``/health``) refuses them as before.
A body whose next part does not arrive within ``REQUEST_BODY_TIMEOUT_SECONDS`` gets 408. A
JSON body nesting arrays and objects deeper than ``MAX_JSON_DEPTH`` (100) levels gets 422
before anything parses it: a parser recursing that far would run out of stack, and the
stores keep only what can be read back.

**WebSocket origins.** A WebSocket handshake from a browser page of an origin
``CORS_ALLOW_ORIGINS`` does not allow is refused 403 (one without ``Origin`` goes on).

**Revoked keys.** A streamed answer (a run's events, as it goes) outlives the check of the
key it was asked with: it ends once that key is revoked, checked at most once per
``KEY_RECHECK_SECONDS`` as its parts (and pings) go out, as if its client had left (a run
goes on without it). A WebSocket connection is closed the same way (code 1008, policy
violation), its key checked every ``KEY_RECHECK_SECONDS`` while it is open, whether messages
go or not. A key store that does not answer leaves the stream going. Only an answer whose
request was authenticated by its key is watched: one of a route left open (``public``) goes on
whatever bearer token its client sent (an expired key, another service's token).

**Start-up failures.** An application that cannot start (a start-up hook that raises, a
store that cannot be reached) tells its server so in one line naming the cause, not a
traceback (the server prints it and exits); the traceback is logged at DEBUG level.

**HEAD.** A HEAD request is answered as its GET would be, status and headers, without the
body (RFC 9110): on every GET route, with the same authentication. The GET stops once its
headers are out, so a HEAD of a stream (a run's events) does not wait for the stream.

All are pure ASGI (no per-request task: only an open WebSocket connection has one, checking
its key), so streaming responses pass through untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import re
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote_to_bytes

from fastapi.security.utils import get_authorization_scheme_param
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocketDisconnect

from agentscope_serverless.auth.base import KeyStore
from agentscope_serverless.errors import (
    AgentScopeServerlessError,
    AuthenticationError,
    InvalidInputError,
    PayloadTooLargeError,
    PermissionDeniedError,
)
from agentscope_serverless.http.auth import (
    REFUSED_BODY_STATE,
    authenticated_caller,
    caller_fields,
)
from agentscope_serverless.http.errors import (
    ERROR_CODE_STATE,
    ErrorResponse,
    error_response,
    response_for,
    status_on,
    unexpected_error,
)
from agentscope_serverless.http.lambda_handler import LAMBDA_CONTEXT_HEADER
from agentscope_serverless.http.params import is_json_type
from agentscope_serverless.log import (
    bind_request_id,
    handshake_refused,
    log_request,
    logger,
    redacted,
    trace_ids_of,
)
from agentscope_serverless.metrics import RunMetrics
from agentscope_serverless.services._validation import (
    MAX_JSON_DEPTH,
    nests_deeper_than,
    too_deep,
)
from agentscope_serverless.tracing import TracingUtil

REQUEST_ID_HEADER = "X-Request-Id"
_VALID_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


# The trace context a client may send, for the request's agent to continue (W3C, X-Ray).
_TRACE_HEADERS = frozenset((b"traceparent", b"tracestate", b"x-amzn-trace-id"))
_MAX_TRACE_HEADER = 1024
# The X-Ray trace header of the invocation being served, which Lambda sets in the process
# (the one its own traces of the function have).
LAMBDA_TRACE_VARIABLE = "_X_AMZN_TRACE_ID"


def trace_headers_of(scope: Scope) -> dict[str, str]:
    """The trace headers of the request, by lower-case name; one that is not printable
    ASCII of at most 1024 characters is left out."""
    found: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        if name in _TRACE_HEADERS and len(value) <= _MAX_TRACE_HEADER:
            text = bytes(value).decode("latin-1")
            if text.isascii() and text.isprintable():
                found[name.decode()] = text
    return found


def request_ids_of(scope: Scope) -> tuple[str, str | None]:
    """The request's id and the id its client sent (``X-Request-Id``, when valid) if that is
    another.

    On Lambda, the request's id is the invocation's (the one of Lambda's own lines for it:
    START, END, REPORT), and the client's is kept beside it: a client choosing the id would
    part our lines from Lambda's, or mix them with another request's. Elsewhere it is the
    client's when valid (a proxy's, to follow a request through it), else a fresh one.
    """
    client_id = lambda_context = None
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            candidate = bytes(value).decode("latin-1")
            if _VALID_ID.match(candidate):
                client_id = candidate
        elif name == LAMBDA_CONTEXT_HEADER:
            lambda_context = value
    invocation = _invocation_id(scope, lambda_context)
    if invocation is not None:
        return invocation, client_id
    return client_id or uuid.uuid4().hex, None


def request_trace_ids(scope: Scope) -> dict[str, str] | None:
    """The trace ids of the request's lines (:func:`trace_ids_of`): on Lambda (Mangum), the
    invocation's X-Ray trace, else the ``X-Amzn-Trace-Id`` header's; and its ``traceparent``'s.
    None when there are none."""
    trace_headers = trace_headers_of(scope)
    lambda_trace = os.environ.get(LAMBDA_TRACE_VARIABLE) if "aws.context" in scope else None
    if not trace_headers and not lambda_trace:
        return None
    return trace_ids_of(
        lambda_trace or trace_headers.get("x-amzn-trace-id"), trace_headers.get("traceparent")
    )


def _invocation_id(scope: Scope, lambda_context: bytes | None) -> str | None:
    """The Lambda invocation's request id: from its context object (Mangum), or from the
    context the Web Adapter sends in a header; None outside Lambda."""
    candidate = getattr(scope.get("aws.context"), "aws_request_id", None)
    if candidate is None and lambda_context is not None:
        try:
            candidate = json.loads(lambda_context).get("request_id")
        except (ValueError, AttributeError, RecursionError):
            return None
    return candidate if isinstance(candidate, str) and _VALID_ID.match(candidate) else None


# What an answer that says nothing of caching is sent with: answers are a user's own data
# (their sessions, their memory), which no cache, a browser's or a proxy's, is to keep.
NO_STORE = (b"cache-control", b"no-store")


def _with_request_id(headers: Any, request_id: tuple[bytes, bytes]) -> list[Any]:
    """A response's ``headers`` with its ``X-Request-Id`` header, and ``no-store`` unless
    they say how to cache it."""
    if _sets_caching(headers):
        return [*headers, request_id]
    return [*headers, request_id, NO_STORE]


def _sets_caching(headers: Any) -> bool:
    """Whether the answer's ``headers`` have a ``Cache-Control`` of their own (an event
    stream's ``no-cache``, the chat page's)."""
    return any(name.lower() == b"cache-control" for name, _ in headers)


class RequestContextMiddleware:
    """Tags each request with a request id and logs it once it is answered (an answer that
    says nothing of caching also gets ``Cache-Control: no-store``); with
    ``metrics``, one answered with a server error (a 5xx) also writes its metric.

    ``error_handler`` (an application's handler of ``Exception`` or 500, as FastAPI's
    ``add_exception_handler`` takes it: ``handler(request, exc)``, sync or async) answers an
    error no other handler maps in place of the runtime's 500; the error is logged all the
    same."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: RunMetrics | None = None,
        error_handler: Callable[[Request, Exception], Any] | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.error_handler = error_handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._handshake(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id, client_request_id = _bind_request(scope)
        state = scope["state"]
        header = (b"x-request-id", request_id.encode())
        status: int | None = None
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"] = status_on(_route_path(scope), message["status"])
                message["headers"] = _with_request_id(message.get("headers", ()), header)
            await send(message)

        try:
            refused = _not_utf8(scope)
            if refused is not None:
                await response_for(refused)(scope, receive, send_with_id)
                return
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            # Not raised to the server: it would log the traceback again, as plain text (each
            # line of the exception's text a log line of its own, with no request id).
            if status is None:
                # Answered here, through CORS on its way out; the connection stays open.
                answer = await self._answer(scope, receive, exc)
                await answer(scope, receive, send_with_id)
            else:
                # Left unfinished: the server cuts it, so the client knows it is incomplete
                # (a stream's client resumes it).
                logger.error(
                    "the response failed after it began",
                    exc_info=exc,
                    extra={"error": type(exc).__name__},
                )
        finally:
            code = state.get(ERROR_CODE_STATE)
            answered = 500 if status is None else status
            log_request(
                request_id,
                scope.get("method"),
                scope.get("path"),
                answered,
                round((time.perf_counter() - started) * 1000, 2),
                client_request_id=client_request_id,
                failure=None if code is None else {"code": code, **caller_fields(state)},
            )
            if answered >= 500 and self.metrics is not None:
                self.metrics.request_failed(code=code)

    async def _handshake(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a WebSocket connection with the context of a request, its handshake's: its
        answer (the 101 accepting it, or the refusal) carries the request id, a refusal
        ``Cache-Control: no-store`` too, and one line logs the handshake as it is answered
        (a refusal's naming its code; the connection's life after is not the request's)."""
        request_id, client_request_id = _bind_request(scope)
        state = scope["state"]
        header = (b"x-request-id", request_id.encode())
        status: int | None = None
        logged = False
        started = time.perf_counter()

        def log_handshake(answered: int) -> None:
            nonlocal logged
            logged = True
            code = state.get(ERROR_CODE_STATE)
            log_request(
                request_id,
                "GET",
                scope.get("path"),
                answered,
                round((time.perf_counter() - started) * 1000, 2),
                client_request_id=client_request_id,
                failure=None if code is None else {"code": code, **caller_fields(state)},
            )

        async def send_with_id(message: Message) -> None:
            nonlocal status
            kind = message["type"]
            if status is None and kind == "websocket.accept":
                status = 101
                message["headers"] = [*message.get("headers", ()), header]
            elif status is None and kind == "websocket.http.response.start":
                status = message["status"] = status_on(_route_path(scope), message["status"])
                message["headers"] = _with_request_id(message.get("headers", ()), header)
            elif status is None and kind == "websocket.close":
                status = 403  # how the server answers a handshake closed before it is accepted
            await send(message)
            if kind == "websocket.http.response.body" and not message.get("more_body", False):
                handshake_refused()
            if status is not None and not logged and kind != "websocket.http.response.start":
                log_handshake(status)

        try:
            refused = _not_utf8(scope)
            if refused is not None:
                await refuse_handshake(refused, scope, receive, send_with_id)
                return
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            if status is not None:
                raise  # the server ends the connection, and logs why
            await _answer_handshake(unexpected_error(exc), scope, receive, send_with_id)
        finally:
            if not logged:
                log_handshake(500 if status is None else status)

    async def _answer(self, scope: Scope, receive: Receive, exc: Exception) -> Response:
        """The answer to ``exc``: the application's error handler's, if it has one, else
        the runtime's 500 (as when its handler fails)."""
        if self.error_handler is None:
            return unexpected_error(exc)
        logger.error("unexpected error", exc_info=exc, extra={"error": type(exc).__name__})
        request = Request(scope, receive)
        try:
            if inspect.iscoroutinefunction(self.error_handler):
                answer = await self.error_handler(request, exc)
            else:
                answer = await run_in_threadpool(self.error_handler, request, exc)
        except Exception as failed:
            return unexpected_error(failed)
        if not isinstance(answer, Response):
            return unexpected_error(
                TypeError(f"the error handler answered {type(answer).__name__}, not a Response")
            )
        return answer


# The most bytes of the reason a WebSocket close frame carries.
_MAX_CLOSE_REASON_BYTES = 123
# A WebSocket's close code for a message (a handshake) that breaks the server's policy.
POLICY_VIOLATION = 1008
# A WebSocket's close code for a server that failed.
SERVER_ERROR = 1011


async def refuse_handshake(
    error: AgentScopeServerlessError, scope: Scope, receive: Receive, send: Send
) -> None:
    """Refuse a WebSocket handshake before it is accepted, as an HTTP request would be
    refused: the JSON error with its status, when the server can answer a handshake so (the
    ASGI ``websocket.http.response`` extension, as uvicorn's), else a close saying why
    (which uvicorn would answer 403)."""
    await _answer_handshake(response_for(error), scope, receive, send, error.message)


async def _answer_handshake(
    answer: Response,
    scope: Scope,
    receive: Receive,
    send: Send,
    reason: str = "internal server error",
) -> None:
    """Refuse a WebSocket handshake with ``answer``, or where the server cannot answer one
    so, with a close saying ``reason`` (a policy violation, or for a 500 an internal error)."""
    if "websocket.http.response" in scope.get("extensions", {}):
        await answer(scope, receive, send)
        return
    code = SERVER_ERROR if answer.status_code >= 500 else POLICY_VIOLATION
    reason = reason.encode()[:_MAX_CLOSE_REASON_BYTES].decode(errors="ignore")
    await send({"type": "websocket.close", "code": code, "reason": reason})


def _bind_request(scope: Scope) -> tuple[str, str | None]:
    """The request's id and the one its client sent (:func:`request_ids_of`), bound to its
    lines and kept in its state, and its trace headers for its agent."""
    request_id, client_request_id = request_ids_of(scope)
    scope.setdefault("state", {})["request_id"] = request_id
    bind_request_id(request_id, client_request_id, trace_ids=request_trace_ids(scope))
    trace_headers = trace_headers_of(scope)
    if trace_headers:
        TracingUtil.set_trace_header(trace_headers)
    return request_id, client_request_id


class WebSocketOriginMiddleware:
    """Refuses, 403 and its JSON error, a WebSocket handshake from a browser page of an origin
    ``allow_origins`` (``CORS_ALLOW_ORIGINS``, as browsers send them; ``*``: any) does not allow.

    A browser lets any page open a WebSocket connection to any server, and no CORS applies
    to it (Starlette's CORS passes handshakes by): the server has only the ``Origin`` the
    browser sent to tell. A handshake without one is no browser page's, and goes on."""

    def __init__(self, app: ASGIApp, allow_origins: tuple[str, ...] = ()) -> None:
        self.app = app
        self.allow_all = "*" in allow_origins
        self.allow_origins = frozenset(allow_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and not self.allow_all:
            origin = _origin_of(scope)
            if origin is not None and origin not in self.allow_origins:
                refused = PermissionDeniedError(
                    "the handshake's origin is not one CORS_ALLOW_ORIGINS allows"
                )
                await refuse_handshake(refused, scope, receive, send)
                return
        await self.app(scope, receive, send)


def _origin_of(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"origin":
            return bytes(value).decode("latin-1")
    return None


class StartupFailureMiddleware:
    """Tells the server why the application could not start, or stop, in one line, the
    settings' secrets masked: its server (uvicorn) would print the traceback Starlette gives
    it (with the exception's text as it is)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        failed: str | None = None

        async def sending(message: Message) -> None:
            nonlocal failed
            if message["type"] in _FAILED:
                failed = message["type"]  # told below, once the exception is known
                return
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except BaseException as exc:
            if failed is not None:
                what = _FAILED[failed]
                logger.debug(f"the application could not {what}", exc_info=exc)
                reason = (
                    exc.message
                    if isinstance(exc, AgentScopeServerlessError)
                    else f"{type(exc).__name__}: {exc}"
                )
                line = f"the application could not {what}: {redacted(reason)}"
                hint = " (LOG_LEVEL=DEBUG logs its traceback)"
                await send({"type": failed, "message": line + hint})
            raise  # the server, told already, says no more


# The lifespan messages of a failure, and what the application could not do.
_FAILED = {"lifespan.startup.failed": "start", "lifespan.shutdown.failed": "stop"}


def _route_path(scope: Scope) -> str:
    """The path the routes see: the request's, after its root path (an API Gateway stage).

    >>> _route_path({"path": "/prod/process", "root_path": "/prod"})
    '/process'
    >>> _route_path({"path": "/production/process", "root_path": "/prod"})
    '/production/process'
    """
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(f"{root}/"):
        return path[len(root) :]
    return path


def _not_utf8(scope: Scope) -> InvalidInputError | None:
    """Why the URL is refused when its path, or a query parameter, is not UTF-8 once
    percent-decoded.

    The server would read each byte it cannot decode as U+FFFD, so ``/sessions/%FE`` and
    ``/sessions/%FF`` (or ``?user_id=%E9`` and ``?user_id=%FF``) would name the same one.
    """
    if not _decodes(scope.get("raw_path") or b""):
        return InvalidInputError("the path is not UTF-8 text once percent-decoded", field="path")
    query: bytes = scope.get("query_string", b"")
    if query.isascii() and b"%" not in query:
        return None
    for pair in query.split(b"&"):
        name, _, value = pair.partition(b"=")
        if not _decodes(name):
            return InvalidInputError("the query is not UTF-8 text", field="query")
        if not _decodes(value):
            label = unquote_to_bytes(name.replace(b"+", b" ")).decode()[:64]
            return InvalidInputError(f"the {label} query parameter is not UTF-8 text", field=label)
    return None


def _decodes(raw: bytes) -> bool:
    if raw.isascii() and b"%" not in raw:
        return True
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# How long, and how much, of a refused body is read (and dropped) before the answer.
DRAIN_SECONDS = 2.0
DRAIN_BYTES = 64 * 1024 * 1024


class BodyTooLarge(HTTPException):
    """Raised while reading a body past the limit (FastAPI lets HTTP exceptions through)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            status_code=413,
            detail=_too_large(limit).message,
            headers={"Connection": "close"},
        )


def _too_large(limit: int) -> PayloadTooLargeError:
    """The error refusing a body of more than ``limit`` bytes."""
    return PayloadTooLargeError(f"the request body is larger than {limit} bytes")


async def _drain(scope: Scope, receive: Receive) -> None:
    """Read and drop what the client still sends of a refused body, for at most
    :data:`DRAIN_SECONDS` and :data:`DRAIN_BYTES`, so that closing the connection after the
    answer does not reset it under a client still writing (it would lose the answer).

    Nothing is read from a client waiting for ``100 Continue``: it sends no body unless
    told to, and reading would tell it to.
    """
    for name, value in scope.get("headers", ()):
        if name == b"expect" and bytes(value).strip().lower() == b"100-continue":
            return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_SECONDS
    drained = 0
    while drained <= DRAIN_BYTES:
        try:
            message = await asyncio.wait_for(receive(), deadline - loop.time())
        except TimeoutError:
            return
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        drained += len(message.get("body", b""))


class BodyTimedOut(HTTPException):
    """Raised when the next part of a body does not arrive in time."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            status_code=408,
            detail=f"the request body did not arrive within {seconds:g} seconds",
            headers={"Connection": "close"},
        )


class BodyTooDeep(HTTPException):
    """Raised when a JSON body is complete and nests too deeply (before the app parses it)."""

    def __init__(self) -> None:
        super().__init__(status_code=422, detail=too_deep("the request body").message)


class BodySizeLimitMiddleware:
    """Rejects request bodies larger than ``max_bytes`` with 413, compressed ones (a
    ``Content-Encoding`` of a compression, a ``Transfer-Encoding`` of any coding but
    ``chunked``) with 415, stalled ones with 408 and JSON ones
    nesting deeper than ``MAX_JSON_DEPTH`` with 422.

    ``timeout`` bounds the wait for each part of the body (None: no limit); once the body
    is complete, later reads (a streaming response listening for the client leaving) wait
    as long as they need.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, timeout: float | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        coding = _body_coding(scope)
        if coding is not None:
            header, value = coding
            response = error_response(
                415,
                "UNSUPPORTED_MEDIA_TYPE",
                f"the request body must be sent uncompressed: {header} {value!r} is not supported",
            )
            response.headers["Accept-Encoding"] = "identity"
            response.headers["Connection"] = "close"
            await self._refuse(scope, receive, send, response)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            error = _too_large(self.max_bytes)
            response = error_response(413, error.code, error.message)
            response.headers["Connection"] = "close"
            await self._refuse(scope, receive, send, response)
            return
        received = 0
        complete = False
        json_body = _is_json(scope)
        parts: list[bytes] = []
        opening = 0  # the opening brackets read: a bound of the body's depth

        async def receive_limited() -> Message:
            nonlocal received, complete, opening
            if complete or self.timeout is None:
                message = await receive()
            else:
                # A timer on this task, not wait_for's task of its own (and the turns of
                # the loop it takes): a body read whole costs next to nothing more.
                try:
                    async with asyncio.timeout(self.timeout):
                        message = await receive()
                except TimeoutError:
                    raise BodyTimedOut(self.timeout) from None
            if message["type"] == "http.request":
                body = message.get("body", b"")
                received += len(body)
                if received > self.max_bytes:
                    if message.get("more_body", False):
                        await _drain(scope, receive)
                    raise BodyTooLarge(self.max_bytes)
                complete = not message.get("more_body", False)
                if json_body:
                    parts.append(body)
                    opening += body.count(b"[") + body.count(b"{")
                    if complete and opening > MAX_JSON_DEPTH and nests_deeper_than(b"".join(parts)):
                        raise BodyTooDeep()
            return message

        await self.app(scope, receive_limited, send)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, refusal: ErrorResponse
    ) -> None:
        """Answer ``refusal`` to a request whose body is refused unread, but a 401 first.

        The app takes the request up to its authentication (a route reads no body before
        it), which, once the key holds, raises the refusal in place of the route (see
        :data:`~.auth.REFUSED_BODY_STATE`). A caller without a valid key gets that 401 at
        once, the body unread, as it would for any body; any other answer (a route without
        a key, such as ``/health``) is replaced by the refusal.
        """
        refused = HTTPException(status_code=refusal.status_code, detail="the body is refused")
        unauthenticated = False

        async def no_body() -> Message:
            raise refused

        async def send_unauthenticated(message: Message) -> None:
            nonlocal unauthenticated
            if message["type"] == "http.response.start":
                unauthenticated = message["status"] == 401
            if unauthenticated:
                await send(message)

        scope.setdefault("state", {})[REFUSED_BODY_STATE] = refused
        await self.app(scope, no_body, send_unauthenticated)
        if not unauthenticated:
            await _drain(scope, receive)
            await refusal(scope, receive, send)


# How often, at most, a streamed answer checks that its key still holds.
KEY_RECHECK_SECONDS = 1.0


class _StreamEnded(Exception):
    """Raised into the app sending a part of a stream that has been ended."""


class HeadMiddleware:
    """Answers HEAD as GET without the body (see the module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def send_head(message: Message) -> None:
            if message["type"] == "http.response.start":
                await send(message)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            raise _StreamEnded

        try:
            await self.app({**scope, "method": "GET"}, receive, send_head)
        except* _StreamEnded:
            pass  # the GET stopped once its headers were sent


class RevokedKeyMiddleware:
    """Ends a streamed answer once the key it was asked with is revoked (see the module)."""

    def __init__(
        self, app: ASGIApp, key_store: KeyStore, recheck_seconds: float = KEY_RECHECK_SECONDS
    ) -> None:
        self.app = app
        self.key_store = key_store
        self.recheck_seconds = recheck_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and _bearer_key(scope) is not None:
            scope.setdefault("state", {})  # where the route keeps the caller it authenticates
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        checked_at = time.monotonic()
        ended = False

        async def send_while_valid(message: Message) -> None:
            nonlocal checked_at, ended
            if ended:
                raise _StreamEnded
            if message["type"] == "http.response.body" and message.get("more_body", False):
                now = time.monotonic()
                if now - checked_at >= self.recheck_seconds:
                    checked_at = now
                    if await self._revoked(scope):
                        ended = True
                        await send({"type": "http.response.body", "body": b"", "more_body": False})
                        raise _StreamEnded
            await send(message)

        try:
            await self.app(scope, receive, send_while_valid)
        except* _StreamEnded:
            pass  # the app stopped as for a client that left

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a WebSocket connection, closed (code 1008) once its key is revoked: checked
        every ``recheck_seconds`` while it is open, whether messages go or not. The app then
        receives a disconnect, and a message it sends raises ``WebSocketDisconnect``, as for
        a client that left."""
        revoked = False
        watcher: asyncio.Task[None] | None = None
        sending = asyncio.Lock()  # the app's messages and the watcher's close, one at a time

        async def watch() -> None:
            nonlocal revoked
            while True:
                # Checked as the handshake was made: next in a while, then as often.
                await asyncio.sleep(self.recheck_seconds)
                if await self._revoked(scope):
                    break
            async with sending:
                revoked = True
                with contextlib.suppress(OSError):  # its client left meanwhile
                    await send(
                        {"type": "websocket.close", "code": POLICY_VIOLATION, "reason": _REVOKED}
                    )

        def stop_watching() -> None:
            if watcher is not None:
                watcher.cancel()

        async def send_while_valid(message: Message) -> None:
            nonlocal watcher
            async with sending:
                if revoked:
                    raise _KeyRevoked(POLICY_VIOLATION, _REVOKED)
                await send(message)
            if message["type"] == "websocket.accept" and _authenticated(scope):
                watcher = asyncio.create_task(watch())
            elif message["type"] == "websocket.close":
                stop_watching()

        async def receive_while_valid() -> Message:
            message = await receive()  # the server's disconnect once the watcher closed it
            if revoked:
                return {
                    "type": "websocket.disconnect",
                    "code": POLICY_VIOLATION,
                    "reason": _REVOKED,
                }
            if message["type"] == "websocket.disconnect":
                stop_watching()
            return message

        try:
            await self.app(scope, receive_while_valid, send_while_valid)
        except* _KeyRevoked:
            pass  # the app stopped as for a client that left
        finally:
            stop_watching()

    async def _revoked(self, scope: Scope) -> bool:
        """Whether the key the request was authenticated with no longer holds (a request
        not authenticated by its key, on a route left open, is never cut for it)."""
        key = _bearer_key(scope)
        if key is None or not _authenticated(scope):
            return False
        try:
            await self.key_store.authenticate(key)
        except AuthenticationError:
            return True
        except AgentScopeServerlessError:
            return False  # the store did not answer: not a reason to cut a stream
        return False


def _authenticated(scope: Scope) -> bool:
    """Whether the request was authenticated by its key: a route left open never checks the
    bearer token it may carry (an expired key, another service's token)."""
    return authenticated_caller(scope.get("state", {})) is not None


# Why a WebSocket connection is closed once its key is revoked.
_REVOKED = "the API key was revoked"


class _KeyRevoked(WebSocketDisconnect):
    """Raised into the app sending on a WebSocket connection closed for its revoked key."""


def _bearer_key(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, key = get_authorization_scheme_param(bytes(value).decode("latin-1"))
            return key if scheme.lower() == "bearer" else None
    return None


def _is_json(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return is_json_type(bytes(value).decode("latin-1"))
    return True


# The content codings that compress a body (HTTP's registry). Any other value is no
# compression (``identity``, or a charset sent by mistake): the body is read as it comes.
_COMPRESSIONS = frozenset(("gzip", "x-gzip", "deflate", "br", "compress", "x-compress", "zstd"))


def _body_coding(scope: Scope) -> tuple[str, str] | None:
    """The header and its value, when the request's body is encoded in a way it is not read
    in: a ``Content-Encoding`` naming a compression, or a ``Transfer-Encoding`` naming any
    coding but ``chunked`` (the server undoes the chunks only: a ``gzip`` one would be read
    compressed), else None."""
    for name, value in scope.get("headers", ()):
        if name == b"content-encoding":
            coding = bytes(value).decode("latin-1").strip()
            if _codings(coding) & _COMPRESSIONS:
                return "Content-Encoding", coding[:100]
        elif name == b"transfer-encoding":
            coding = bytes(value).decode("latin-1").strip()
            if _codings(coding) - {"chunked"}:
                return "Transfer-Encoding", coding[:100]
    return None


def _codings(value: str) -> set[str]:
    """The codings a ``Content-Encoding`` or ``Transfer-Encoding`` value lists, lower-case.

    >>> sorted(_codings("GZIP,, chunked"))
    ['chunked', 'gzip']
    """
    return {part.strip().lower() for part in value.split(",")} - {""}


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


__all__ = [
    "NO_STORE",
    "POLICY_VIOLATION",
    "REQUEST_ID_HEADER",
    "BodySizeLimitMiddleware",
    "BodyTimedOut",
    "BodyTooDeep",
    "BodyTooLarge",
    "HeadMiddleware",
    "RequestContextMiddleware",
    "RevokedKeyMiddleware",
    "StartupFailureMiddleware",
    "WebSocketOriginMiddleware",
    "refuse_handshake",
    "request_ids_of",
    "trace_headers_of",
]
