"""Lambda entry points: the shared application for some routers, behind Mangum (buffered).

>>> handler = make_handler(["sessions"])   # in functions/sessions/agentscope_handler.py

Importing this module and making a handler connects to nothing. The first invocation
reads the secrets (``SECRETS_ARN``), builds the application, starts its services once and
keeps them for the life of the execution environment, so later invocations reuse the
connections (Mangum would otherwise start and stop them around every request).

What a caller gets, whatever the event:

- An HTTP request (a Function URL's, API Gateway's REST or HTTP API, an ALB's) is answered
  in the shape its event takes. One that cannot be decoded (a body marked base64 that is
  not, headers or a query that are not Unicode) is a 400; a function that cannot start its
  services answers 503 and an unexpected failure 500, both as JSON errors: Lambda would
  answer an invocation error with a 502 without a body, and a direct invocation with the
  stack trace.
- A buffered response is at most 6 MB (``RESPONSE_LIMIT_BYTES``, counted as Lambda does:
  the JSON of the whole answer), 1 MB to an ALB (``ALB_RESPONSE_LIMIT_BYTES``). A larger
  event stream is cut after its last event that fits, with an ``error`` event saying so (a
  run's client resumes it from the stored run with ``Last-Event-ID``, or past an event too
  large by itself, which the error names; an A2A stream ends with a JSON-RPC error naming its
  task); any other larger response becomes a 500 ``RESPONSE_TOO_LARGE`` with
  ``X-Should-Retry: false`` saying what to ask instead, for its route (an A2A JSON-RPC answer,
  a JSON-RPC error). HEAD answers as GET does.
- A background task's event (``{"agentscope_task": ...}``, an asynchronous invocation by the
  process function) runs the task (see :func:`~agentscope_serverless.tasks.run_task_event`).
- Any other event (an empty one, a direct invocation's own payload) is refused with an
  ``UNSUPPORTED_EVENT`` error object, not raised: Lambda would retry it, to no avail.

Every invocation's work ends ``TIME_LIMIT_MARGIN_SECONDS`` before the function's time limit
(see :mod:`agentscope_serverless.time_limit`), so a run still going is stored and answered
as failed instead of being cut off.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import importlib
import json
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote

if TYPE_CHECKING:
    from fastapi import FastAPI
    from mangum.types import ASGI, Response, Scope
    from mangum.types import LambdaHandler as MangumHandler
    from starlette.types import ASGIApp, Message, Receive, Send

    from agentscope_serverless.metrics import RunMetrics
    from agentscope_serverless.settings import Settings

_T = TypeVar("_T")
LambdaHandler = Callable[[Any, Any], dict[str, Any]]

# The most a buffered invocation may answer: the bytes of its response payload (the JSON of
# the handler's answer). Lambda refuses a larger one, and the caller gets a 502.
RESPONSE_LIMIT_BYTES = 6 * 1024 * 1024
# The most an ALB takes from a Lambda function (1 MB): it answers a larger one with a 502.
ALB_RESPONSE_LIMIT_BYTES = 1_000_000
# Kept free below the limit: the runtime's JSON encoder may differ from ours a little.
_RESPONSE_SLACK_BYTES = 4096
# The header the Lambda Web Adapter sends the invocation's Lambda context in.
LAMBDA_CONTEXT_HEADER = b"x-amzn-lambda-context"
_EVENT_STREAM = "text/event-stream"
# Headers of a response kept on the error that replaces it when it is too large.
_KEPT_HEADERS = ("x-request-id", "x-run-id", "x-session-id", "cache-control")

# A warm function whose store refused a credential of the secret (a Redis password rotated
# since it was read) starts again, reading the secret anew, at most once in this many
# seconds; stopping its services takes at most _STOP_SECONDS.
RESTART_SECONDS = 60.0
_STOP_SECONDS = 5.0
# How often the services a restart left (behind the Web Adapter) are checked for work still
# running on them, before they stop.
_IDLE_SECONDS = 0.5

# What a router needs beyond the HTTP application: the runtime of an agent (AgentApp, Runner)
# for the process router. The other functions never import it.
_RUNTIME_OF_ROUTER = {"process": "agentscope_serverless.app"}


def import_runtime(routers: Sequence[str]) -> None:
    """Import what serving ``routers`` needs beyond the HTTP application now, in Lambda's
    init phase, rather than in the first invocation (which builds the application)."""
    for name in routers:
        if name in _RUNTIME_OF_ROUTER:
            importlib.import_module(_RUNTIME_OF_ROUTER[name])


def build_app(routers: Sequence[str], settings: Settings | None = None) -> FastAPI:
    """The application for ``routers``, with the settings' secrets read from AWS (or the
    ``settings`` :func:`read_settings` gave).

    The composition root of every function: the settings (the environment, then the
    ``SECRETS_ARN`` secret) are read here, once, and handed down to everything else.
    """
    from agentscope_serverless.http.app import create_app

    return create_app(routers, settings=settings if settings is not None else read_settings())


def read_settings() -> Settings:
    """The settings of the environment, their secrets read from Secrets Manager (and the
    agent's own put in the environment): a call that waits on the network, a few seconds
    at most (see :mod:`agentscope_serverless.aws_secrets`)."""
    from agentscope_serverless.aws_secrets import resolve_secrets
    from agentscope_serverless.settings import load_settings

    return resolve_secrets(load_settings())


def build_web_adapter_app(routers: Sequence[str]) -> ASGIApp:
    """:func:`build_app` for a function behind the Lambda Web Adapter (the streaming process
    function), as :func:`behind_web_adapter` serves it.

    The application is built and its services started as the server starts (its lifespan).
    One that cannot start answers each request 503, as the buffered functions do, and is
    tried again by the next: the server does not exit, which Lambda would answer with a
    bare 502 and a new cold start.
    """
    from agentscope_serverless.log import format_as_json

    format_as_json("", "uvicorn", "uvicorn.error", "uvicorn.access")
    return _WebAdapterApplication(routers)


class _WebAdapterApplication:
    """The application of :func:`build_web_adapter_app`, started once it can be, and again,
    the secrets read anew, after a store refused a credential of theirs (as the buffered
    functions do, see :class:`_Restarts`).

    Requests are served concurrently: those a restart finds in flight, and the runs and
    background tasks of the services they started, go on with those services, which are
    stopped once nothing of theirs is left (or the server stops), while new requests are
    served by the new ones.
    """

    def __init__(self, routers: Sequence[str]) -> None:
        self._routers = tuple(routers)
        self._served: _Served | None = None
        self._starting = asyncio.Lock()
        self._restarts = _Restarts()
        # A store refused a credential of the secret: the next request starts again.
        self._stale = False
        # The stops of the services a restart left, once they are idle (or the server stops).
        self._stopping: set[asyncio.Task[None]] = set()
        self._stopped = asyncio.Event()

    async def _started(self) -> _Served:
        async with self._starting:
            if self._stale and self._served is not None:
                self._stale = False
                stopping = asyncio.ensure_future(_stop_when_idle(self._served, self._stopped))
                self._stopping.add(stopping)
                stopping.add_done_callback(self._stopping.discard)
                self._served = None
            if self._served is None:
                # The secrets are read off the event loop: the server acts on SIGTERM meanwhile.
                settings = await _in_daemon_thread(read_settings)
                app = build_app(self._routers, settings)
                lifespan = app.router.lifespan_context(app)
                await lifespan.__aenter__()
                self._served = _Served(app, lifespan)
            return self._served

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from agentscope_serverless.aws_secrets import credential_refusals

        if scope["type"] == "lifespan":
            await self._serve_lifespan(receive, send)
            return
        refusals = credential_refusals()
        try:
            served = await self._started()
        except Exception:
            if scope["type"] == "http":
                await _send_unavailable(scope, send)
            return
        served.requests += 1
        try:
            await served.asgi(scope, receive, send)
        finally:
            served.requests -= 1
            # Only the services serving new requests are started again.
            if served is self._served and self._restarts.due(refusals, served.app):
                self._stale = True

    async def _serve_lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self._start_unless_stopped()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                # Services a restart left stop now, whatever still runs on them.
                self._stopped.set()
                await asyncio.gather(*self._stopping)
                if self._served is not None:
                    await self._served.lifespan.__aexit__(None, None, None)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _start_unless_stopped(self) -> None:
        """Start the application as the server starts, unless the server is told to stop
        first (SIGTERM, SIGINT): a start waiting on Secrets Manager does not keep it from
        ending, and one that fails is logged (requests try it again)."""
        from agentscope_serverless.log import logger

        starting: asyncio.Future[Any] = asyncio.ensure_future(self._started())
        with _stop_signalled() as stopped:
            await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            logger.warning("the server was stopped as the function started")
            return
        try:
            starting.result()
        except Exception:
            _log_exception("the function could not start")


@contextlib.contextmanager
def _stop_signalled() -> Iterator[asyncio.Future[None]]:
    """A future done once the process is told to stop (SIGTERM, SIGINT) within the block,
    the server's own handlers of those signals still called (uvicorn's, which only note
    them while the application starts). Signals reach the main thread only: elsewhere, the
    future stays pending."""
    loop = asyncio.get_running_loop()
    stopped: asyncio.Future[None] = loop.create_future()
    if threading.current_thread() is not threading.main_thread():
        yield stopped
        return

    def note() -> None:
        if not stopped.done():
            stopped.set_result(None)

    previous: dict[int, Any] = {
        sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)
    }

    def handle(sig: int, frame: Any) -> None:
        loop.call_soon_threadsafe(note)
        handler = previous[sig]
        if callable(handler):
            handler(sig, frame)

    # Only a server's own handlers are wrapped: without one, the signal ends the process.
    wrapped = [sig for sig, handler in previous.items() if callable(handler)]
    for sig in wrapped:
        signal.signal(sig, handle)
    try:
        yield stopped
    finally:
        for sig in wrapped:
            if signal.getsignal(sig) is handle:
                signal.signal(sig, previous[sig])


async def _in_daemon_thread(function: Callable[[], _T]) -> _T:
    """``function()`` run in a daemon thread of its own, in a copy of this context, the event
    loop free meanwhile. A process ending does not wait for it, as it would for a thread of
    the loop's executor."""
    import contextvars

    loop = asyncio.get_running_loop()
    done: asyncio.Future[_T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def run() -> None:
        try:
            result, error = context.run(function), None
        except BaseException as exc:
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="agentscope-start", daemon=True).start()
    return await done


