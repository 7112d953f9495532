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
and ``metadata``. A tool call message (``function_call``, ``plugin_call``, ``mcp_call``: what
the runner keeps of a ``tool_use`` block, and what OpenAI clients send) becomes a ``Msg`` of
``tool_use`` blocks, its output message one of ``tool_result`` blocks (role ``system``, as
AgentScope's agents make them), and a ``reasoning`` message one of ``thinking`` blocks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from agentscope_serverless.adapters.agentscope import agentscope_missing
from agentscope_serverless.adapters.agentscope.blocks import block_content

try:
    from agentscope.message import Msg  # type: ignore[import-not-found]
except ModuleNotFoundError as exc:
    raise agentscope_missing(__name__, exc) from None

from agentscope_serverless.schemas.agent_schemas import (
    AudioContent,
    Content,
    DataContent,
    FileContent,
    ImageContent,
    Message,
    MessageType,
    RefusalContent,
    Role,
    TextContent,
)

_ROLES = (Role.USER, Role.ASSISTANT, Role.SYSTEM)
_CALLS = (MessageType.FUNCTION_CALL, MessageType.PLUGIN_CALL, MessageType.MCP_TOOL_CALL)
_OUTPUTS = (
    MessageType.FUNCTION_CALL_OUTPUT,
    MessageType.PLUGIN_CALL_OUTPUT,
    MessageType.MCP_TOOL_CALL_OUTPUT,
)
# The blocks a tool's output may be made of (any other output is shown as its text).
_OUTPUT_BLOCKS = ("text", "image", "audio", "video")


def _blocks(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [dict(block) for block in content if isinstance(block, dict)]


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
        content=[block_content(block) for block in _blocks(msg.content)],
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


def _json(value: Any) -> Any:
    """``value`` read as JSON when it is JSON text, else as it is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _arguments(arguments: Any) -> dict[str, Any]:
    """A call's arguments as a ``tool_use`` block's input (``{}`` when they are no object)."""
    value = _json(arguments)
    return value if isinstance(value, dict) else {}


def _tool_output(output: Any) -> Any:
    """A tool's output as a ``tool_result`` block holds it: its blocks, or its text."""
    value = _json(output)
    if isinstance(value, list) and all(
        isinstance(item, dict) and item.get("type") in _OUTPUT_BLOCKS for item in value
    ):
        return value
    if isinstance(value, str):
        return value
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)


def _tool_blocks(message: Message) -> list[dict[str, Any]] | None:
    """The ``tool_use``, ``tool_result`` or ``thinking`` blocks of a message of those kinds
    (None for other messages)."""
    data = [part.data or {} for part in message.content or [] if isinstance(part, DataContent)]
    if message.type in _CALLS:
        return [
            {
                "type": "tool_use",
                "id": str(call.get("call_id") or ""),
                "name": str(call.get("name") or ""),
                "input": _arguments(call.get("arguments")),
            }
            for call in data
        ]
    if message.type in _OUTPUTS:
        return [
            {
                "type": "tool_result",
                "id": str(result.get("call_id") or ""),
                "name": str(result.get("name") or ""),
                "output": _tool_output(result.get("output")),
            }
            for result in data
        ]
    if message.type == MessageType.REASONING:
        texts = [part.text for part in message.content or [] if isinstance(part, TextContent)]
        return [{"type": "thinking", "thinking": text or ""} for text in texts]
    return None


def message_to_agentscope_msg(messages: Any) -> Any:
    """A :class:`Message` (or a list of them, or dicts) as AgentScope ``Msg`` (or a list)."""
    if isinstance(messages, list):
        return [message_to_agentscope_msg(m) for m in messages]
    message = messages if isinstance(messages, Message) else Message.model_validate(messages)
    metadata = dict(message.metadata or {})
    origin = metadata.pop("agentscope", None) or {}
    role = message.role if message.role in _ROLES else Role.USER
    tool_blocks = _tool_blocks(message)
    if tool_blocks is not None:
        role = Role.SYSTEM if message.type in _OUTPUTS else Role.ASSISTANT
        msg = Msg(
            name=origin.get("name") or role, content=tool_blocks, role=role, metadata=metadata
        )
        if origin.get("id"):
            msg.id = origin["id"]
        return msg
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
