"""The Lambda Invoke API (``POST /2015-03-31/functions/{name}/invocations``) of our own, in
front of functions run by :class:`~tests.support.lambda_runtime.LambdaRuntimeAPI`.

An ``Event`` invocation is queued for the function and answered 202 at once, as Lambda does;
the function's result is kept in :attr:`LambdaInvokeAPI.results`. A payload larger than Lambda
takes (1 MB for an ``Event`` invocation, 6 MB otherwise) is refused as Lambda refuses it.
Requests are not authenticated (boto3 signs them; nothing here checks the signature).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.support.lambda_runtime import Invocation, LambdaRuntimeAPI

# The largest payloads Lambda takes: of an asynchronous (Event) invocation, of another.
EVENT_PAYLOAD_LIMIT_BYTES = 1024 * 1024
PAYLOAD_LIMIT_BYTES = 6 * 1024 * 1024


class LambdaInvokeAPI:
    """Routes invocations of each function name to its runtime; the ``Event`` invocations of
    a function named with ``queued`` are kept in :attr:`events` alone, for the test to run."""

    def __init__(
        self, functions: dict[str, LambdaRuntimeAPI], *, queued: tuple[str, ...] = ()
    ) -> None:
        self.queued = queued
        self.functions = functions
        self.results: list[Invocation] = []
        self.events: list[Any] = []

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/2015-03-31/functions/{name}/invocations", self._invoke, methods=["POST"])
            ]
        )

    async def _invoke(self, request: Request) -> Response:
        name = request.path_params["name"]
        runtime = self.functions.get(name)
        if runtime is None and name not in self.queued:
            body = {"Type": "User", "message": "Function not found"}
            return Response(json.dumps(body), status_code=404)
        payload = await request.body()
        asynchronous = request.headers.get("x-amz-invocation-type") == "Event"
        limit = EVENT_PAYLOAD_LIMIT_BYTES if asynchronous else PAYLOAD_LIMIT_BYTES
        if len(payload) > limit:
            body = {"Type": "User", "message": f"Request must be smaller than {limit} bytes"}
            headers = {"x-amzn-errortype": "RequestTooLargeException"}
            return Response(json.dumps(body), status_code=413, headers=headers)
        event = json.loads(payload)
        self.events.append(event)
        if asynchronous and runtime is None:
            return Response(b"", status_code=202)
        if runtime is None:
            body = {"Type": "User", "message": "the function only queues Event invocations"}
            return Response(json.dumps(body), status_code=400)
        if asynchronous:
            threading.Thread(target=self._run, args=(runtime, event), daemon=True).start()
            return Response(b"", status_code=202)
        return Response(runtime.invoke(event).body, status_code=200)

    def _run(self, runtime: LambdaRuntimeAPI, event: Any) -> None:
        self.results.append(runtime.invoke(event, timeout=120))


__all__ = ["LambdaInvokeAPI"]