class _Served:
    """An application started by :class:`_WebAdapterApplication`, and how many of its
    requests are in flight."""

    def __init__(self, app: FastAPI, lifespan: contextlib.AbstractAsyncContextManager[Any]) -> None:
        self.app = app
        self.asgi = behind_web_adapter(app)
        # Kept until the services stop: its end stops them.
        self.lifespan = lifespan
        self.requests = 0

    def idle(self) -> bool:
        """Whether nothing runs on its services: no request, run or background task."""
        return self.requests == 0 and not self.app.state.context.executing()


async def _stop_when_idle(served: _Served, now: asyncio.Event) -> None:
    """Stop the services of ``served`` once it is idle (checked every ``_IDLE_SECONDS``: its
    runs and tasks end without telling), or once ``now`` is set (the server stops)."""
    while not (served.idle() or now.is_set()):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(now.wait(), _IDLE_SECONDS)
    await _stop_services(served.lifespan)


class _Restarts:
    """When a warm function starts again, reading the secrets anew: once a store refused a
    credential of theirs (a Redis password rotated since they were read; counted by
    :func:`~agentscope_serverless.aws_secrets.credential_refusals`), so that it is taken
    up without a cold start. At most once a ``RESTART_SECONDS``: a password wrong in the
    secret too must not make every request read it again."""

    def __init__(self) -> None:
        # When it last was due (time.monotonic()).
        self._at: float | None = None

    def due(self, before: int, app: FastAPI) -> bool:
        """Whether ``app`` should start again, a store having refused a credential since
        ``before`` (a count of refusals); the next invocation does, as the line logged
        says."""
        from agentscope_serverless.aws_secrets import credential_refusals
        from agentscope_serverless.log import logger

        if credential_refusals() == before:
            return False
        if not app.state.context.settings.secrets_arn:
            return False  # nothing to read again
        now = time.monotonic()
        if self._at is not None and now - self._at < RESTART_SECONDS:
            return False
        self._at = now
        logger.warning(
            "a store refused a credential of the secret (SECRETS_ARN): the next invocation "
            "reads the secret again"
        )
        return True


async def _stop_services(lifespan: contextlib.AbstractAsyncContextManager[Any]) -> None:
    """Stop the services of an application's ``lifespan`` (within ``_STOP_SECONDS``), for
    a new start."""
    from agentscope_serverless.log import logger

    try:
        await asyncio.wait_for(lifespan.__aexit__(None, None, None), _STOP_SECONDS)
    except Exception as exc:
        logger.warning("the services did not stop", extra={"error": type(exc).__name__})


