"""The Lambda Invoke API (``POST /2015-03-31/functions/{name}/invocations``) of our own, in
front of functions run by :class:`~tests.support.lambda_runtime.LambdaRuntimeAPI`.

An ``Event`` invocation is queued for the function and answered 202 at once, as Lambda does;
the function's result is kept in :attr:`LambdaInvokeAPI.results`. Requests are not
authenticated (boto3 signs them; nothing here checks the signature).
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


class LambdaInvokeAPI:
    """Routes invocations of each function name to its runtime."""

    def __init__(self, functions: dict[str, LambdaRuntimeAPI]) -> None:
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
        runtime = self.functions.get(request.path_params["name"])
        if runtime is None:
            body = {"Type": "User", "message": "Function not found"}
            return Response(json.dumps(body), status_code=404)
        event = json.loads(await request.body())
        self.events.append(event)
        if request.headers.get("x-amz-invocation-type") == "Event":
            threading.Thread(target=self._run, args=(runtime, event), daemon=True).start()
            return Response(b"", status_code=202)
        return Response(runtime.invoke(event).body, status_code=200)

    def _run(self, runtime: LambdaRuntimeAPI, event: Any) -> None:
        self.results.append(runtime.invoke(event, timeout=120))


__all__ = ["LambdaInvokeAPI"]
