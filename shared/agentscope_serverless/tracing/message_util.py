"""Folding a run's events for its span: its finish reason and its final response."""

from __future__ import annotations

from agentscope_serverless.schemas.agent_schemas import (
    AgentResponse,
    Message,
    TextContent,
)
from agentscope_serverless.tracing.wrapper import get_finish_reason


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


__all__ = ["get_agent_response_finish_reason", "merge_agent_response"]