async def _send_unavailable(scope: Scope, send: Send) -> None:
    """Answer that the function could not start (the cause is logged, not sent), under the
    invocation's id, as the application would."""
    from agentscope_serverless.http.middleware import (
        NO_STORE,
        request_ids_of,
        request_trace_ids,
    )
    from agentscope_serverless.log import bind_request_id, log_request

    request_id, client_request_id = request_ids_of(scope)
    bind_request_id(request_id, client_request_id, trace_ids=request_trace_ids(scope))
    _log_exception("the function could not start")
    log_request(
        request_id,
        scope.get("method"),
        scope.get("path"),
        503,
        0.0,
        client_request_id=client_request_id,
        failure={"code": "UNAVAILABLE"},
    )
    metrics = _environment_metrics()
    if metrics is not None:
        metrics.request_failed(code="UNAVAILABLE")
    body = _error_json("UNAVAILABLE", "the function could not start", 503).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode()),
        NO_STORE,
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def behind_web_adapter(app: FastAPI) -> ASGIApp:
    """``app`` served behind the Lambda Web Adapter, which turns each invocation into a
    request with headers of its own, replacing any a client sent under their names: each
    request's work ends by the time limit of its invocation (the ``deadline`` of the
    ``x-amzn-lambda-context`` header), less ``TIME_LIMIT_MARGIN_SECONDS``, and in iam mode
    the caller is the IAM identity of the ``x-amzn-request-context`` header (no other app
    reads it: a client could forge it)."""
    margin = app.state.context.settings.time_limit_margin_seconds
    return _WebAdapterInvocation(app, margin)


class _WebAdapterInvocation:
    """Pure ASGI middleware: the request's work ends by its invocation's deadline, and its
    request context is handed over to authentication."""

    def __init__(self, app: ASGIApp, margin: float) -> None:
        self.app = app
        self.margin = margin

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from agentscope_serverless.http.auth import web_adapter_request_context
        from agentscope_serverless.time_limit import ending_by

        deadline = None
        if scope["type"] == "http":
            deadline = _adapter_deadline(scope.get("headers", ()), self.margin)
            web_adapter_request_context(scope)
            _adapter_stage(scope)
        with ending_by(deadline):
            await self.app(scope, receive, send)


def _adapter_stage(scope: Scope) -> None:
    """An API Gateway stage the client requested the path under is the scope's root path,
    as it is for the buffered functions (:func:`_scope`): the routes see the path after it,
    and the URLs the application gives keep it. The adapter passes the path on with the
    stage (or, told to leave it out, without it: then the stage is put back in front)."""
    from agentscope_serverless.http.auth import request_context

    context = request_context(scope)
    if not isinstance(context, dict) or not isinstance(scope.get("path"), str):
        return
    path: str = scope["path"]
    stage = context.get("stage")
    if "http" in context:  # an HTTP API's (payload 2.0): the stage leads the path, if any
        root = _stage_path({"requestContext": context, "version": "2.0"}, path)
    elif context.get("path") == path:  # a REST API's, with the path as requested
        prefix = f"/{stage}"
        under_stage = stage != "$default" and (path + "/").startswith(prefix + "/")
        root = prefix if isinstance(stage, str) and under_stage else ""
    else:
        root = _stage_path({"requestContext": context, "path": path}, path)
        if root:  # the path came without the stage
            raw = scope.get("raw_path") or path.encode()
            scope["path"] = root if context.get("path") == root else root + path
            scope["raw_path"] = root.encode() + (b"" if scope["path"] == root else raw)
    if root:
        scope["root_path"] = root


def _adapter_deadline(headers: Sequence[tuple[bytes, bytes]], margin: float) -> float | None:
    """When the request's work must end (``time.time()``): the deadline of the Lambda
    context the Web Adapter sends, less ``margin``; None without one."""
    for name, value in headers:
        if name == LAMBDA_CONTEXT_HEADER:
            try:
                deadline_ms = json.loads(value).get("deadline")
            except (ValueError, AttributeError, RecursionError):
                return None
            number = isinstance(deadline_ms, int | float) and not isinstance(deadline_ms, bool)
            if number and math.isfinite(deadline_ms):  # JSON's NaN and Infinity are none
                return _work_deadline(float(deadline_ms) / 1000, margin)
            return None
    return None


