"""A2A over HTTP (the ``a2a-sdk``'s routes), authenticated like every other route.

| Method and path | What |
|---|---|
| ``GET /.well-known/agent-card.json`` | the agent card (its URLs: ``A2A_BASE_URL``, else the |
|  | URL it was requested at, the Function URL on AWS); also at ``/.well-known/agent.json`` |
| ``POST /a2a`` | JSON-RPC: ``SendMessage``, ``SendStreamingMessage``, ``GetTask``, |
|  | ``CancelTask``... (and A2A 0.3's ``message/send``, ``message/stream``, ``tasks/get``...) |
| ``/a2a/message:send``, ``/a2a/tasks/{id}``... | the HTTP+JSON binding |

The SDK is imported on the first A2A request, so a cold start that serves none does not pay
for it (see :mod:`agentscope_serverless.http.a2a_routes`).
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agentscope_serverless.http.auth import CurrentCaller, KeyedRoute, no_other_user
from agentscope_serverless.http.context import AppContext
from agentscope_serverless.http.guards import guard_request
from agentscope_serverless.http.openapi import ERROR_RESPONSES

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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._router is None:
            from agentscope_serverless.http.a2a_routes import build

            self._handler, self._router = build(self.context)
        await self._router(scope, receive, send)

    async def aclose(self) -> None:
        """Drain the A2A tasks still running (at shutdown)."""
        if self._handler is not None:
            await self._handler.aclose()


def mount(app: FastAPI, context: AppContext) -> A2AApplication:
    """Add the A2A routes of the context's agent; returns what to close at shutdown."""
    agent_app = context.agent_app
    assert agent_app is not None
    a2a = A2AApplication(context)
    app.router.routes.append(Route(A2A_PATH, a2a, methods=["POST"]))
    app.router.routes.append(Route(f"{A2A_PATH}/{{rest:path}}", a2a))

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
    return a2a


__all__ = ["A2AApplication", "mount"]
