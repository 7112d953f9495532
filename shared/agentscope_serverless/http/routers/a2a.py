"""A2A over HTTP with the ``a2a-sdk``'s routes, authenticated like every other route.

| Method and path | What |
|---|---|
| ``GET /.well-known/agent-card.json`` | the agent card (its URLs: this server's base URL) |
| ``POST /a2a`` | JSON-RPC: ``SendMessage``, ``SendStreamingMessage``, ``GetTask``, |
|  | ``CancelTask``... (and A2A 0.3's ``message/send``, ``message/stream``, ``tasks/get``...) |
| ``/a2a/message:send``, ``/a2a/tasks/{id}``... | the HTTP+JSON binding |

The SDK's routes are plain Starlette endpoints; each is wrapped so the caller is
authenticated first (401 without a key) and the A2A call context carries the user it acts
as, which scopes the tasks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from a2a.auth.user import User
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import (
    DefaultServerCallContextBuilder,
    add_a2a_routes_to_fastapi,
    create_jsonrpc_routes,
    create_rest_routes,
)
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.routing import Route

from agentscope_serverless.a2a_server import (
    A2A_PATH,
    RunsAgentExecutor,
    RunsTaskStore,
    agent_card,
)
from agentscope_serverless.errors import AgentScopeServerlessError
from agentscope_serverless.http.auth import CurrentUser, bearer_scheme, get_caller
from agentscope_serverless.http.context import AppContext
from agentscope_serverless.http.errors import error_response, status_of

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
    """The A2A call context of an authenticated request: its user is the caller's user."""

    def build_user(self, request: Request) -> User:
        return _AuthenticatedUser(request.scope[_USER_SCOPE_KEY])


def _authenticated(endpoint: Endpoint) -> Endpoint:
    async def guarded(request: Request) -> Response:
        try:
            caller = await get_caller(request, await bearer_scheme(request))
            request.scope[_USER_SCOPE_KEY] = caller.user_id()
        except AgentScopeServerlessError as exc:
            return error_response(status_of(exc), exc.code, exc.message)
        return await endpoint(request)

    return guarded


def _guarded(routes: list[Any]) -> list[Route]:
    # The SDK also mounts the HTTP+JSON routes under /{tenant}: that catch-all would shadow
    # other routes' 404/405 answers, so only the plain routes are kept.
    return [
        Route(route.path, _authenticated(route.endpoint), methods=list(route.methods or ()))
        for route in routes
        if isinstance(route, Route)
    ]


def mount(app: FastAPI, context: AppContext) -> DefaultRequestHandler:
    """Add the A2A routes for the context's agent; returns the SDK's request handler."""
    agent_app = context.agent_app
    assert agent_app is not None
    runner, recorder = context.require_runner(), context.require_recorder()
    runs = recorder.runs
    base_card = agent_card(agent_app.app_name, agent_app.app_description, "http://localhost")
    handler = DefaultRequestHandler(
        agent_executor=RunsAgentExecutor(runner, recorder),
        task_store=RunsTaskStore(runs),
        agent_card=base_card,
    )
    builder = _ContextBuilder()
    add_a2a_routes_to_fastapi(
        app,
        jsonrpc_routes=_guarded(
            create_jsonrpc_routes(
                handler, A2A_PATH, context_builder=builder, enable_v0_3_compat=True
            )
        ),
        rest_routes=_guarded(
            create_rest_routes(
                handler, context_builder=builder, enable_v0_3_compat=True, path_prefix=A2A_PATH
            )
        ),
    )

    @app.get("/.well-known/agent-card.json", tags=["a2a"], summary="The A2A agent card")
    async def card(request: Request, user_id: CurrentUser) -> JSONResponse:
        base_url = context.settings.a2a_base_url or str(request.base_url)
        served = agent_card(
            agent_app.app_name,
            agent_app.app_description,
            base_url,
            skills=agent_app.a2a_skills,
        )
        return JSONResponse(agent_card_to_dict(served))

    return handler


__all__ = ["mount"]
