"""The :func:`trace` decorator: each call of the function it decorates logged as a span."""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from agentscope_serverless.log import logger
from agentscope_serverless.schemas.agent_schemas import RunStatus
from agentscope_serverless.tracing.tracing_metric import TraceType
from agentscope_serverless.tracing.tracing_util import TracingUtil, ensure_request_id


def get_finish_reason(response: Any) -> str | None:
    """``"stop"`` for a completed response or message, else None."""
    return "stop" if getattr(response, "status", None) == RunStatus.Completed else None


def merge_incremental_chunk(responses: list[Any]) -> BaseModel | dict[str, Any] | str | None:
    """The last chunk of a stream (the one holding the whole result)."""
    return responses[-1] if responses else None


def trace(
    trace_type: TraceType | str | None = None,
    *,
    trace_name: str | None = None,
    is_root_span: bool | None = None,
    get_finish_reason_func: Callable[[Any], str | None] | None = get_finish_reason,
    merge_output_func: Callable[[Any], BaseModel | dict[str, Any] | str | None]
    | None = merge_incremental_chunk,
) -> Any:
    """Decorate a function so each call is logged as a span."""
    kind = str(trace_type or TraceType.OTHER)

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        name = trace_name or func.__name__

        def log(started: float, error: BaseException | None) -> None:
            logger.debug(
                "span",
                extra={
                    "span": name,
                    "span_type": kind,
                    "root": bool(is_root_span),
                    "duration_ms": round((time.perf_counter() - started) * 1000, 3),
                    "error": type(error).__name__ if error else None,
                    "request_id": TracingUtil.get_request_id(),
                },
            )

        if inspect.isasyncgenfunction(func):

            @functools.wraps(func)
            async def agen(*args: Any, **kwargs: Any) -> Any:
                ensure_request_id()
                started, error = time.perf_counter(), None
                try:
                    async for item in func(*args, **kwargs):
                        yield item
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    log(started, error)

            return agen
        if inspect.isgeneratorfunction(func):

            @functools.wraps(func)
            def gen(*args: Any, **kwargs: Any) -> Any:
                ensure_request_id()
                started, error = time.perf_counter(), None
                try:
                    return (yield from func(*args, **kwargs))
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    log(started, error)

            return gen
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def coroutine(*args: Any, **kwargs: Any) -> Any:
                ensure_request_id()
                started, error = time.perf_counter(), None
                try:
                    return await func(*args, **kwargs)
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    log(started, error)

            return coroutine

        @functools.wraps(func)
        def plain(*args: Any, **kwargs: Any) -> Any:
            ensure_request_id()
            started, error = time.perf_counter(), None
            try:
                return func(*args, **kwargs)
            except BaseException as exc:
                error = exc
                raise
            finally:
                log(started, error)

        return plain

    return decorate


__all__ = ["get_finish_reason", "merge_incremental_chunk", "trace"]