def _invocation_deadline(context: Any, margin: float) -> float | None:
    """When the invocation's work must end (``time.time()``): its Lambda context's remaining
    time less ``margin``; None without a Lambda context."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if not callable(remaining):
        return None
    try:
        milliseconds = float(remaining())
    except (TypeError, ValueError):
        return None
    return _work_deadline(time.time() + milliseconds / 1000, margin)


def _work_deadline(deadline: float, margin: float) -> float:
    """When work must end for the invocation's ``deadline``: ``margin`` before it, or half
    the time left when that is shorter (a function whose time limit is under twice the
    margin still does its work)."""
    left = max(deadline - time.time(), 0.0)
    return deadline - min(margin, left / 2)


class _LazyApplication:
    def __init__(self, routers: Sequence[str]) -> None:
        self._routers = tuple(routers)
        self._app: FastAPI | None = None
        # Kept for the life of the environment: its end would stop the services.
        self._lifespan: contextlib.AbstractAsyncContextManager[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._restarts = _Restarts()
        # A store refused a credential of the secret: the next invocation starts again.
        self._stale = False

    def _start(self) -> tuple[FastAPI, asyncio.AbstractEventLoop]:
        """The application, its services started in the event loop every invocation runs
        in (once: a failed start is tried again by the next invocation; and again, the
        secrets read anew, after a store refused a credential of theirs)."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        if self._stale:
            self._stale = False
            lifespan, self._lifespan, self._app = self._lifespan, None, None
            if lifespan is not None:
                self._loop.run_until_complete(_stop_services(lifespan))
        if self._app is None:
            app = build_app(self._routers)
            lifespan = app.router.lifespan_context(app)
            self._loop.run_until_complete(lifespan.__aenter__())
            self._lifespan, self._app = lifespan, app
        return self._app, self._loop

    def __call__(self, event: Any, context: Any) -> dict[str, Any]:
        from agentscope_serverless.aws_secrets import credential_refusals

        refusals = credential_refusals()
        try:
            return self._invoke(event, context)
        finally:
            if self._app is not None and self._restarts.due(refusals, self._app):
                self._stale = True

    def _invoke(self, event: Any, context: Any) -> dict[str, Any]:
        from agentscope_serverless.log import bind_request_id, trace_ids_of
        from agentscope_serverless.tasks import TASK_EVENT_KEY

        # Every line of the invocation carries its id and its X-Ray trace id, whatever the
        # event (the request's are bound again by the application, with the id its client
        # sent).
        trace_ids = trace_ids_of(os.environ.get("_X_AMZN_TRACE_ID"), None)
        bind_request_id(_aws_request_id(context), trace_ids=trace_ids)
        if isinstance(event, dict) and TASK_EVENT_KEY in event:
            return self._run_task(event, context)
        event = _headers_by_one_name(event)
        handler = _http_handler(event, context)
        if handler is None:
            return _unsupported(event)
        try:
            app, loop = self._start()
        except Exception:
            message = "the function could not start"
            return _error(handler, 503, "UNAVAILABLE", message, log=True)
        try:
            scope = _scope(handler, event)
            body = _body(handler, event)
        except _Unreadable as exc:
            return _error(handler, 400, "BAD_REQUEST", str(exc))
        except binascii.Error:
            message = "the request body is not valid base64 (isBase64Encoded is true)"
            return _error(handler, 400, "BAD_REQUEST", message)
        except UnicodeError:
            return _error(handler, 400, "BAD_REQUEST", "the request body is not valid Unicode")
        except (AttributeError, TypeError, ValueError):
            return _error(handler, 400, "BAD_REQUEST", "the request body is malformed")
        from agentscope_serverless.time_limit import ending_by

        margin = app.state.context.settings.time_limit_margin_seconds
        with ending_by(_invocation_deadline(context, margin)):
            try:
                return _serve(loop, app, handler, scope, body)
            except Exception:
                message = "internal server error"
                return _error(handler, 500, "INTERNAL_ERROR", message, log=True, app=app)

    def _run_task(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        """Run a background task sent by an asynchronous invocation (not a Function URL).

        An error before the task runs (a store unreachable) is raised, so that Lambda
        invokes again; the task runs at most once all the same.
        """
        from agentscope_serverless.tasks import run_task_event
        from agentscope_serverless.time_limit import ending_by

        app, loop = self._start()
        app_context = app.state.context
        agent_app = app_context.agent_app
        tasks = agent_app.tasks if agent_app is not None else []
        deadline = _invocation_deadline(context, app_context.settings.time_limit_margin_seconds)
        with ending_by(deadline):
            work = run_task_event(app_context.runs, tasks, event, app_context.idempotency)
            outcome = loop.run_until_complete(work)
        return {"status": outcome}


def _http_handler(event: Any, context: Any) -> MangumHandler | None:
    """Mangum's handler of an HTTP request event (None for any other event)."""
    if not isinstance(event, dict):
        return None
    from mangum.adapter import DEFAULT_TEXT_MIME_TYPES, HANDLERS
    from mangum.types import LambdaConfig

    config = LambdaConfig(
        api_gateway_base_path="/", text_mime_types=[*DEFAULT_TEXT_MIME_TYPES], exclude_headers=[]
    )
    for handler_class in HANDLERS:
        try:
            if handler_class.infer(event, context, config):
                return handler_class(event, context, config)
        except (AttributeError, KeyError, TypeError):
            return None
    return None


def _headers_by_one_name(event: Any) -> Any:
    """``event`` with each header of its ``headers`` and ``multiValueHeaders`` under one
    name. API Gateway lists headers by the names the client spelt, ``X-User-Id`` apart from
    ``x-user-id``, and Mangum kept one of them, the last, where they are one header (names
    differ in case only): a request naming two users acted as one. All their values are
    kept, so that a header given more than once is refused as such."""
    if not isinstance(event, dict):
        return event
    merged = dict(event)
    for field in ("headers", "multiValueHeaders"):
        headers = event.get(field)
        if isinstance(headers, dict):
            merged[field] = _one_name_each(headers, multi_value=field == "multiValueHeaders")
    return merged


def _one_name_each(headers: dict[Any, Any], *, multi_value: bool) -> dict[Any, Any]:
    """``headers`` with the names that differ in case only made one, lower-case: the lists
    of values (``multi_value``) joined, or the values joined by ``,`` (as API Gateway and
    Function URLs join a repeated header's). Headers not of that form are left as they are,
    for the request to be refused as malformed."""
    merged: dict[Any, Any] = {}
    for name, value in headers.items():
        key = name.lower() if isinstance(name, str) else name
        if key not in merged:
            merged[key] = value
        elif multi_value and isinstance(merged[key], list) and isinstance(value, list):
            merged[key] = [*merged[key], *value]
        elif not multi_value and isinstance(merged[key], str) and isinstance(value, str):
            merged[key] = f"{merged[key]},{value}"
        else:
            return headers
    return merged if len(merged) < len(headers) else headers


class _Unreadable(ValueError):
    """An HTTP event whose request cannot be read; the message says why."""


def _body(handler: MangumHandler, event: dict[str, Any]) -> bytes:
    """The request's body, one marked base64 decoded strictly (``binascii.Error`` when it is
    not base64): Mangum's decoding drops what is not, so ``@@@@`` was read as an empty body
    and ``e30=!!!`` as ``{}``."""
    if not event.get("isBase64Encoded"):
        return handler.body
    sent = event.get("body") or b""
    if isinstance(sent, str):
        # Not base64 either way: a character past ASCII becomes "?", which base64 has not.
        sent = sent.encode("ascii", "replace")
    return base64.b64decode(sent, validate=True)


def _scope(handler: MangumHandler, event: dict[str, Any]) -> Scope:
    """The ASGI scope of the request, its path and (ALB) query as sent.

    Mangum encodes the headers and query string outside the application, where a failure
    would be an invocation error: an event that does not encode is refused here instead.
    It also decodes the path without keeping it as sent (an HTTP API's ``http.path``, which
    may be decoded already, a second time), and an ALB's query parameters with U+FFFD for
    what is not UTF-8: the request's own path and query go in the scope, so the
    application refuses them (as ``/sessions/%FE`` and ``/sessions/%FF`` are not one
    session) as it does behind any server. An API Gateway stage in the path the client
    requested is the scope's root path: the routes see the path after it, and the URLs the
    application gives (its docs, an A2A card) keep it; so is the base path of a custom
    domain's mapping, which leads the path of a request to it.
    """
    try:
        scope = handler.scope
        raw_path = event.get("rawPath") if event.get("version") == "2.0" else event.get("path")
        if isinstance(raw_path, str):
            scope["raw_path"] = raw_path.encode()
            if event.get("version") == "2.0":  # as sent: http.path may be decoded already
                scope["path"] = unquote(raw_path) or "/"
        stage = _stage_path(event, scope["path"])
        if stage and not _of_http_api(event):  # a REST API gives the path without it
            # The stage's invoke URL itself (``/prod``) comes as the path ``/``: it stays
            # the stage alone, so that it is redirected to ``/prod/``.
            at_stage = event["requestContext"].get("path") == stage
            scope["path"] = stage if at_stage else stage + scope["path"]
            scope["raw_path"] = stage.encode() + (b"" if at_stage else scope["raw_path"] or b"")
        scope["root_path"] = stage or _base_path(event, scope["path"])
        if "elb" in event["requestContext"]:
            scope["query_string"] = _alb_query(event)
    except UnicodeError:
        raise _Unreadable(
            "the request's headers, path or query string are not valid Unicode"
        ) from None
    except (AttributeError, KeyError, TypeError, ValueError):
        raise _Unreadable("the request event is malformed") from None
    return scope


def _of_http_api(event: dict[str, Any]) -> bool:
    """Whether ``event`` is an HTTP API's (or a Function URL's), in either payload format
    (its ``version``): a REST API's has none."""
    return event.get("version") in ("1.0", "2.0")


def _stage_path(event: dict[str, Any], path: str) -> str:
    """``/<stage>`` when the client requested ``path`` under an API Gateway stage, else
    ``""``. An HTTP API puts a stage other than ``$default`` at the start of the path of a
    request to its own endpoint (``<api id>.execute-api.<region>.amazonaws.com``), not of
    one to a custom domain, in either payload format; a REST API gives the path without
    the stage, and the path as requested in its request context."""
    context = event["requestContext"]
    stage = context.get("stage")
    if not isinstance(stage, str) or stage == "$default":
        return ""
    prefix = f"/{stage}"
    if _of_http_api(event):
        api, domain = context.get("apiId"), context.get("domainName")
        on_api_endpoint = isinstance(api, str) and str(domain).startswith(f"{api}.execute-api.")
        return prefix if on_api_endpoint and (path + "/").startswith(prefix + "/") else ""
    requested, path_given = context.get("path"), event.get("path", "")
    at_stage = requested == prefix and path_given == "/"  # the invoke URL, without its "/"
    return prefix if at_stage or requested == prefix + path_given else ""


def _base_path(event: dict[str, Any], path: str) -> str:
    """The part of ``path`` before what the API's route matched: the base path of the
    custom domain's mapping the request came through (``/agent`` of
    ``https://api.example.com/agent/process`` mapped to the API), else ``""``. The route
    matched is its template (the event's ``resource``, or its ``routeKey``'s path) with the
    request's path parameters."""
    route: Any = event.get("resource")
    if event.get("version") == "2.0":
        route = str(event.get("routeKey") or "").partition(" ")[2]
    parameters = event.get("pathParameters") or {}
    if not isinstance(route, str) or not route.startswith("/") or not isinstance(parameters, dict):
        return ""
    try:
        matched = re.sub(r"\{([^{}]+?)\+?\}", lambda m: str(parameters[m.group(1)]), route)
    except KeyError:
        return ""
    requested = path.rstrip("/")
    # The parameters come decoded, as ``path`` is: decoding them again would turn a session
    # ``a%41`` into ``aA``. Ones left as sent are decoded here.
    for candidate in (matched.rstrip("/"), unquote(matched).rstrip("/")):
        if requested.endswith(candidate):
            return requested[: len(requested) - len(candidate)]
    return ""


def _alb_query(event: dict[str, Any]) -> bytes:
    """An ALB event's query string as the client sent it (the ALB does not decode it)."""
    params = event.get("multiValueQueryStringParameters") or event.get("queryStringParameters")
    if not params:
        return b""
    pairs = [
        f"{name}={value}" if value else name
        for name, values in params.items()
        for value in ([values] if isinstance(values, str) else values)
    ]
    return "&".join(pairs).encode()


def _serve(
    loop: asyncio.AbstractEventLoop,
    app: FastAPI,
    handler: MangumHandler,
    scope: Scope,
    body: bytes,
) -> dict[str, Any]:
    """Run the request through the application (in ``loop``) and answer in its event's
    shape, within Lambda's limit of a buffered response."""
    from mangum.protocols import HTTPCycle

    cycle = HTTPCycle(scope, body)
    loop.run_until_complete(cycle.run(_ending_cleanly(app)))
    limit = _response_limit(handler)
    # A HEAD request's answer is a GET's without its body (which a server would leave out,
    # and Mangum does not), so a GET's too large is one too: the application answers HEAD
    # without the body, and a body that may not fit (see _too_large) is asked for as GET.
    head = scope["method"] == "HEAD"
    if head and _may_not_fit(cycle.headers, limit):
        cycle = HTTPCycle({**scope, "method": "GET"}, body)
        loop.run_until_complete(cycle.run(_ending_cleanly(app)))
    response: Response = {"status": cycle.status, "headers": cycle.headers, "body": cycle.body}
    if head and len(cycle.body) < limit // 8:
        return _answer(handler, {**response, "body": b""})
    answer = _answer(handler, response)
    if _too_large(answer, limit):
        response = _within_limit(handler, response, limit, _route_path(scope))
        answer = _answer(handler, {**response, "body": b""} if head else response)
    elif head:
        answer = _answer(handler, {**response, "body": b""})
    return answer


def _answer(handler: MangumHandler, response: Response) -> dict[str, Any]:
    """``response`` in the shape of the request's event, its headers read as Latin-1, as
    HTTP has them (and Starlette encodes them): Mangum reads them as UTF-8, so a value past
    ASCII (a download's ``filename="café.txt"``) made the finished response an error."""
    headers = [
        [bytes(name).decode("latin-1").encode(), bytes(value).decode("latin-1").encode()]
        for name, value in response["headers"]
    ]
    answer: dict[str, Any] = handler({**response, "headers": headers})
    return answer


def _may_not_fit(headers: Sequence[Sequence[bytes]], limit: int) -> bool:
    """Whether the body a HEAD answer's headers announce (its ``Content-Length``) may not
    fit in ``limit`` (an event stream is cut to fit: its status stays)."""
    for name, value in headers:
        name = bytes(name).lower()
        if name == b"content-type" and bytes(value).startswith(_EVENT_STREAM.encode()):
            return False
    for name, value in headers:
        if bytes(name).lower() == b"content-length":
            return bytes(value).strip().isdigit() and int(value) >= limit // 8
    return False


def _route_path(scope: Scope) -> str:
    """The request's path as its routes see it: after the scope's root path (an API
    Gateway stage, a custom domain's base path)."""
    path, root = str(scope.get("path") or "/"), str(scope.get("root_path") or "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path or "/"


def _response_limit(handler: MangumHandler) -> int:
    """The most the caller of the request's event takes from the function, in bytes."""
    from mangum.handlers import ALB

    return ALB_RESPONSE_LIMIT_BYTES if isinstance(handler, ALB) else RESPONSE_LIMIT_BYTES


def _ending_cleanly(app: ASGIApp) -> ASGI:
    """``app``, whose response, once begun, ends with what was sent when an error comes (as
    a server cuts its connection: a stream's client resumes after its last event), where
    Mangum would replace the whole of it with a plain-text 500."""
    from agentscope_serverless.log import logger

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        started = ended = False

        async def tracking(message: Message) -> None:
            nonlocal started, ended
            started = started or message["type"] == "http.response.start"
            ended = message["type"] == "http.response.body" and not message.get("more_body")
            await send(message)

        try:
            await app(scope, receive, tracking)
        except Exception:
            if not started:
                raise
            if not ended:  # else the application has answered the error itself
                logger.exception("the response failed after it began")
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        if started and not ended:  # left unfinished by a failure, logged already
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    return asgi


def _too_large(answer: dict[str, Any], limit: int) -> bool:
    """Whether ``answer`` is more than ``limit`` bytes; one whose body is shorter than an
    eighth of it fits whatever its characters (JSON takes at most 6 bytes for one), so it
    is not measured."""
    if len(answer.get("body") or "") < limit // 8:
        return False
    size = len(json.dumps(answer, ensure_ascii=False).encode())
    return size > limit - _RESPONSE_SLACK_BYTES


def _within_limit(handler: MangumHandler, response: Response, limit: int, path: str) -> Response:
    """A response too large to return, made to fit: an event stream cut after its last
    event that fits, with an error event saying so; else an error saying what to do
    instead. What it says fits the route (``path``, as its routes see it): a run's stream
    names the run to read on from, an A2A answer is a JSON-RPC error naming its task, a page
    says to ask for fewer items (or that its one item cannot fit), anything else says to
    return less or use the streaming process function."""
    from agentscope_serverless.log import logger

    headers = [[bytes(k).lower(), bytes(v)] for k, v in response["headers"]]
    kept = [[k, v] for k, v in headers if k.decode("latin-1") in _KEPT_HEADERS]
    run_id = next((v.decode("latin-1") for k, v in kept if k == b"x-run-id"), None)
    content_type = next((v.decode("latin-1") for k, v in headers if k == b"content-type"), "")
    size = len(response["body"])
    most = (
        f"the {limit} bytes an ALB takes from a Lambda function"
        if limit == ALB_RESPONSE_LIMIT_BYTES
        else f"the {limit} bytes a buffered Lambda function can return"
    )
    on_runs = _RUN_EVENTS_PATH.fullmatch(path)
    run_id = run_id or (on_runs.group(1) if on_runs else None)
    logger.warning("a response was too large for Lambda", extra={"bytes": size, "run_id": run_id})
    a2a = path == _A2A_PATH or path.startswith(_A2A_PATH + "/")
    if content_type.startswith(_EVENT_STREAM):
        try:
            text = bytes(response["body"]).decode()
        except UnicodeDecodeError:
            text = None
        if text is not None:
            stream_headers = [[k, v] for k, v in headers if k != b"content-length"]
            bare = _answer(
                handler, {"status": response["status"], "headers": stream_headers, "body": b""}
            )
            room = limit - _RESPONSE_SLACK_BYTES - _TRAILER_ROOM
            room -= len(json.dumps(bare, ensure_ascii=False).encode())
            # The trailer takes _TRAILER_ROOM at most, but for ids of unusual length.
            cut, trailer = _stream_end(text, room, most, path, run_id)
            excess = _json_bytes(trailer) - _TRAILER_ROOM
            if excess > 0:
                cut, trailer = _stream_end(text, room - excess, most, path, run_id)
            stream = (text[: cut.end] + trailer).encode()
            return {"status": response["status"], "headers": stream_headers, "body": stream}
    if a2a:
        status, body = _a2a_too_large(bytes(response["body"]), size, most, rpc=path == _A2A_PATH)
    else:
        status = 500
        message = f"the response is {size} bytes: more than {most}. " + _json_advice(
            bytes(response["body"]), path, run_id
        )
        body = _error_json("RESPONSE_TOO_LARGE", message)
    return {
        "status": status,
        "headers": [
            [b"content-type", b"application/json"],
            [b"x-should-retry", b"false"],
            *kept,
        ],
        "body": body.encode(),
    }


# The routes whose answers too large are told apart (the paths their routes see).
_A2A_PATH = "/a2a"
_RUN_EVENTS_PATH = re.compile(r"/runs/([^/]+)/events/?")
_SESSION_PATH = re.compile(r"/sessions/([^/]+)/?")
_SESSION_MESSAGES_PATH = re.compile(r"/sessions/([^/]+)/messages/?")
# An event of an event stream ends with an empty line; a line ends with CRLF, LF or CR
# (sse-starlette, which serves A2A's streams, ends them with CRLF).
_EVENT_END = re.compile(r"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")
_EVENT_ID = re.compile(r"(?:^|[\r\n])id: ?(\d+)(?:[\r\n]|$)")
# Kept free in a cut stream for the error event ending it.
_TRAILER_ROOM = 2048
_STREAMING_FUNCTION = (
    "the streaming process function (deployed with ProcessInvokeMode RESPONSE_STREAM), "
    "which returns up to 200 MB"
)
# JSON-RPC's internal error, as the A2A SDK answers a failure of its own.
_JSON_RPC_INTERNAL_ERROR = -32603


class _Cut:
    """Where an event stream too large is cut: ``end``, after its last event that fits in
    the room; ``following``, the first event left out (None when none is); ``alone``, true
    when that event does not fit in the room by itself (no answer of this function can
    hold it); ``newline``, the stream's line ending."""

    def __init__(self, end: int, following: str | None, alone: bool, newline: str) -> None:
        self.end, self.following, self.alone, self.newline = end, following, alone, newline

    @classmethod
    def of(cls, text: str, room: int) -> _Cut:
        whole_room, end, newline = room, 0, "\n"
        for number, match in enumerate(_EVENT_END.finditer(text)):
            if number == 0 and match.group().startswith("\r"):
                newline = "\r\n" if match.group().startswith("\r\n") else "\r"
            event_bytes = _json_bytes(text[end : match.end()])
            if event_bytes > room:
                following = text[end : match.end()]
                return cls(end, following, event_bytes > whole_room, newline)
            room -= event_bytes
            end = match.end()
        return cls(end, None, False, newline)

    def following_id(self) -> str | None:
        """The ``id`` of the first event left out (None without one)."""
        found = _EVENT_ID.search(self.following or "")
        return found.group(1) if found else None

    def following_bytes(self) -> int:
        return len((self.following or "").encode())


def _stream_end(text: str, room: int, most: str, path: str, run_id: str | None) -> tuple[_Cut, str]:
    """Where the event stream ``text`` is cut to fit in ``room`` bytes of JSON, and the
    event ending it there, saying what to do for the rest (see :func:`_within_limit`)."""
    cut = _Cut.of(text, room)
    if path == _A2A_PATH or path.startswith(_A2A_PATH + "/"):
        return cut, _a2a_stream_end(text, cut, most, rpc=path == _A2A_PATH)
    if run_id:
        return cut, _run_stream_end(run_id, cut, most)
    message = (
        f"the stream was cut here: it reached {most}. Send less, or serve it from "
        f"{_STREAMING_FUNCTION}"
    )
    return cut, _sse(_error_json("RESPONSE_TOO_LARGE", message), cut.newline, "error")


def _sse(data: str, newline: str, event: str | None = None) -> str:
    """One event of an event stream (``data`` is one line), its lines ended by ``newline``."""
    named = f"event: {event}{newline}" if event else ""
    return f"{named}data: {data}{newline}{newline}"


def _run_stream_end(run_id: str, cut: _Cut, most: str) -> str:
    """The error event ending a run's stream cut at ``cut``: read on from the stored run;
    an event that no buffered answer can hold is named, with the ways to get it, or past it
    (resuming before it would return it again, for ever)."""
    where = f"GET /runs/{run_id}/events"
    if not cut.alone:
        message = (
            f"the stream was cut here: it reached {most}. The run {run_id} is stored: read "
            f"the rest with {where}, Last-Event-ID set to the last id received (or deploy the "
            "process function with ProcessInvokeMode RESPONSE_STREAM)"
        )
    else:
        event_id = cut.following_id()
        named = f"its next event (id {event_id})" if event_id else "its next event"
        message = (
            f"the stream was cut here: {named} is {cut.following_bytes()} bytes by itself, "
            f"more than {most}, so this function cannot return it, however it is resumed. "
            f"Read it from {_STREAMING_FUNCTION}: {where}, Last-Event-ID set to the last id "
            "received"
        )
        if event_id:
            message += (
                f"; or go on past it here: {where} with Last-Event-ID {event_id} (the "
                "events after it)"
            )
    return _sse(_error_json("RESPONSE_TOO_LARGE", message), cut.newline, "error")


def _a2a_ids(answer: Any) -> tuple[Any, str | None, str | None]:
    """The JSON-RPC id, the task id and the run id an A2A answer (a JSON-RPC response, or an
    event of a stream) gives, each None when it gives none (A2A 1.0's and 0.3's shapes)."""
    if not isinstance(answer, dict):
        return None, None, None
    result = answer.get("result", answer)
    task_id = run_id = None
    if isinstance(result, dict):
        for key in ("task", "statusUpdate", "artifactUpdate"):
            if isinstance(result.get(key), dict):
                result = result[key]
                break
        task_id = result.get("taskId") or (
            result.get("id") if result.get("kind", "task") == "task" else None
        )
        artifact = result.get("artifact")
        for holder in (result, artifact if isinstance(artifact, dict) else {}):
            metadata = holder.get("metadata")
            if isinstance(metadata, dict) and isinstance(metadata.get("run_id"), str):
                run_id = metadata["run_id"]
    return (
        answer.get("id"),
        task_id if isinstance(task_id, str) else None,
        run_id,
    )


def _a2a_message(lead: str, task_id: str | None, run_id: str | None) -> str:
    """What an A2A answer too large says after ``lead``: which task, and how to get its
    reply whole (the task has ended: following it, SubscribeToTask, is refused; reading
    it, GetTask, here answers its whole reply, too large as well)."""
    if task_id:
        run = f" (run {run_id})" if run_id else ""
        return (
            f"{lead}. Task {task_id}{run} is stored: read it whole with GetTask (tasks/get) "
            f"from {_STREAMING_FUNCTION}"
        )
    return f"{lead}. Send the message to {_STREAMING_FUNCTION}"


def _a2a_stream_end(text: str, cut: _Cut, most: str, *, rpc: bool) -> str:
    """The event ending an A2A stream cut at ``cut``: on the JSON-RPC route, a JSON-RPC
    error response (what its clients read), naming the task and its run."""
    request_id = task_id = run_id = None
    start = 0
    for match in _EVENT_END.finditer(text):
        event = text[start : match.end()]
        start = match.end()
        data = "\n".join(
            line[5:].removeprefix(" ") for line in event.splitlines() if line.startswith("data:")
        )
        try:
            answer = json.loads(data)
        except ValueError:
            continue
        found = _a2a_ids(answer)
        request_id = request_id if request_id is not None else found[0]
        task_id, run_id = task_id or found[1], run_id or found[2]
        if task_id and run_id:
            break
    message = _a2a_message(f"the stream was cut here: it reached {most}", task_id, run_id)
    if not rpc:
        return _sse(_error_json("RESPONSE_TOO_LARGE", message), cut.newline, "error")
    return _sse(_json_rpc_too_large(request_id, message, task_id, run_id), cut.newline)


def _a2a_too_large(body: bytes, size: int, most: str, *, rpc: bool) -> tuple[int, str]:
    """The status and body answering an A2A answer too large: on the JSON-RPC route, a
    JSON-RPC error response (HTTP 200, as the SDK answers its errors)."""
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    request_id, task_id, run_id = _a2a_ids(answer)
    message = _a2a_message(f"the answer is {size} bytes: more than {most}", task_id, run_id)
    if not rpc:
        return 500, _error_json("RESPONSE_TOO_LARGE", message)
    return 200, _json_rpc_too_large(request_id, message, task_id, run_id)


def _json_rpc_too_large(
    request_id: Any, message: str, task_id: str | None, run_id: str | None
) -> str:
    data = {"code": "RESPONSE_TOO_LARGE", "taskId": task_id, "runId": run_id}
    error = {"code": _JSON_RPC_INTERNAL_ERROR, "message": message, "data": data}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}, separators=(",", ":"))


