"""Messages as the stores keep them: JSON written by :func:`encode_message`.

Every message is validated on its way in (``to_messages``), so what a store wrote itself
is decoded without validating it again: one JSON parse for a
whole batch, and models built from the parsed fields. Anything that does not have exactly
the fields of today's models (data written by another version, or by hand) goes through
full validation instead.

>>> raw = encode_message(Message(role="user", content="hi"))
>>> decode_messages([raw])[0].get_text_content()
'hi'
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from agentscope_serverless.schemas.agent_schemas import (
    AudioContent,
    Content,
    DataContent,
    FileContent,
    ImageContent,
    Message,
    RefusalContent,
    TextContent,
)
from agentscope_serverless.schemas.session import Session

ModelT = TypeVar("ModelT", bound=BaseModel)

_CONTENT_CLASSES: dict[str, type[Content]] = {
    "text": TextContent,
    "image": ImageContent,
    "data": DataContent,
    "audio": AudioContent,
    "file": FileContent,
    "refusal": RefusalContent,
}
_MODELS: tuple[type[BaseModel], ...] = (Message, *_CONTENT_CLASSES.values())
_FIELDS: dict[type[BaseModel], frozenset[str]] = {
    cls: frozenset(cls.model_fields) for cls in _MODELS
}


def encode_message(message: Message) -> str:
    """The JSON a store keeps for ``message`` (every field, so it decodes without checks)."""
    return message.model_dump_json()


def decode_messages(raws: Sequence[str | bytes]) -> list[Message]:
    """The messages of JSON written by :func:`encode_message`, in order."""
    if not raws:
        return []
    if isinstance(raws[0], bytes):
        batch: str | bytes = b"[" + b",".join(raws) + b"]"  # type: ignore[arg-type]
    else:
        batch = "[" + ",".join(raws) + "]"  # type: ignore[arg-type]
    return [_message(data) for data in json.loads(batch)]


def stored_session(user_id: str, session_id: str, raws: Sequence[str | bytes]) -> Session:
    """A session of messages written by :func:`encode_message`, decoded on their first use.

    >>> session = stored_session("u1", "s1", [encode_message(Message(role="user"))])
    >>> session.messages[0].role
    'user'
    """
    return Session.with_deferred_messages(session_id, user_id, lambda: list(decode_messages(raws)))


def decode_message(raw: str | bytes) -> Message:
    """One message of JSON written by :func:`encode_message`."""
    return _message(json.loads(raw))


def _message(data: Any) -> Message:
    if not isinstance(data, dict) or data.keys() != _FIELDS[Message] or data["error"] is not None:
        return Message.model_validate(data)
    content = data["content"]
    if content is not None:
        parts: list[Content] = []
        for part in content:
            cls = _CONTENT_CLASSES.get(str(part.get("type"))) if isinstance(part, dict) else None
            if cls is None or part.keys() != _FIELDS[cls] or part["error"] is not None:
                return Message.model_validate(data)
            parts.append(_built(cls, part))
        data["content"] = parts
    return _built(Message, data)


def _built(cls: type[ModelT], fields: dict[str, Any]) -> ModelT:
    """An instance of ``cls`` holding ``fields`` as they are (all of its fields, checked)."""
    model = cls.__new__(cls)
    object.__setattr__(model, "__dict__", fields)
    object.__setattr__(model, "__pydantic_fields_set__", set(fields))
    object.__setattr__(model, "__pydantic_extra__", None)
    object.__setattr__(model, "__pydantic_private__", None)
    return model


__all__ = ["decode_message", "decode_messages", "encode_message", "stored_session"]
