"""A2A over HTTP (the ``a2a-sdk``'s routes), authenticated like every other route.

| Method and path | What |
|---|---|
| ``GET /.well-known/agent-card.json`` | the agent card (its URLs: ``A2A_BASE_URL``, else the |
|  | URL it was requested at, the Function URL on AWS); also at ``/.well-known/agent.json`` |
| ``POST /a2a`` | JSON-RPC: ``SendMessage``, ``SendStreamingMessage``, ``GetTask``, |
|  | ``CancelTask``... (and A2A 0.3's ``message/send``, ``message/stream``, ``tasks/get``...) |
| ``/a2a/message:send``, ``/a2a/tasks/{id}``... | the HTTP+JSON binding |

The SDK is imported on the first A2A request, so a cold start that serves none does not pay
for it (see :mod:`agentscope_serverless.http.a2a_routes`). Its routes, plain Starlette ones,
are in the OpenAPI document all the same (see :class:`DocumentationRoute`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.routing import Match, Route
from starlette.types import Receive, Scope, Send

from agentscope_serverless.http.auth import CurrentCaller, KeyedRoute, no_other_user
from agentscope_serverless.http.context import AppContext
from agentscope_serverless.http.guards import guard_request
from agentscope_serverless.http.openapi import (
    ERROR_RESPONSES,
    DocumentationRoute,
    ErrorBody,
    error_answer,
)

A2A_PATH = "/a2a"
WELL_KNOWN_PATH = "/.well-known/agent-card.json"
# Where A2A before 0.3 (and its clients) looked for the card; AgentScope Runtime serves both.
LEGACY_WELL_KNOWN_PATH = "/.well-known/agent.json"


class A2AApplication:
    """The SDK's A2A routes as one ASGI application, built on the first request."""

    def __init__(self, context: AppContext) -> None:
        self.context = context
        self._handler: Any = None
        self._router: Any = None
        # The routes serving the agent card (see mount).
        self.card_routes: list[Any] = []

    @property
    def router(self) -> Any:
        """The SDK's routes (built now if not yet)."""
        if self._router is None:
            from agentscope_serverless.http.a2a_routes import build

            self._handler, self._router = build(self.context)
        return self._router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.router(scope, receive, send)

    async def aclose(self) -> None:
        """Drain the A2A tasks still running (at shutdown)."""
        if self._handler is not None:
            await self._handler.aclose()


class BindingRoute(Route):
    """The route of A2A's HTTP+JSON binding (``/a2a/{rest}``), matching a request as the
    SDK's routes behind it do: fully when one of them serves its method at its path, partly
    when one serves its path with another method. A 405's ``Allow`` then names the methods
    the path is served with (as a catch-all of every method, it named them all, the
    refused one included)."""

    def __init__(self, path: str, a2a: A2AApplication) -> None:
        super().__init__(path, a2a)
        self.a2a = a2a

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is Match.NONE:
            return match, child_scope
        served = {route.matches(scope)[0] for route in self.a2a.router.routes}
        for match in (Match.FULL, Match.PARTIAL):
            if match in served:
                return match, child_scope
        return Match.NONE, {}


def mount(app: FastAPI, context: AppContext) -> A2AApplication:
    """Add the A2A routes of the context's agent; returns what to close at shutdown."""
    agent_app = context.agent_app
    assert agent_app is not None
    a2a = A2AApplication(context)
    app.router.routes.append(Route(A2A_PATH, a2a, methods=["POST"]))
    app.router.routes.append(BindingRoute(f"{A2A_PATH}/{{rest:path}}", a2a))
    _document(app)

    async def card(request: Request, caller: CurrentCaller) -> JSONResponse:
        from a2a.server.request_handlers.response_helpers import agent_card_to_dict

        no_other_user(caller)  # it holds no user's data: a service key need not name one

        base_url = context.settings.a2a_base_url or str(request.base_url)
        return JSONResponse(agent_card_to_dict(agent_app.a2a_card(base_url)))

    # Also where the app's a2a_config.wellknown_path says.
    configured = agent_app.a2a_config.wellknown_path if agent_app.a2a_config else None
    for path in dict.fromkeys(
        [WELL_KNOWN_PATH, LEGACY_WELL_KNOWN_PATH, configured or WELL_KNOWN_PATH]
    ):
        app.router.add_api_route(
            path,
            card,
            methods=["GET"],
            tags=["a2a"],
            summary="The A2A agent card",
            dependencies=[Depends(guard_request)],
            responses=ERROR_RESPONSES,
            route_class_override=KeyedRoute,
        )
        a2a.card_routes.append(app.router.routes[-1])
    return a2a