def _json_advice(body: bytes, path: str, run_id: str | None) -> str:
    """What to do instead of asking for a JSON answer too large from ``path``."""
    if run_id:
        return (
            f"The run {run_id} is stored: read its events with GET /runs/{run_id}/events, "
            f"a part at a time (Last-Event-ID), or whole from {_STREAMING_FUNCTION}"
        )
    session = _SESSION_PATH.fullmatch(path)
    if session:
        return (
            "Read the session's messages a page at a time: "
            f"GET /sessions/{session.group(1)}/messages"
        )
    items = _page_items(body)
    if items is not None:
        asked = "page_size" if path.rstrip("/") == "/memory" else "limit"
        if items > 1:
            return f"Ask for less at a time: a page with a smaller {asked} (this one holds {items})"
        advice = (
            "The page's one item is larger than that by itself: no page holding it fits, "
            f"whatever its {asked}, and no buffered function can return it"
        )
        messages = _SESSION_MESSAGES_PATH.fullmatch(path)
        if messages:
            session_id = messages.group(1)
            advice += (
                f". The session's runs (GET /runs?session_id={session_id}) hold it: read "
                f"their events (GET /runs/{{id}}/events) from {_STREAMING_FUNCTION}"
            )
        return advice
    return f"Return less, or serve it from {_STREAMING_FUNCTION}"


