"""The routes an :class:`AgentApp` adds with ``@app.endpoint(path, methods)``, behind auth.

A handler's body model with a ``user_id`` field (an ``AgentRequest``, as AgentScope's
handlers take) gets there the user the request acts as: the caller's, whether or not the
body names it (a body naming another user is refused before, as on every route). What the
handler does runs for that user too, as a run does for its: an A2A agent tool it calls, or
a sandbox it connects naming no user, acts for them.

A handler is a FastAPI endpoint; a generator (sync or async) is streamed as Server-Sent
Events, one ``data: <JSON>`` line per item, as AgentScope Runtime streams them: text items
are sent as JSON strings, pydantic models, dataclasses and objects with ``to_dict()`` (or
``to_map()``) as their JSON objects, at any depth, tuples and sets as arrays, anything else as
its ``str()``. A sync generator runs in a worker thread, so a blocking one holds up no other
request. A generator that raises ends the stream with AgentScope's error item,
``{"error": "<the exception's message>", "error_type": "<its class>", "message": "Error in
streaming generator"}``, the settings' secrets (and the agent's own) replaced by ``***``.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import iterate_in_threadpool

from agentscope_serverless.http.auth import KeyedRoute, current_user_id
from agentscope_serverless.log import logger, redacted
from agentscope_serverless.services._turn import acting_for

# Deeper than this, a value is sent as its str(): a structure that contains itself ends.
_MAX_DEPTH = 100
# The parameter of a handler's endpoint that receives the user the request acts as.
_CALLER_PARAMETER = "agentscope_caller_user_id"


def _jsonable(value: Any, depth: int = 0) -> Any:
    """``value`` as plain JSON values."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if depth >= _MAX_DEPTH:
        return str(value)
    if isinstance(value, dict):
        return {str(key): _jsonable(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(item, depth + 1) for item in value]
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return {f.name: _jsonable(getattr(value, f.name), depth + 1) for f in fields}
    for name in ("to_map", "to_dict"):
        method = getattr(value, name, None)
        if callable(method):
            return _jsonable(method(), depth + 1)
    return str(value)


def _encode(item: Any) -> str:
    if isinstance(item, BaseModel):
        body = item.model_dump_json()
    else:
        body = json.dumps(_jsonable(item), ensure_ascii=False)
    return f"data: {body}\n\n"


def _error_item(exc: Exception) -> str:
    """AgentScope's last item of a stream whose generator raised ``exc``."""
    message = redacted(str(exc))
    logger.exception("a streamed endpoint failed", extra={"error": type(exc).__name__})
    error = {
        "error": message,
        "error_type": type(exc).__name__,
        "message": "Error in streaming generator",
    }
    return _encode(error)


def _acting_as_caller(handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler`` run for the caller's user, its body models with a ``user_id`` field given
    that user (a function of the same kind: FastAPI runs a sync one in a worker thread)."""
    signature = inspect.signature(handler, eval_str=True)
    bodies = [
        name
        for name, parameter in signature.parameters.items()
        if isinstance(parameter.annotation, type)
        and issubclass(parameter.annotation, BaseModel)
        and "user_id" in parameter.annotation.model_fields
    ]

    def filled(user_id: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        for name in bodies:
            if isinstance(kwargs.get(name), BaseModel):
                kwargs[name] = kwargs[name].model_copy(update={"user_id": user_id})
        return kwargs

    endpoint: Callable[..., Any]
    if inspect.isasyncgenfunction(handler):

        async def endpoint(**kwargs: Any) -> Any:
            user_id = kwargs.pop(_CALLER_PARAMETER)
            with acting_for(user_id):
                async for item in handler(**filled(user_id, kwargs)):
                    yield item

    elif inspect.isgeneratorfunction(handler):

        def endpoint(**kwargs: Any) -> Any:
            user_id = kwargs.pop(_CALLER_PARAMETER)
            items = handler(**filled(user_id, kwargs))
            while True:
                # Each step may run in a worker thread of its own, in a copy of the context.
                with acting_for(user_id):
                    try:
                        item = next(items)
                    except StopIteration:
                        return
                yield item

    elif inspect.iscoroutinefunction(handler):

        async def endpoint(**kwargs: Any) -> Any:
            user_id = kwargs.pop(_CALLER_PARAMETER)
            with acting_for(user_id):
                return await handler(**filled(user_id, kwargs))

    else:

        def endpoint(**kwargs: Any) -> Any:
            user_id = kwargs.pop(_CALLER_PARAMETER)
            with acting_for(user_id):
                return handler(**filled(user_id, kwargs))

    caller = inspect.Parameter(
        _CALLER_PARAMETER,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[str, Depends(current_user_id)],
    )
    # Before a ``**kwargs`` parameter, which must come last.
    parameters = sorted(
        [*signature.parameters.values(), caller],
        key=lambda parameter: parameter.kind == inspect.Parameter.VAR_KEYWORD,
    )
    endpoint.__signature__ = signature.replace(parameters=parameters)  # type: ignore[union-attr]
    endpoint.__name__ = getattr(handler, "__name__", "endpoint")
    endpoint.__doc__ = handler.__doc__
    return endpoint


def _streaming(handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler`` (a generator function) as an endpoint returning an SSE response."""

    async def endpoint(*args: Any, **kwargs: Any) -> StreamingResponse:
        items = handler(*args, **kwargs)

        async def body() -> AsyncIterator[str]:
            try:
                if inspect.isasyncgen(items):
                    async for item in items:
                        yield _encode(item)
                else:
                    async for line in iterate_in_threadpool(_encoded(items)):
                        yield line
            except Exception as exc:
                yield _error_item(exc)

        return StreamingResponse(body(), media_type="text/event-stream")

    # The handler's parameters (annotations resolved in its own module), so FastAPI reads
    # the request the same way; the result is the SSE response.
    signature = inspect.signature(handler, eval_str=True)
    endpoint.__signature__ = signature.replace(  # type: ignore[attr-defined]
        return_annotation=StreamingResponse
    )
    endpoint.__name__ = getattr(handler, "__name__", "stream")
    endpoint.__doc__ = handler.__doc__
    return endpoint


def _encoded(items: Iterable[Any]) -> Iterator[str]:
    """The SSE lines of a sync generator's items (encoded in its worker thread too)."""
    for item in items:
        yield _encode(item)


def build_router(endpoints: list[dict[str, Any]]) -> APIRouter:
    """A router of the custom endpoints, every one requiring an authenticated caller; the
    process's secrets (:func:`~agentscope_serverless.log.redact`) are kept out of the error
    items of streamed ones."""
    router = APIRouter(
        dependencies=[Depends(current_user_id)], tags=["custom"], route_class=KeyedRoute
    )
    for spec in endpoints:
        handler = _acting_as_caller(spec["handler"])
        if inspect.isasyncgenfunction(handler) or inspect.isgeneratorfunction(handler):
            handler = _streaming(handler)
        router.add_api_route(spec["path"], handler, methods=spec["methods"])
    return router


__all__ = ["build_router"]
