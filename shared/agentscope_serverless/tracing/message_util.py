"""Folding a run's events for its span: its finish reason and its final response."""

from __future__ import annotations

from agentscope_serverless.schemas.agent_schemas import (
    AgentResponse,
    Content,
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
    """The events of one run folded into its final :class:`AgentResponse`.

    A message's content events (its deltas, its parts completed) are folded into it, so a
    run cut short keeps what it streamed; what is given is left unchanged.
    """
    merged = AgentResponse()
    messages: dict[str, Message] = {}
    folded: set[str] = set()  # the messages copied to fold content into
    for item in responses:
        if isinstance(item, AgentResponse):
            merged = item.model_copy(update={"output": merged.output})
        elif isinstance(item, Message):
            messages[item.id] = item
            folded.discard(item.id)
        elif isinstance(item, Content) and item.msg_id in messages:
            if item.msg_id not in folded:
                messages[item.msg_id] = messages[item.msg_id].model_copy(deep=True)
                folded.add(item.msg_id)
            _fold(messages[item.msg_id], item.model_copy(deep=True))
    merged.output = [*(merged.output or []), *messages.values()] or None
    return merged


def _fold(message: Message, part: Content) -> None:
    """Fold a content event of ``message`` into it: a delta added, a whole part put in place."""
    if part.delta:
        message.add_delta_content(part)
        return
    parts = message.content if message.content is not None else []
    if part.index is not None and 0 <= part.index < len(parts):
        parts[part.index] = part  # type: ignore[call-overload]
    else:
        part.index = len(parts)
        parts.append(part)  # type: ignore[arg-type]
    message.content = parts


__all__ = ["get_agent_response_finish_reason", "merge_agent_response"]
