"""AgentScope Runtime's tracing names: ``@trace`` spans logged as JSON lines.

>>> @trace(TraceType.LLM, trace_name="plan")
... async def plan(query: str) -> str: ...

Each call of a traced function (plain, async, generator or async generator) logs one
``span`` line at DEBUG level with its name, type, duration and outcome. Exporting to an
OpenTelemetry backend is not built in.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from pydantic import BaseModel

from agentscope_serverless.log import logger
from agentscope_serverless.schemas.agent_schemas import (
    AgentResponse,
    Message,
    RunStatus,
    TextContent,
)


class TraceType:
    """The kind of a span: ``TraceType("LLM")``, or one of the constants."""

    LLM = "LLM"
    TOOL = "TOOL"
    AGENT_STEP = "AGENT_STEP"
    SEARCH = "SEARCH"
    OTHER = "OTHER"

    def __init__(self, value: str) -> None:
        self.value = value

    def __str__(self) -> str:
        return self.value


def get_finish_reason(response: Any) -> str | None:
    """``"stop"`` for a completed response or message, else None."""
    return "stop" if getattr(response, "status", None) == RunStatus.Completed else None


def merge_incremental_chunk(responses: list[Any]) -> BaseModel | dict[str, Any] | str | None:
    """The last chunk of a stream (the one holding the whole result)."""
    return responses[-1] if responses else None


def get_agent_response_finish_reason(
    response: AgentResponse | Message | TextContent,
) -> str | None:
    """Why a run ended: ``"stop"`` once its response (or message, or text) completed."""
    return get_finish_reason(response)


def merge_agent_response(
    responses: list[AgentResponse | Message | TextContent],
) -> AgentResponse:
    """The events of one run folded into its final :class:`AgentResponse`."""
    merged = AgentResponse()
    messages: dict[str, Message] = {}
    for item in responses:
        if isinstance(item, AgentResponse):
            merged = item.model_copy(update={"output": merged.output})
        elif isinstance(item, Message):
            messages[item.id] = item
    merged.output = [*(merged.output or []), *messages.values()] or None
    return merged


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
                },
            )

        if inspect.isasyncgenfunction(func):

            @functools.wraps(func)
            async def agen(*args: Any, **kwargs: Any) -> Any:
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
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def coroutine(*args: Any, **kwargs: Any) -> Any:
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


_REQUEST_ID: ContextVar[str | None] = ContextVar("trace_request_id", default=None)


class TracingUtil:
    """Helpers around spans (AgentScope's name): the request id of the current task."""

    @staticmethod
    def set_request_id(request_id: str | None) -> None:
        """Remember the request id for the current task (and the tasks it starts)."""
        _REQUEST_ID.set(request_id)

    @staticmethod
    def get_request_id() -> str | None:
        """The current task's request id, if set."""
        return _REQUEST_ID.get()


__all__ = [
    "TraceType",
    "TracingUtil",
    "get_agent_response_finish_reason",
    "merge_agent_response",
    "trace",
]
