"""AgentScope Runtime's tracing names: ``@trace`` spans logged as JSON lines.

>>> @trace(TraceType.LLM, trace_name="plan")
... async def plan(query: str) -> str: ...

Each call of a traced function (plain, async, generator or async generator) logs one
``span`` line at DEBUG level with its name, type, duration, outcome and request id. While an
HTTP request is served, the request id is the request's (its ``X-Request-Id``) and
:meth:`TracingUtil.get_trace_header` gives the trace headers it came with, for an agent to
pass on; a traced call made outside a request, with no request id set, gives its task a new
one (a UUID), which :meth:`TracingUtil.get_request_id` then returns. Exporting to an
OpenTelemetry backend is not built in.
"""

from __future__ import annotations

import functools
import inspect
import os
import time
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from pydantic import BaseModel

from agentscope_serverless.log import current_request_id, logger
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
    MEMORY = "MEMORY"
    SEARCH = "SEARCH"
    AIGC = "AIGC"
    RAG = "RAG"
    INTENTION = "INTENTION"
    PLUGIN = "PLUGIN"
    FUNCTION_CALL = "FUNCTION_CALL"
    AGENT = "AGENT"
    PLANNING = "PLANNING"
    CHAIN = "CHAIN"
    RETRIEVER = "RETRIEVER"
    RERANKER = "RERANKER"
    EMBEDDING = "EMBEDDING"
    TASK = "TASK"
    GUARDRAIL = "GUARDRAIL"
    REWRITER = "REWRITER"
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
                    "request_id": TracingUtil.get_request_id(),
                },
            )

        if inspect.isasyncgenfunction(func):

            @functools.wraps(func)
            async def agen(*args: Any, **kwargs: Any) -> Any:
                _ensure_request_id()
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
                _ensure_request_id()
                started, error = time.perf_counter(), None
                try:
                    yield from func(*args, **kwargs)
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    log(started, error)

            return gen
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def coroutine(*args: Any, **kwargs: Any) -> Any:
                _ensure_request_id()
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
            _ensure_request_id()
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


_REQUEST_ID: ContextVar[str] = ContextVar("trace_request_id", default="")
_TRACE_HEADER: ContextVar[dict[str, Any]] = ContextVar("trace_header")
_COMMON_ATTRIBUTES: ContextVar[dict[str, Any]] = ContextVar("trace_common_attributes")

# Model Studio's environment variables and the span attributes that carry their values.
_PLATFORM_VARIABLES: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("APPLICATION_ENV", "DS_ENV"), ("bailian.app.env",)),
    (("APPLICATION_ID",), ("bailian.app.id",)),
    (("APPLICATION_NAME",), ("bailian.app.name",)),
    (("APPLICATION_INTER_SOURCE",), ("bailian.app.inter.source",)),
    (("ALIYUN_UID",), ("bailian.app.owner_id", "gen_ai.user.id")),
    (("APPLICATION_TRACING",), ("bailian.app.tracing",)),
    (("WORKSPACE_ID",), ("bailian.app.workspace",)),
)


def _platform_attributes() -> dict[str, str]:
    """The attributes every span of a request carries: the framework, and the application's
    details when Model Studio's variables are set."""
    attributes = {"gen_ai.framework": "Alibaba Cloud Model Studio"}
    for variables, keys in _PLATFORM_VARIABLES:
        value = next((os.environ[v] for v in variables if os.environ.get(v)), "")
        if value:
            attributes.update(dict.fromkeys(keys, value))
    return attributes


class TracingUtil:
    """The tracing context of the current task (and of the tasks it starts): its request id,
    the trace headers it continues, and the attributes common to its spans.

    >>> TracingUtil.set_request_id("req-1")
    >>> TracingUtil.get_request_id(), TracingUtil.get_common_attributes()["request_id"]
    ('req-1', 'req-1')
    """

    @staticmethod
    def set_request_id(value: str = "") -> None:
        """Make ``value`` the request id, and the common attributes its own: ``request_id``,
        ``bailian.request_id``, ``gen_ai.response.id`` and the platform's. An empty ``value``
        keeps the request id already set."""
        if not value:
            return
        _REQUEST_ID.set(value)
        TracingUtil.clear_common_attributes()
        TracingUtil.set_common_attributes(
            {
                "request_id": value,
                "bailian.request_id": value,
                "gen_ai.response.id": value,
                **_platform_attributes(),
            }
        )

    @staticmethod
    def get_request_id(default_value: str = "") -> str:
        """The request id set, else the id of the HTTP request being served (its
        ``X-Request-Id``, on its log lines), else ``default_value``."""
        return _REQUEST_ID.get() or current_request_id() or default_value

    @staticmethod
    def set_trace_header(trace_headers: dict[str, Any]) -> None:
        """Remember the trace headers (``traceparent``, ...) of the request being served."""
        _TRACE_HEADER.set(trace_headers)

    @staticmethod
    def get_trace_header() -> dict[str, Any]:
        """The trace headers set, ``{}`` when none are: while an HTTP request is served, those
        it came with (``traceparent``, ``tracestate``, ``x-amzn-trace-id``)."""
        return _TRACE_HEADER.get({})

    @staticmethod
    def set_common_attributes(attributes: dict[str, Any]) -> None:
        """Add ``attributes`` to the common attributes (a key already there takes the new
        value)."""
        # A new dict: the one a task inherited stays its parent's, unchanged.
        _COMMON_ATTRIBUTES.set({**_COMMON_ATTRIBUTES.get({}), **attributes})

    @staticmethod
    def get_common_attributes() -> dict[str, Any]:
        """The common attributes, ``{}`` when none are set."""
        return _COMMON_ATTRIBUTES.get({})

    @staticmethod
    def clear_common_attributes() -> None:
        """Remove every common attribute."""
        _COMMON_ATTRIBUTES.set({})


def _ensure_request_id() -> None:
    if not TracingUtil.get_request_id():
        TracingUtil.set_request_id(str(uuid.uuid4()))


__all__ = [
    "TraceType",
    "TracingUtil",
    "get_agent_response_finish_reason",
    "merge_agent_response",
    "trace",
]
