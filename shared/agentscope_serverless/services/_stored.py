"""Messages as the stores keep them: JSON written by :func:`encode_message`.

Every message is validated on its way in (``to_messages``), so what a store wrote itself
is decoded without validating it again: one JSON parse for a
whole batch, and models built from the parsed fields. Anything that does not have exactly
the fields of today's models (data written by another version, or by hand) goes through
full validation instead.

A turn reads the same window of its session's history again and again (all but the last
turn's messages), so the parsed fields of the most recently read windows' messages are
kept, keyed by their JSON: a message read again is built from them without parsing or
checking it again. Only messages whose values are immutable (strings, numbers, None) or
empty dicts and lists (new ones for each read) are kept: what a conversation's text
messages hold. So every read still gets models of its own, sharing nothing another read
could change.

>>> raw = encode_message(Message(role="user", content="hi"))
>>> decode_messages([raw])[0].get_text_content()
'hi'
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from agentscope_serverless.schemas._build import built
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


def encode_message(message: Message, encoded: Sequence[Message] = ()) -> str:
    """The JSON a store keeps for ``message`` (every field, so it decodes without checks):
    the JSON it was checked with when it is one of ``encoded``, :class:`EncodedMessages`
    (what it was when it was given to the store), else encoded now."""
    raw = encoded.json.get(id(message)) if isinstance(encoded, EncodedMessages) else None
    return message.model_dump_json() if raw is None else raw


class EncodedMessages(list[Message]):
    """Messages checked for a store, with the JSON each was encoded to by the check, by the
    id of the message (each is held by the list, so its id stays its own): a store keeps
    that JSON rather than encoding the message a second time.

    >>> message = Message(role="user", content="hi")
    >>> encode_message(message, EncodedMessages([(message, '{"checked": true}')]))
    '{"checked": true}'
    """

    def __init__(self, pairs: Sequence[tuple[Message, str]] = ()) -> None:
        super().__init__(message for message, _ in pairs)
        self.json = {id(message): raw for message, raw in pairs}

    def subset(self, messages: Sequence[Message]) -> EncodedMessages:
        """Those of ``messages`` (some of these) with their JSON."""
        return EncodedMessages([(m, self.json[id(m)]) for m in messages])


def decode_messages(raws: Sequence[str | bytes], *, keep: bool = False) -> list[Message]:
    """The messages of JSON written by :func:`encode_message`, in order.

    Messages kept from an earlier read are built from what was kept; with ``keep``, the
    others are kept too (for reads that come again: a session's window). Keeping what is
    read once (search results, pages) would only give the collector more to walk.
    """
    known = [_KNOWN.get(raw) for raw in raws]
    unknown = [raw for raw, fields in zip(raws, known, strict=True) if fields is None]
    if not unknown:
        return [_from_known(fields) for fields in known]  # type: ignore[arg-type]
    parsed = iter(_parse(unknown))
    messages: list[Message] = []
    for raw, fields in zip(raws, known, strict=True):
        if fields is None:
            data = next(parsed)
            fields = _knowable(data) if keep and len(raw) <= KNOWN_MESSAGE_LENGTH else None
            if fields is None:
                messages.append(_message(data))
                continue
            _remember(raw, fields)
        messages.append(_from_known(fields))
    return messages


def _parse(raws: Sequence[str | bytes]) -> list[Any]:
    """The JSON values of ``raws``, parsed as one array."""
    if isinstance(raws[0], bytes):
        batch: str | bytes = b"[" + b",".join(raws) + b"]"  # type: ignore[arg-type]
    else:
        batch = "[" + ",".join(raws) + "]"  # type: ignore[arg-type]
    parsed: list[Any] = json.loads(batch)
    return parsed


def stored_session(user_id: str, session_id: str, raws: Sequence[str | bytes]) -> Session:
    """A session of messages written by :func:`encode_message`, decoded on their first use.

    >>> session = stored_session("u1", "s1", [encode_message(Message(role="user"))])
    >>> session.messages[0].role
    'user'
    """
    return Session.with_deferred_messages(
        session_id, user_id, lambda: list(decode_messages(raws, keep=True))
    )


def decode_message(raw: str | bytes) -> Message:
    """One message of JSON written by :func:`encode_message`."""
    return _message(json.loads(raw))


def _message(data: Any) -> Message:
    current = _current(data)
    if current is None:
        return Message.model_validate(data)
    fields, parts = current
    if parts is not None:
        fields["content"] = [built(cls, part) for cls, part in parts]
    return built(Message, fields)


_Parts = list[tuple[type[Content], dict[str, Any]]]


def _current(data: Any) -> tuple[dict[str, Any], _Parts | None] | None:
    """A parsed message and its content parts with their classes (None without content),
    when each has exactly the fields of today's models and no error; otherwise None (it is
    validated in full)."""
    if not isinstance(data, dict) or data.keys() != _FIELDS[Message] or data["error"] is not None:
        return None
    content = data["content"]
    if content is None:
        return data, None
    if not isinstance(content, list):
        return None
    parts: _Parts = []
    for part in content:
        cls = _CONTENT_CLASSES.get(str(part.get("type"))) if isinstance(part, dict) else None
        if cls is None or part.keys() != _FIELDS[cls] or part["error"] is not None:
            return None
        parts.append((cls, part))
    return data, parts


# What one model is built from again: its class, its fields, their names, and the names of
# those that held an empty dict or list (each build gets new ones); every other value is
# immutable.
_Kept = tuple[type[BaseModel], dict[str, Any], frozenset[str], tuple[tuple[str, type], ...]]
# A message's kept fields (its content None) and its content's, when it has content.
_Known = tuple[_Kept, tuple[_Kept, ...] | None]
# How many messages' fields are kept (the windows of a few dozen sessions), and how long
# their JSON may be in all (characters or bytes: what is kept costs about twice as much):
# the oldest go first. A message longer than KNOWN_MESSAGE_LENGTH is decoded anew each time:
# a user's long messages must not take a warm process's memory.
KNOWN_MESSAGES = 2048
KNOWN_LENGTH = 8 * 1024**2
KNOWN_MESSAGE_LENGTH = 64 * 1024
_KNOWN: dict[str | bytes, _Known] = {}
_known_length = 0  # of the keys of _KNOWN
_IMMUTABLE = frozenset({str, int, float, bool, type(None)})
_EMPTY_CONTAINERS = frozenset({dict, list})


def _knowable(data: Any) -> _Known | None:
    """What to keep of a parsed message, when it has exactly today's fields and every value
    is immutable or an empty dict or list; otherwise None (decoded anew each time)."""
    current = _current(data)
    if current is None:
        return None
    data, parts = current
    kept_parts: list[_Kept] = []
    for cls, part in parts or ():
        kept = _kept(cls, part)
        if kept is None:
            return None
        kept_parts.append(kept)
    fields = dict(data)
    fields["content"] = None  # its place kept: built models list their fields in order
    message = _kept(Message, fields)
    if message is None:
        return None
    return message, None if parts is None else tuple(kept_parts)


def _kept(cls: type[BaseModel], fields: dict[str, Any]) -> _Kept | None:
    fresh: list[tuple[str, type]] = []
    for name, value in fields.items():
        kind = type(value)
        if kind in _IMMUTABLE:
            continue
        if kind in _EMPTY_CONTAINERS and not value:
            fresh.append((name, kind))
            continue
        return None
    return cls, fields, frozenset(fields), tuple(fresh)


def _remember(raw: str | bytes, known: _Known) -> None:
    global _known_length
    if raw in _KNOWN:
        return
    while _KNOWN and (len(_KNOWN) >= KNOWN_MESSAGES or _known_length + len(raw) > KNOWN_LENGTH):
        try:
            oldest = next(iter(_KNOWN))
        except (StopIteration, RuntimeError):  # another thread emptied or changed it
            break
        if _KNOWN.pop(oldest, None) is not None:  # None: another thread took it first
            _known_length -= len(oldest)
    if not _KNOWN:
        _known_length = 0  # what racing threads miscounted goes with the last entry
    _KNOWN[raw] = known
    _known_length += len(raw)


def _from_known(known: _Known) -> Message:
    """A message of its own, built from kept fields: its content list, its models and their
    empty dicts and lists are new; the other values they hold are immutable."""
    message, parts = known
    built: Message = _build(message)
    if parts is not None:
        built.__dict__["content"] = [_build(part) for part in parts]
    return built


def _build(kept: _Kept) -> Any:
    cls, fields, names, fresh = kept
    fields = fields.copy()
    for name, kind in fresh:
        fields[name] = kind()
    return built(cls, fields, names)


__all__ = [
    "EncodedMessages",
    "decode_message",
    "decode_messages",
    "encode_message",
    "stored_session",
]