def _page_items(body: bytes) -> int | None:
    """The number of items of a page (a JSON object with an ``items`` list); None for any
    other answer."""
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    if isinstance(answer, dict) and isinstance(answer.get("items"), list):
        return len(answer["items"])
    return None


def _json_bytes(text: str | bytes) -> int:
    """The bytes ``text`` takes inside a JSON string."""
    if isinstance(text, bytes):
        text = text.decode()
    return len(json.dumps(text, ensure_ascii=False).encode()) - 2


def _error_json(code: str, message: str, status: int = 500) -> str:
    from agentscope_serverless.http.errors import error_body

    return json.dumps(error_body(code, message, status=status), separators=(",", ":"))


def _log_exception(message: str, *, extra: dict[str, Any] | None = None) -> None:
    """Log ``message`` with the exception being handled: an invalid setting as one line
    saying which and why (as ``serve`` prints it), any other with its traceback."""
    from agentscope_serverless.errors import ConfigurationError
    from agentscope_serverless.log import logger

    exc = sys.exception()
    if isinstance(exc, ConfigurationError):
        logger.error(f"{message}: {exc.message}", extra=extra, stacklevel=2)
    else:
        logger.exception(message, extra=extra, stacklevel=2)


def _environment_metrics() -> RunMetrics | None:
    """The metrics writer of ``METRICS_NAMESPACE``, for a function that could not start
    (its settings, maybe invalid, not read): None when unset or not a namespace."""
    from agentscope_serverless.metrics import run_metrics
    from agentscope_serverless.settings import Settings

    try:
        namespace = Settings._namespace(os.environ.get("METRICS_NAMESPACE") or None)
    except ValueError:
        return None
    return run_metrics(namespace)