# An A2A answer: JSON, or the events of a streaming method.
_A2A_ANSWER: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The answer (JSON), or the events of a streaming method.",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}


class BindingStatus(BaseModel):
    """An error of A2A's HTTP+JSON binding: its HTTP status (``code``), its gRPC status name
    and a message; ``details`` say why (its ``google.rpc.ErrorInfo``)."""

    code: int = Field(examples=[404])
    status: str = Field(examples=["NOT_FOUND"])
    message: str
    details: list[dict[str, Any]] | None = None


class BindingError(BaseModel):
    """The body of an error of A2A's HTTP+JSON binding (a ``google.rpc.Status``), as its SDK
    answers it."""

    error: BindingStatus


# The statuses the binding's own errors have (the a2a-sdk's A2A_ERROR_MAPPING).
_BINDING_ERRORS = (400, 404, 500)
_BINDING_ANSWERS: dict[int | str, dict[str, Any]] = {
    status: {**ERROR_RESPONSES[status], "model": ErrorBody | BindingError}
    for status in _BINDING_ERRORS
}
_PROTOCOL = "the A2A protocol (https://a2a-protocol.org), 1.0 and 0.3"
_OWNED = (
    f"The caller's user owns the tasks. The agent card (`GET {WELL_KNOWN_PATH}`) describes "
    "the agent."
)
_JSON_RPC_CALL = {
    "description": "A JSON-RPC 2.0 call.",
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["jsonrpc", "id", "method"],
                "properties": {
                    "jsonrpc": {"const": "2.0"},
                    "id": {"type": ["string", "integer"]},
                    "method": {"type": "string", "examples": ["SendMessage", "message/send"]},
                    "params": {"type": "object"},
                },
            }
        }
    },
}
_BINDING_MESSAGE = {
    "description": "The method's JSON message.",
    "content": {"application/json": {}},
}


async def _json_rpc(caller: CurrentCaller) -> None:
    """The endpoint of ``POST /a2a``'s documentation (never called: A2A's route answers)."""


async def _http_json(
    rest: Annotated[str, Path(description="The binding's path after `/a2a/`, slashes too.")],
    caller: CurrentCaller,
) -> None:
    """The endpoint of ``/a2a/{rest}``'s documentation (never called: A2A's routes answer)."""


def _document(app: FastAPI) -> None:
    """Declare A2A's routes in the OpenAPI document (:class:`DocumentationRoute`): their
    key, their checks (``Idempotency-Key``), their error answers, as every route's."""

    def add(
        path: str,
        method: str,
        endpoint: Any,
        summary: str,
        *,
        binding: bool,
        refusals: dict[int | str, dict[str, Any]] | None = None,
        **details: Any,
    ) -> None:
        answers = {
            **ERROR_RESPONSES,
            **(_BINDING_ANSWERS if binding else {}),
            **(refusals or {}),
            **_A2A_ANSWER,
        }
        app.router.add_api_route(
            path,
            endpoint,
            methods=[method],
            tags=["a2a"],
            summary=summary,
            dependencies=[Depends(guard_request)],
            responses=answers,
            route_class_override=DocumentationRoute,
            **details,
        )

    add(
        A2A_PATH,
        "POST",
        _json_rpc,
        "A2A over JSON-RPC",
        binding=False,
        description=(
            f"A JSON-RPC 2.0 call of {_PROTOCOL}: `SendMessage`, `SendStreamingMessage`, "
            "`GetTask`, `CancelTask`... (and 0.3's `message/send`, `message/stream`, "
            "`tasks/get`...), answered with a 200, a result or a JSON-RPC error. " + _OWNED
        ),
        openapi_extra={"requestBody": _JSON_RPC_CALL},
    )
    # Only a stream answers message:stream and tasks/{id}:subscribe (GET and POST).
    streams = error_answer(
        406, "`Accept` does not take `text/event-stream`, asking for a stream's events."
    )
    for method in ("GET", "POST", "DELETE"):
        add(
            f"{A2A_PATH}/{{rest:path}}",
            method,
            _http_json,
            f"A2A over HTTP+JSON ({method})",
            binding=True,
            refusals=streams if method != "DELETE" else {},
            description=(
                f"The HTTP+JSON binding of {_PROTOCOL}: `POST /a2a/message:send`, "
                "`POST /a2a/message:stream`, `GET /a2a/tasks/{id}`, "
                "`POST /a2a/tasks/{id}:cancel`..., its own errors a `google.rpc.Status`. " + _OWNED
            ),
            openapi_extra={"requestBody": _BINDING_MESSAGE} if method == "POST" else None,
        )


__all__ = ["A2AApplication", "mount"]
