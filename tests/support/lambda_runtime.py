"""A Lambda Runtime API of our own, to run built functions the way Lambda does, without Docker.

The real runtime interface client (``awslambdaric``) polls this server for invocations and
posts results back, buffered or streamed (``Lambda-Runtime-Function-Response-Mode:
streaming``), exactly as it does inside Lambda. Events are Function URL (payload 2.0) events.

>>> with LambdaRuntimeAPI() as api:        # doctest: +SKIP
...     result = api.invoke(function_url_event("GET", "/health"))
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

PRELUDE_SEPARATOR = b"\x00" * 8
RUNTIME_PREFIX = "/2018-06-01/runtime"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Invocation:
    """What the function answered to one event."""

    request_id: str
    kind: str  # "response" or "error"
    body: bytes
    streamed: bool
    chunk_times: list[float] = field(default_factory=list)

    def http_response(self) -> tuple[int, dict[str, str], bytes]:
        """The HTTP response a Function URL caller would get: status, headers, body."""
        if self.kind != "response":
            raise AssertionError(f"function failed: {self.body.decode(errors='replace')}")
        if self.streamed:
            prelude, _, body = self.body.partition(PRELUDE_SEPARATOR)
            meta = json.loads(prelude) if prelude else {}
            return meta.get("statusCode", 200), meta.get("headers", {}), body
        payload = json.loads(self.body)
        body = payload.get("body") or ""
        raw = base64.b64decode(body) if payload.get("isBase64Encoded") else body.encode()
        return payload.get("statusCode", 200), payload.get("headers") or {}, raw


def function_url_event(
    method: str,
    path: str,
    *,
    headers: Mapping[str, str] | None = None,
    body: bytes | str | None = None,
    query: str = "",
    iam: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Lambda Function URL request event (payload format 2.0)."""
    now = time.time()
    all_headers = {"host": "abc123.lambda-url.us-east-1.on.aws", "user-agent": "tests"}
    all_headers.update({k.lower(): v for k, v in (headers or {}).items()})
    context: dict[str, Any] = {
        "accountId": "123456789012" if iam is None else "anonymous",
        "apiId": "abc123",
        "domainName": all_headers["host"],
        "domainPrefix": "abc123",
        "http": {
            "method": method,
            "path": path,
            "protocol": "HTTP/1.1",
            "sourceIp": "127.0.0.1",
            "userAgent": all_headers["user-agent"],
        },
        "requestId": str(uuid.uuid4()),
        "routeKey": "$default",
        "stage": "$default",
        "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
        "timeEpoch": int(now * 1000),
    }
    if iam is not None:
        context["authorizer"] = {"iam": dict(iam)}
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": query,
        "headers": all_headers,
        "requestContext": context,
        "isBase64Encoded": False,
    }
    if body is not None:
        event["body"] = body if isinstance(body, str) else body.decode()
    return event


class LambdaRuntimeAPI:
    """The invocation half of the Lambda Runtime API, served on a loopback port."""

    def __init__(self, *, function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:f"):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.function_arn = function_arn
        self.init_errors: list[bytes] = []
        self._queue: asyncio.Queue[tuple[str, bytes, float]] | None = None
        self._pending: dict[str, Future[Invocation]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._polls: set[asyncio.Task[Any]] = set()

    def _app(self) -> Starlette:
        return Starlette(
            routes=[
                Route(f"{RUNTIME_PREFIX}/invocation/next", self._next, methods=["GET"]),
                Route(
                    f"{RUNTIME_PREFIX}/invocation/{{request_id}}/response",
                    self._response,
                    methods=["POST"],
                ),
                Route(
                    f"{RUNTIME_PREFIX}/invocation/{{request_id}}/error",
                    self._error,
                    methods=["POST"],
                ),
                Route(f"{RUNTIME_PREFIX}/init/error", self._init_error, methods=["POST"]),
            ]
        )

    async def _next(self, request: Request) -> Response:
        assert self._queue is not None
        task = asyncio.current_task()
        assert task is not None
        self._polls.add(task)
        try:
            request_id, payload, deadline = await self._queue.get()
        finally:
            self._polls.discard(task)
        return Response(
            payload,
            media_type="application/json",
            headers={
                "Lambda-Runtime-Aws-Request-Id": request_id,
                "Lambda-Runtime-Deadline-Ms": str(int(deadline * 1000)),
                "Lambda-Runtime-Invoked-Function-Arn": self.function_arn,
                "Lambda-Runtime-Trace-Id": f"Root=1-{uuid.uuid4().hex[:8]}-{uuid.uuid4().hex[:24]}",
            },
        )

    async def _response(self, request: Request) -> Response:
        request_id = request.path_params["request_id"]
        streamed = request.headers.get("lambda-runtime-function-response-mode") == "streaming"
        body = b""
        times: list[float] = []
        async for chunk in request.stream():
            if chunk:
                body += chunk
                times.append(time.monotonic())
        self._resolve(Invocation(request_id, "response", body, streamed, times))
        return JSONResponse({"status": "OK"}, status_code=202)

    async def _error(self, request: Request) -> Response:
        request_id = request.path_params["request_id"]
        self._resolve(Invocation(request_id, "error", await request.body(), False))
        return JSONResponse({"status": "OK"}, status_code=202)

    async def _init_error(self, request: Request) -> Response:
        self.init_errors.append(await request.body())
        for future in list(self._pending.values()):
            if not future.done():
                future.set_exception(RuntimeError(f"init error: {self.init_errors[-1]!r}"))
        return JSONResponse({"status": "OK"}, status_code=202)

    def _resolve(self, invocation: Invocation) -> None:
        future = self._pending.pop(invocation.request_id, None)
        if future is not None and not future.done():
            future.set_result(invocation)

    def start(self) -> LambdaRuntimeAPI:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            self._queue = asyncio.Queue()
            config = uvicorn.Config(
                self._app(), host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
            )
            self._server = uvicorn.Server(config)
            loop.call_soon(ready.set)
            loop.run_until_complete(self._server.serve())
            loop.close()

        self._thread = threading.Thread(target=serve, name="lambda-runtime-api", daemon=True)
        self._thread.start()
        ready.wait(10)
        deadline = time.monotonic() + 10
        while not (self._server and self._server.started):
            if time.monotonic() > deadline:
                raise RuntimeError("the Lambda Runtime API server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._loop is not None:
            # Runtimes long-poll /next: end those requests instead of waiting for them.
            self._loop.call_soon_threadsafe(lambda: [t.cancel() for t in list(self._polls)])
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> LambdaRuntimeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def invoke(self, event: Mapping[str, Any], *, timeout: float = 60.0) -> Invocation:
        """Queue ``event`` for the function and wait for its result."""
        assert self._loop is not None and self._queue is not None
        request_id = str(uuid.uuid4())
        future: Future[Invocation] = Future()
        self._pending[request_id] = future
        payload = json.dumps(event).encode()
        item = (request_id, payload, time.time() + timeout)
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        return future.result(timeout)
