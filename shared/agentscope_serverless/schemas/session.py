"""The :class:`Session` model: one conversation of one user."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from agentscope_serverless.schemas.agent_schemas import Message


class Session(BaseModel):
    """A conversation: its id, its owner and its messages in order.

    >>> Session(id="s1", user_id="u1").messages
    []
    """

    id: str
    user_id: str
    messages: list[Message | dict[str, Any]] = Field(default_factory=list)


__all__ = ["Session"]
