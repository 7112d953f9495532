"""AgentScope content blocks as content parts (for :mod:`.message`, and for the runner,
which streams a ``Msg``'s blocks without AgentScope installed)."""

from __future__ import annotations

from typing import Any

from agentscope_serverless.schemas.agent_schemas import (
    AudioContent,
    Content,
    DataContent,
    ImageContent,
    TextContent,
)


def block_content(block: dict[str, Any]) -> Content:
    """The content part of an AgentScope block (a ``dict``): text, an image or audio (a URL
    or base64 source), any other block as :class:`DataContent` holding it.

    >>> block_content({"type": "image", "source": {"type": "url", "url": "https://x/c.png"}}).type
    'image'
    """
    kind = block.get("type")
    source = block.get("source") or {}
    base64 = source.get("type") == "base64" and isinstance(source.get("data"), str)
    media_type = str(source.get("media_type") or "")
    if kind == "text":
        return TextContent(text=str(block.get("text", "")))
    if kind == "image" and source.get("type") == "url":
        return ImageContent(image_url=source.get("url"))
    if kind == "image" and base64 and media_type.startswith("image/"):
        return ImageContent(image_url=f"data:{media_type};base64,{source['data']}")
    if kind == "audio" and source.get("type") == "url":
        return AudioContent(data=source.get("url"), format="url")
    if kind == "audio" and base64 and media_type.startswith("audio/"):
        return AudioContent(data=source["data"], format=media_type.removeprefix("audio/"))
    return DataContent(data={"agentscope_block": block})
