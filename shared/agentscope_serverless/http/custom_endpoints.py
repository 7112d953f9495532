"""The routes an :class:`AgentApp` adds with ``@app.endpoint(path, methods)``, behind auth.

A handler is a FastAPI endpoint; a generator (sync or async) is streamed as Server-Sent
Events, one ``data: <JSON>`` line per item (text items are sent as JSON strings).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from agentscope_serverless.http.auth import current_user_id


def _encode(item: Any) -> str:
    if isinstance(item, BaseModel):
        body = item.model_dump_json()
    else:
        body = json.dumps(item, ensure_ascii=False, default=str)
    return f"data: {body}\n\n"


def _streaming(handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler`` (a generator function) as an endpoint returning an SSE response."""

    async def endpoint(*args: Any, **kwargs: Any) -> StreamingResponse:
        items = handler(*args, **kwargs)

        async def body() -> AsyncIterator[str]:
            if inspect.isasyncgen(items):
                async for item in items:
                    yield _encode(item)
            else:
                for item in items:
                    yield _encode(item)

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


def build_router(endpoints: list[dict[str, Any]]) -> APIRouter:
    """A router of the custom endpoints, every one requiring an authenticated caller."""
    router = APIRouter(dependencies=[Depends(current_user_id)], tags=["custom"])
    for spec in endpoints:
        handler = spec["handler"]
        if inspect.isasyncgenfunction(handler) or inspect.isgeneratorfunction(handler):
            handler = _streaming(handler)
        router.add_api_route(spec["path"], handler, methods=spec["methods"])
    return router


__all__ = ["build_router"]
