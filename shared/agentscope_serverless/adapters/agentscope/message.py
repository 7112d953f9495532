"""AgentScope ``Msg`` <-> :class:`Message` conversion.

>>> message = agentscope_msg_to_message(Msg("Friday", "Hi!", "assistant"))
>>> message.get_text_content()
'Hi!'

Text blocks become :class:`TextContent`; image blocks :class:`ImageContent` (a base64
source as a ``data:`` URI); audio blocks :class:`AudioContent` (a URL source with
``format="url"``, a base64 source with its data and the format its media type names);
other blocks (tool use, tool results, thinking) :class:`DataContent` holding the block. The
way back restores each block, and gives audio sent as data (OpenAI's ``input_audio``) a
base64 source. AgentScope has no file block: a file part becomes a text block naming it
(``[file report.pdf: https://...]``, its data left out) and the parts themselves go in the
``Msg``'s ``metadata["files"]`` (``file_url``, ``file_id``, ``filename``, ``file_data``); a
refusal becomes its text. The ``Msg``'s id, name and metadata travel in the message's ``id``
and ``metadata``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agentscope.message import Msg  # type: ignore[import-not-found]

from agentscope_serverless.schemas.agent_schemas import (
    AudioContent,
    Content,
    DataContent,
    FileContent,
    ImageContent,
    Message,
    RefusalContent,
    Role,
    TextContent,
)

_ROLES = (Role.USER, Role.ASSISTANT, Role.SYSTEM)


def _blocks(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [dict(block) for block in content if isinstance(block, dict)]


def _part(block: dict[str, Any]) -> Content:
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


def agentscope_msg_to_message(messages: Any) -> Any:
    """An AgentScope ``Msg`` (or a list of them) as :class:`Message` (or a list)."""
    if isinstance(messages, Iterable) and not isinstance(messages, (str, dict)):
        return [agentscope_msg_to_message(m) for m in messages]
    msg = messages
    role = msg.role if msg.role in _ROLES else Role.ASSISTANT
    metadata = dict(getattr(msg, "metadata", None) or {})
    metadata["agentscope"] = {"id": getattr(msg, "id", None), "name": getattr(msg, "name", None)}
    return Message(
        role=role,
        content=[_part(block) for block in _blocks(msg.content)],
        metadata=metadata,
    )


def _block(part: Content) -> dict[str, Any]:
    if isinstance(part, TextContent):
        return {"type": "text", "text": part.text or ""}
    if isinstance(part, ImageContent):
        return {"type": "image", "source": {"type": "url", "url": part.image_url}}
    if isinstance(part, AudioContent):
        if part.format == "url":
            return {"type": "audio", "source": {"type": "url", "url": part.data}}
        media_type = f"audio/{part.format or 'wav'}"
        return {
            "type": "audio",
            "source": {"type": "base64", "media_type": media_type, "data": part.data},
        }
    if isinstance(part, DataContent) and "agentscope_block" in (part.data or {}):
        return dict((part.data or {})["agentscope_block"])
    if isinstance(part, FileContent):
        return {"type": "text", "text": part.mention()}
    if isinstance(part, RefusalContent):
        return {"type": "text", "text": part.refusal or ""}
    return {"type": "text", "text": str(getattr(part, "data", ""))}


def message_to_agentscope_msg(messages: Any) -> Any:
    """A :class:`Message` (or a list of them, or dicts) as AgentScope ``Msg`` (or a list)."""
    if isinstance(messages, list):
        return [message_to_agentscope_msg(m) for m in messages]
    message = messages if isinstance(messages, Message) else Message.model_validate(messages)
    metadata = dict(message.metadata or {})
    origin = metadata.pop("agentscope", None) or {}
    role = message.role if message.role in _ROLES else Role.USER
    blocks = [_block(part) for part in message.content or []]
    files = [part for part in message.content or [] if isinstance(part, FileContent)]
    if files:
        # AgentScope has no file block: the model reads a mention, the agent's code the file.
        metadata["files"] = [
            part.model_dump(include={"file_url", "file_id", "filename", "file_data"})
            for part in files
        ]
    content: Any = blocks
    if all(block.get("type") == "text" for block in blocks):
        content = "".join(str(block.get("text", "")) for block in blocks)
    msg = Msg(name=origin.get("name") or role, content=content, role=role, metadata=metadata)
    if origin.get("id"):
        msg.id = origin["id"]
    return msg


__all__ = ["agentscope_msg_to_message", "message_to_agentscope_msg"]