def _error(
    handler: MangumHandler,
    status: int,
    code: str,
    message: str,
    *,
    log: bool = False,
    app: FastAPI | None = None,
) -> dict[str, Any]:
    """An error answered outside the application, in the shape of the request's event; a
    server error writes its metric (the metrics of ``app``, started, else of the
    environment's ``METRICS_NAMESPACE``)."""
    from agentscope_serverless.http.middleware import NO_STORE, request_ids_of
    from agentscope_serverless.log import log_request

    # The invocation's id and the client's, as in the application (see ``request_ids_of``).
    event = getattr(handler, "event", None)
    scope: dict[str, Any] = {
        "headers": [
            (b"x-request-id", value.encode("latin-1", "replace"))
            for value in _sent_request_ids(event)
        ],
        "aws.context": getattr(handler, "context", None),
    }
    request_id, client_request_id = request_ids_of(scope)
    if log:
        _log_exception(message, extra={"request_id": request_id})
    method, path = _method_and_path(event)
    log_request(
        request_id,
        method,
        path,
        status,
        0.0,
        client_request_id=client_request_id,
        failure={"code": code},
    )
    if status >= 500:
        metrics = _environment_metrics() if app is None else getattr(app, "request_metrics", None)
        if metrics is not None:
            metrics.request_failed(code=code)
    body = _error_json(code, message, status).encode()
    headers = [
        [b"content-type", b"application/json"],
        [b"x-request-id", request_id.encode()],
        list(NO_STORE),
    ]
    try:
        answer: dict[str, Any] = handler({"status": status, "headers": headers, "body": body})
    except Exception:  # the event is too malformed for its own shape: the common one
        answer = {
            "statusCode": status,
            "headers": {k.decode(): v.decode() for k, v in headers},
            "body": body.decode(),
            "isBase64Encoded": False,
        }
    return answer


