"""The tracing context of a task: :class:`TracingUtil`."""

from __future__ import annotations

import os
import uuid
from contextvars import ContextVar
from typing import Any

from agentscope_serverless.log import current_request_id

# The request id set, with the id of the HTTP request it was set in (None: outside any).
_REQUEST_ID: ContextVar[tuple[str | None, str] | None] = ContextVar(
    "trace_request_id", default=None
)
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
        _REQUEST_ID.set((current_request_id(), value))
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
        """The request id set while serving this HTTP request, else the request's own id (its
        ``X-Request-Id``, on its log lines), else (outside any request) the request id set,
        else ``default_value``. An id set outside the request (a traced call as the agent
        module is imported, say) is inherited by the tasks serving requests, and must not
        stand for theirs."""
        serving = current_request_id()
        held = _REQUEST_ID.get()
        if held is not None and held[0] == serving:
            return held[1]
        return serving or (held[1] if held is not None else "") or default_value

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


def ensure_request_id() -> None:
    """Give the current task a request id (a UUID) unless it has one."""
    if not TracingUtil.get_request_id():
        TracingUtil.set_request_id(str(uuid.uuid4()))


__all__ = ["TracingUtil", "ensure_request_id"]
