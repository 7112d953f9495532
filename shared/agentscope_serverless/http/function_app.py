"""Serve a plain function at one endpoint (what ``LocalDeployManager.deploy(func)`` runs).

The function gets the validated request body (a ``request_model`` instance, or the raw JSON
when ``request_model`` is None) and may return a value, an awaitable, or an (async)
iterator of items. ``response_type`` picks the wire format:

- ``sse``: one ``data:`` line per item (models as their JSON, other values JSON-encoded);
- ``json``: the value, or the list of items, as JSON;
- ``text``: the items as plain text, streamed.

The endpoint is authenticated like every other route; a ``user_id`` field of the body is
checked (and, for a service key, filled in) as in :mod:`agentscope_serverless.http.auth`.
"""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from agentscope_serverless.auth.base import KeyStore
from agentscope_serverless.auth.factory import create_key_store
from agentscope_serverless.errors import InvalidInputError
from agentscope_serverless.http.app import call_hook, new_application
from agentscope_serverless.http.auth import Caller, CurrentCaller, KeyedRoute
from agentscope_serverless.http.context import AppContext
from agentscope_serverless.http.guards import guard_any_type_request, json_body
from agentscope_serverless.http.openapi import ERROR_RESPONSES
from agentscope_serverless.http.sse import EventStreamResponse, encode
from agentscope_serverless.runner import items_of
from agentscope_serverless.services.container import Services
from agentscope_serverless.services.factory import create_idempotency_store
from agentscope_serverless.services.manager import ServiceManager
from agentscope_serverless.settings import Settings

ResponseType = Literal["sse", "json", "text"]
RESPONSE_TYPES = ("sse", "json", "text")
_RESPONSE_CLASSES: dict[str, type[Response]] = {
    "sse": EventStreamResponse,
    "json": JSONResponse,
    "text": PlainTextResponse,
}


def create_function_app(
    func: Callable[[Any], Any],
    *,
    endpoint_path: str = "/process",
    request_model: type[BaseModel] | None = None,
    response_type: str = "sse",
    before_start: Callable[..., Any] | None = None,
    after_finish: Callable[..., Any] | None = None,
    hook_kwargs: Mapping[str, Any] | None = None,
    settings: Settings,
    key_store: KeyStore | None = None,
) -> FastAPI:
    """An application serving ``func`` at ``POST endpoint_path``, plus ``/health``.

    ``before_start(app, **hook_kwargs)`` and ``after_finish(app, **hook_kwargs)`` run
    around the server's lifetime.
    """
    if response_type not in RESPONSE_TYPES:
        raise ValueError(f"response_type must be one of {', '.join(RESPONSE_TYPES)}")
    idempotency = create_idempotency_store(settings)
    context = AppContext(
        settings=settings,
        key_store=key_store or create_key_store(settings),
        services=Services(),
        lifecycle=ServiceManager(),
        idempotency=idempotency,
    )
    extra = dict(hook_kwargs or {})

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with context.key_store, idempotency:
            await call_hook(before_start, app, **extra)
            try:
                yield
            finally:
                await call_hook(after_finish, app, **extra)

    app = new_application(
        context, title="AgentScope Serverless", description="A served function.", lifespan=lifespan
    )

    async def endpoint(request: Request, caller: CurrentCaller) -> Response:
        body = _validated(await json_body(request), request_model, caller)
        result = func(body)
        if response_type == "json":
            return JSONResponse(_jsonable(await _collect(result)))
        if response_type == "text":
            return StreamingResponse(_text(result), media_type="text/plain; charset=utf-8")
        return EventStreamResponse(_sse(result), ping_interval=settings.sse_ping_interval_seconds)

    app.router.add_api_route(
        endpoint_path,
        endpoint,
        methods=["POST"],
        response_model=None,
        # Documents the success as the one media type it is sent as.
        response_class=_RESPONSE_CLASSES[response_type],
        status_code=200,
        dependencies=[Depends(guard_any_type_request)],
        responses=ERROR_RESPONSES,
        # Its body read as UTF-8 JSON only, as every route's (the caller authenticated first).
        route_class_override=KeyedRoute,
    )
    return app


def _validated(payload: Any, model: type[BaseModel] | None, caller: Caller) -> Any:
    if model is None:
        claimed = payload.get("user_id") if isinstance(payload, dict) else None
        user_id = caller.user_id(claimed if isinstance(claimed, str) else None)
        return {**payload, "user_id": user_id} if isinstance(payload, dict) else payload
    try:
        body = model.model_validate(payload)
    except ValidationError as exc:
        raise InvalidInputError(
            f"invalid request: {exc.errors()[0]['msg']}",
            errors=[{"loc": ["body", *e["loc"]], "msg": e["msg"]} for e in exc.errors()],
        ) from None
    if "user_id" in type(body).model_fields:
        claimed = getattr(body, "user_id", None)
        user_id = caller.user_id(claimed if isinstance(claimed, str) else None)
        body = body.model_copy(update={"user_id": user_id})
    return body


async def _items(result: Any) -> AsyncIterator[Any]:
    async with contextlib.aclosing(items_of(result)) as items:
        async for item in items:
            yield item


async def _collect(result: Any) -> Any:
    items = [item async for item in _items(result)]
    streamed = inspect.isasyncgen(result) or inspect.isgenerator(result)
    return items if streamed else items[0]


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


async def _sse(result: Any) -> AsyncIterator[bytes]:
    async for item in _items(result):
        data = item.model_dump_json() if isinstance(item, BaseModel) else json.dumps(item)
        yield encode(data)


async def _text(result: Any) -> AsyncIterator[bytes]:
    async for item in _items(result):
        yield (item.model_dump_json() + "\n" if isinstance(item, BaseModel) else str(item)).encode()


__all__ = ["RESPONSE_TYPES", "ResponseType", "create_function_app"]
