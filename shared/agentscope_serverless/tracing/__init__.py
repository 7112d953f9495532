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

from agentscope_serverless.tracing.message_util import (
    get_agent_response_finish_reason,
    merge_agent_response,
)
from agentscope_serverless.tracing.tracing_metric import TraceType
from agentscope_serverless.tracing.tracing_util import TracingUtil
from agentscope_serverless.tracing.wrapper import trace

__all__ = [
    "TraceType",
    "TracingUtil",
    "get_agent_response_finish_reason",
    "merge_agent_response",
    "trace",
]