def _sent_request_ids(event: Any) -> list[str]:
    """The values of the ``X-Request-Id`` headers of a request event, as text: of its
    ``headers`` then of its ``multiValueHeaders`` (an ALB's with multi-value headers turned
    on has only those)."""
    if not isinstance(event, dict):
        return []
    sent: list[str] = []
    for field in ("headers", "multiValueHeaders"):
        headers = event.get(field)
        for name, values in headers.items() if isinstance(headers, dict) else ():
            if isinstance(name, str) and name.lower() == "x-request-id":
                listed = values if isinstance(values, list) else [values]
                sent.extend(value for value in listed if isinstance(value, str))
    return sent


def _aws_request_id(context: Any) -> str | None:
    """The id of the invocation of a Lambda ``context`` (None without one)."""
    invocation = getattr(context, "aws_request_id", None)
    return invocation if isinstance(invocation, str) and invocation else None


def _method_and_path(event: Any) -> tuple[str | None, str | None]:
    """The method and (decoded) path of a request event, as the application logs them;
    None for what the event does not give as text."""
    if not isinstance(event, dict):
        return None, None
    context = event.get("requestContext")
    http = context.get("http") if isinstance(context, dict) else None
    if event.get("version") == "2.0" and isinstance(http, dict):
        method, path = http.get("method"), event.get("rawPath", http.get("path"))
    else:
        method, path = event.get("httpMethod"), event.get("path")
    return (
        method if isinstance(method, str) else None,
        unquote(path) if isinstance(path, str) else None,
    )


def _unsupported(event: Any) -> dict[str, Any]:
    """The answer to an event that is neither an HTTP request nor a background task's."""
    from agentscope_serverless.http.errors import error_body
    from agentscope_serverless.log import logger

    kind = type(event).__name__
    logger.warning("an event of an unsupported kind was refused", extra={"event_type": kind})
    message = (
        "this function answers HTTP requests (Lambda Function URL, API Gateway or ALB "
        "events) and runs its background tasks; this event is neither"
    )
    return error_body("UNSUPPORTED_EVENT", message, status=400)


def make_handler(routers: Sequence[str]) -> LambdaHandler:
    """A Lambda handler serving ``routers`` (plus ``/health``) for Function URL events; the
    records of the runtime's root logger are written as JSON lines, as ours are."""
    from agentscope_serverless.log import format_as_json

    format_as_json()
    import_runtime(routers)
    return _LazyApplication(routers)


__all__ = [
    "ALB_RESPONSE_LIMIT_BYTES",
    "LAMBDA_CONTEXT_HEADER",
    "RESPONSE_LIMIT_BYTES",
    "RESTART_SECONDS",
    "behind_web_adapter",
    "build_app",
    "build_web_adapter_app",
    "import_runtime",
    "make_handler",
    "read_settings",
]
