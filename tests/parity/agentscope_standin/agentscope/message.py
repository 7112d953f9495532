"""``Msg``: AgentScope's message (name, content as text or blocks, role, metadata, id)."""

from __future__ import annotations

import uuid
from typing import Any


class Msg:
    def __init__(
        self, name: str, content: Any, role: str, metadata: dict[str, Any] | None = None
    ) -> None:
        self.id = uuid.uuid4().hex
        self.name = name
        self.content = content
        self.role = role
        self.metadata = metadata

    def get_text_content(self) -> str | None:
        if isinstance(self.content, str):
            return self.content
        texts = [b.get("text", "") for b in self.content or [] if b.get("type") == "text"]
        return "".join(texts) if texts else None


class TextBlock(dict):  # type: ignore[type-arg]
    pass


class ThinkingBlock(dict):  # type: ignore[type-arg]
    pass
