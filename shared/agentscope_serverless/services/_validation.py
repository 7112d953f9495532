"""Normalisation and validation shared by every backend (ids, messages, cursors, limits)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import json
import math
import re
import secrets
import unicodedata
from array import array
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from agentscope_serverless.errors import InvalidInputError
from agentscope_serverless.schemas.agent_schemas import (
    MODEL_IMAGE_RULE,
    ImageContent,
    Message,
    is_model_image_url,
)
from agentscope_serverless.services._once import new_uuid
from agentscope_serverless.services._stored import EncodedMessages

MAX_ID_LENGTH = 512
# The longest expiry a store is given (about 31,700 years; unset means none): Redis counts
# expiries in milliseconds, which its scripts compute as doubles, exact below 2**53 (a TTL
# of 10**16 s made every call fail there).
MAX_TTL_SECONDS = 10**12
DEFAULT_SESSION_ID = "default"
# Ids may hold any text but control characters (C0 except tab and line breaks, DEL, C1):
# they are invisible, some count as whitespace (an id of "\x1c" would strip to nothing),
# and header values cannot carry them.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# The bidirectional controls (marks, embeddings, overrides, isolates): invisible, they reorder
# the text around them, so that text holding one can show as other text.
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_DOT_SEGMENTS = frozenset({".", ".."})
# How deeply JSON values may nest (arrays and objects within each other), in a request body
# and in what a store keeps. Parsers give up far deeper (pydantic's at about 250 levels,
# Python's ``json`` near its recursion limit, earlier in a deeper stack), so whatever is
# accepted can always be read back; no real document comes near.
MAX_JSON_DEPTH = 100
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS = bytes.maketrans(b"[]{}", b"\x01\xff\x01\xff")  # as signed bytes: +1 and -1


def unencodable_path(value: Any, path: tuple[str | int, ...] = ()) -> tuple[str | int, ...] | None:
    """Where in ``value`` (nested dicts, lists and strings) text cannot be encoded as UTF-8.

    None when every string (keys included) is valid Unicode: a lone UTF-16 surrogate such
    as ``"\\ud800"`` (which JSON's ``\\u`` escapes can carry) is not.

    >>> unencodable_path({"a": ["ok", "\\ud800"]})
    ('a', 1)
    """
    if isinstance(value, str):
        return None if _encodes(value) else path
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and not _encodes(key):
                # Escaped, so that the error naming the key can itself be sent as UTF-8.
                return (*path, key.encode("utf-8", "backslashreplace").decode())
            found = unencodable_path(item, (*path, str(key)))
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = unencodable_path(item, (*path, index))
            if found is not None:
                return found
    return None


def nests_deeper_than(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON ``text`` nests arrays and objects more than ``limit`` levels deep.

    Text that is not JSON is measured the same way, a bracket closing nothing counting
    against those after it: a parser stops there. Linear (about 25 ms for 1 MiB of
    brackets); most texts have too few opening brackets to need more than counting them.

    >>> nests_deeper_than('{"a": [[1], "]]]"]}', 2), nests_deeper_than("[[[]]]", 3)
    (True, False)
    """
    square, curly = ("[", "{") if isinstance(text, str) else (b"[", b"{")
    if text.count(square) + text.count(curly) <= limit:  # type: ignore[arg-type]
        return False
    if isinstance(text, bytes):
        text = _as_parsed(text)
    if isinstance(text, str):
        text = text.encode("utf-8", "surrogatepass")
    # +1 for each opening bracket, -1 for each closing one, outside strings: the running
    # sum is the depth at each point.
    steps = _outside_strings(text).translate(None, _NOT_BRACKETS).translate(_STEPS)
    return max(itertools.accumulate(array("b", steps)), default=0) > limit


def _outside_strings(text: bytes) -> bytes:
    r"""JSON ``text`` without its strings: with the escaped backslashes and quotes gone, every
    other ``"`` opens a string. A string that never ends stays, as a parser reads it.

    >>> _outside_strings(rb'{"a\\": ["]\"", 1]}'), _outside_strings(b'["ok", "[[')
    (b'{: [, 1]}', b'[, "[[')
    """
    pieces = text.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')
    if len(pieces) % 2 == 1:  # every string closed
        return b"".join(pieces[::2])
    return b"".join([*pieces[::2], b'"', pieces[-1]])


def _as_parsed(data: bytes) -> str | bytes:
    """``data`` as JSON's parser reads it: UTF-16 and UTF-32 (told by their first bytes) as
    the text they encode, whose bytes may hold a ``"`` or a bracket inside any character;
    UTF-8, or bytes that do not decode (no JSON then), as they are."""
    encoding = json.detect_encoding(data)
    if encoding == "utf-8":
        return data
    try:
        return data.decode(encoding, "surrogatepass")
    except UnicodeDecodeError:
        return data


def require_shallow_json(text: str | bytes, *, field: str) -> None:
    """Refuse JSON ``text`` nesting deeper than :data:`MAX_JSON_DEPTH` (422 naming ``field``)."""
    if nests_deeper_than(text):
        raise too_deep(field)


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def valid_text(text: str) -> str:
    """``text`` as valid Unicode: each lone UTF-16 surrogate (which JSON's ``\\u`` escapes can
    carry, say from a model that cut an emoji in two) becomes U+FFFD, as a UTF-8 decoder
    does with bytes it cannot read; a surrogate pair becomes the character it encodes.

    >>> valid_text("ok \\ud83d\\ude42 \\ud800!")
    'ok \U0001f642 \ufffd!'
    """
    if text.isascii() or _encodes(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def valid_streamed_text(piece: str) -> tuple[str, str]:
    """A piece of streamed text as :func:`valid_text`, but for the first half of a UTF-16
    surrogate pair ending it (an emoji a model cut across two chunks), kept apart to go
    before the next piece: ``(valid, held)``. Only a half still alone when the text ends
    becomes U+FFFD.

    >>> valid_streamed_text("smile \\ud83d")
    ('smile ', '\\ud83d')
    >>> valid_streamed_text("\\ud83d" + "\\ude00 done")
    ('\U0001f600 done', '')
    """
    if "\ud800" <= piece[-1:] <= "\udbff":
        return valid_text(piece[:-1]), piece[-1]
    return valid_text(piece), ""


def require_utf8(value: Any, *, field: str) -> None:
    """Refuse ``value`` when any text in it cannot be encoded as UTF-8 (422 naming where)."""
    where = unencodable_path(value)
    if where is not None:
        loc = [field, *where]
        raise InvalidInputError(
            f"{'.'.join(str(p) for p in loc)} is not valid Unicode text (it cannot be "
            "encoded as UTF-8)",
            errors=[{"loc": loc, "msg": "not valid Unicode text"}],
        )


def nonfinite_path(value: Any, path: tuple[str | int, ...] = ()) -> tuple[str | int, ...] | None:
    """Where in ``value`` (nested dicts and lists) a number is NaN or infinite.

    Python's JSON parser reads ``NaN``, ``Infinity`` and numbers beyond a double's range
    (``1e999``) as such floats, which JSON cannot carry back: stored, they would come back
    as ``null``.

    >>> nonfinite_path({"a": [1.5, float("nan")]}), nonfinite_path({"a": 1e308})
    (('a', 1), None)
    """
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    if isinstance(value, dict):
        for key, item in value.items():
            found = nonfinite_path(item, (*path, str(key)))
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = nonfinite_path(item, (*path, index))
            if found is not None:
                return found
    return None


def require_finite(value: Any, *, field: str) -> None:
    """Refuse ``value`` when a number in it is NaN or infinite (422 naming where)."""
    where = nonfinite_path(value)
    if where is not None:
        loc = [field, *where]
        raise InvalidInputError(
            f"{'.'.join(str(p) for p in loc)} is not a number JSON can carry (NaN, Infinity, "
            "or beyond the range of a double such as 1e999)",
            errors=[{"loc": loc, "msg": "not a finite number"}],
        )


def _require_id_text(value: str, field: str) -> None:
    if value.isascii() and value.isprintable():
        return  # most ids, checked in one step: each request checks a dozen of them
    require_utf8(value, field=field)
    if _CONTROL.search(value):
        raise InvalidInputError(f"{field} must not contain control characters", field=field)


def require_user_id(user_id: Any) -> str:
    """A user id is a non-blank string; it is used exactly as given (never stripped)."""
    if not isinstance(user_id, str):
        raise InvalidInputError(
            f"user_id must be a string, got {type(user_id).__name__}", field="user_id"
        )
    if not user_id.strip():
        raise InvalidInputError("user_id must not be blank", field="user_id")
    if len(user_id) > MAX_ID_LENGTH:
        raise InvalidInputError(
            f"user_id is longer than {MAX_ID_LENGTH} characters", field="user_id"
        )
    _require_id_text(user_id, "user_id")
    return user_id


def require_unpadded_user_id(user_id: str, *, where: str = "user_id") -> str:
    """``user_id`` when it neither begins nor ends with whitespace (422 otherwise), for a
    user that must be nameable in a header: servers strip a header's value, so " alice"
    could never be named there, and "alice" named there is another user."""
    if user_id != user_id.strip():
        raise InvalidInputError(
            f"the {where} names a user whose id begins or ends with whitespace: send the id "
            "without the surrounding whitespace",
            field=where,
        )
    return user_id


def require_user_id_shown_as_written(user_id: str) -> str:
    """``user_id`` when it holds no bidirectional control (422 otherwise), for the user of a
    key: ``keys list`` shows it, and a control reordering it would let it show as another
    user's id (``"\\u202eecila"`` shows as ``alice``)."""
    if any(control in user_id for control in BIDI_CONTROLS):
        raise InvalidInputError(
            "user_id must not contain bidirectional controls (such as U+202E): they make an id "
            "show as another",
            field="user_id",
        )
    return user_id


def clean_session_id(session_id: Any) -> str | None:
    """A session id stripped of surrounding whitespace; None when missing or blank.

    It names the session in URLs (``/sessions/{session_id}``), so it holds no ``/`` and is
    not ``.`` or ``..``: an HTTP client or proxy would take those for path structure, and the
    session could be made but never reached.
    """
    if session_id is None:
        return None
    if not isinstance(session_id, str):
        raise InvalidInputError(
            f"session_id must be a string, got {type(session_id).__name__}", field="session_id"
        )
    _require_id_text(session_id, "session_id")
    session_id = session_id.strip()
    if len(session_id) > MAX_ID_LENGTH:
        raise InvalidInputError(
            f"session_id is longer than {MAX_ID_LENGTH} characters", field="session_id"
        )
    if "/" in session_id or session_id in _DOT_SEGMENTS:
        raise InvalidInputError(
            "session_id must not contain '/' nor be '.' or '..': it names the session in URLs",
            field="session_id",
        )
    return session_id or None


def require_session_id(session_id: Any) -> str:
    """A session id as :func:`clean_session_id` gives it, refused when blank."""
    cleaned = clean_session_id(session_id)
    if cleaned is None:
        raise InvalidInputError("session_id must not be blank", field="session_id")
    return cleaned


def new_or_clean_session_id(session_id: Any) -> str:
    """The cleaned session id, or a fresh uuid when it is missing or blank."""
    return clean_session_id(session_id) or new_uuid()


def session_id_or_default(session_id: Any) -> str:
    """The cleaned session id, or ``"default"`` (memory and state group by it)."""
    return clean_session_id(session_id) or DEFAULT_SESSION_ID


def require_message_id(message_id: str, *, field: str) -> None:
    """Refuse the id of a new message (422 naming ``field``) when :func:`_require_kept_id`
    does, or when it holds a control character or only whitespace, as a session id may
    not. It is kept as given, never stripped: it is another message's id than the one
    without the whitespace."""
    _require_kept_id(message_id, field)
    _require_id_text(message_id, field)
    if message_id.isspace():
        raise InvalidInputError(f"{field} must not be blank", field=field)


def _require_kept_id(message_id: str, field: str) -> None:
    """Refuse a message id that is empty or longer than :data:`MAX_ID_LENGTH`: a store keeps
    one message per id, so an empty one would stand for every message without an id of its
    own, and a long one costs as much as its content. Messages read back are held to this
    alone: one stored before ids were held to more keeps its id."""
    if not message_id:
        raise InvalidInputError(f"{field} must not be empty", field=field)
    if len(message_id) > MAX_ID_LENGTH:
        raise InvalidInputError(f"{field} is longer than {MAX_ID_LENGTH} characters", field=field)


def require_input_ids(messages: list[Message], *, field: str = "input") -> None:
    """Refuse the input of a run when a message's id is not one :func:`require_message_id`
    takes, or is another input message's too (checked before the run: its input is stored
    after it, one message per id, so all but the first would be lost)."""
    first: dict[str, int] = {}
    for position, message in enumerate(messages):
        where = f"{field}[{position}].id"
        require_message_id(message.id, field=where)
        earlier = first.setdefault(message.id, position)
        if earlier != position:
            raise InvalidInputError(
                f"{where} is the id of {field}[{earlier}] too: each message needs an id of its own",
                field=where,
            )


def to_message(item: Any, *, position: int | None = None, stored: bool = False) -> Message:
    """A validated :class:`Message` given as a model or a dict.

    A model is returned as it is, once checked to serialise: every store keeps the JSON, so
    changing the model later changes nothing stored, and copying it here would only cost.
    A ``stored`` message (read back from a store) keeps an id a new one may not have.
    """
    message, _ = _encoded(item, position, stored)
    return message


def to_messages(message: Any, *, stored: bool = False) -> list[Message]:
    """One message or a list of them, validated; ``None`` items are skipped.

    Everything is validated before anything is returned, so a bad item in a list stores
    nothing.
    """
    return [to_message(item, position=i, stored=stored) for i, item in _items(message)]


def to_encoded_messages(message: Any) -> list[tuple[Message, str]]:
    """What :func:`to_messages` validates, each message with its JSON (what stores keep).

    >>> [(m.role, raw[:14]) for m, raw in to_encoded_messages({"role": "user"})]
    [('user', '{"sequence_num')]

    Messages checked already (an :class:`EncodedMessages`: a turn stored in the history,
    then added to memory) keep the JSON they were checked with, without a second check.
    """
    if isinstance(message, EncodedMessages):
        known = message.json
        return [
            (m, known[id(m)]) if id(m) in known else _encoded(m, i) for i, m in enumerate(message)
        ]
    return [_encoded(item, i) for i, item in _items(message)]


def _items(message: Any) -> list[tuple[int | None, Any]]:
    if isinstance(message, list | tuple):
        return [(i, item) for i, item in enumerate(message) if item is not None]
    return [] if message is None else [(None, message)]


def to_query_messages(message: Any) -> list[Message]:
    """What :func:`to_messages` accepts, for a call that stores none of it (a memory
    search): the same checks but the one that they serialise, which costs a JSON encoding of
    each message."""
    return [_validated(item, i) for i, item in _items(message)]


def _encoded(item: Any, position: int | None, stored: bool = False) -> tuple[Message, str]:
    message = _validated(item, position, stored)
    where = "message" if position is None else f"message[{position}]"
    try:
        raw = message.model_dump_json()
    except PydanticSerializationError:
        raise _unencodable(message, where) from None
    require_shallow_json(raw, field=where)
    _require_finite_values(message, where)
    return message, raw


def _validated(item: Any, position: int | None, stored: bool = False) -> Message:
    where = "message" if position is None else f"message[{position}]"
    if isinstance(item, Message):
        message = item
    elif isinstance(item, Mapping):
        try:
            message = Message.model_validate(dict(item))
        except ValidationError as exc:
            raise InvalidInputError(
                f"{where} is not a valid message: {exc.errors()[0]['msg']}",
                errors=[{"loc": [where, *err["loc"]], "msg": err["msg"]} for err in exc.errors()],
            ) from None
    else:
        raise InvalidInputError(
            f"{where} must be a Message or a dict, got {type(item).__name__}", field=where
        )
    if stored:
        _require_kept_id(message.id, f"{where}.id")
    else:
        require_message_id(message.id, field=f"{where}.id")
    return message


def _require_finite_values(message: Message, where: str) -> None:
    """Refuse a message whose free-form values hold NaN or an infinity: its JSON would hold
    ``null`` in their place, so what is read back would not be what was given."""
    if message.metadata:
        require_finite(message.metadata, field=f"{where}.metadata")
    if message.usage:
        require_finite(message.usage, field=f"{where}.usage")
    for index, part in enumerate(message.content or ()):
        # A field is in the model's __dict__; getattr of a field a part lacks costs
        # pydantic's __getattr__ and an exception (5 us a message).
        data = part.__dict__.get("data")
        if isinstance(data, dict) and data:
            require_finite(data, field=f"{where}.content.{index}.data")


def _unencodable(message: Message, where: str) -> InvalidInputError:
    """Why a validated message has no JSON: text that is not valid Unicode, values nested
    past what an encoder follows, or (given from Python) a value JSON has no form for."""
    plain = message.model_dump()
    if _value_nests_deeper_than(plain, MAX_JSON_DEPTH):
        return too_deep(where)
    try:
        require_utf8(plain, field=where)
    except InvalidInputError as exc:
        return exc
    return InvalidInputError(f"{where} holds a value that cannot be encoded as JSON", field=where)


def _value_nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether dicts and lists in ``value`` nest more than ``limit`` levels deep (walked
    level by level, so no depth overflows the stack)."""
    level = [value]  # the values inside as many containers as passes made
    for _ in range(limit):
        level = [
            child
            for item in level
            if isinstance(item, dict | list | tuple)
            for child in (item.values() if isinstance(item, dict) else item)
        ]
        if not level:
            return False
    return any(isinstance(item, dict | list | tuple) for item in level)


def too_deep(field: str) -> InvalidInputError:
    """The error refusing ``field`` for nesting deeper than :data:`MAX_JSON_DEPTH`."""
    return InvalidInputError(
        f"{field} nests deeper than {MAX_JSON_DEPTH} levels of arrays and objects", field=field
    )


def json_copy(value: Any, *, field: str) -> Any:
    """A deep copy through JSON, which is what every backend stores.

    Fails with :class:`InvalidInputError` when ``value`` cannot be stored as JSON, so every
    backend accepts and returns exactly the same data.
    """
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except RecursionError:
        raise too_deep(field) from None
    except (TypeError, ValueError) as exc:
        require_finite(value, field=field)  # the usual ValueError, said with its place
        raise InvalidInputError(f"{field} must be JSON-serialisable: {exc}", field=field) from None
    require_shallow_json(text, field=field)
    if not _encodes(text):
        require_utf8(value, field=field)
    copy = json.loads(text)
    if json.dumps(copy, ensure_ascii=False) != text:
        # Two keys of a dict became one JSON key (1 and "1"): the copy kept one value alone.
        require_distinct_keys(value, field=field)
    return copy


def colliding_keys(
    value: Any, path: tuple[str | int, ...] = ()
) -> tuple[tuple[str | int, ...], Any, Any] | None:
    """Where in ``value`` (nested dicts and lists) a dict has two keys that are one key in
    JSON (``1`` and ``"1"``, ``True`` and ``"true"``): the dict's place and the two keys.

    >>> colliding_keys({"a": [{1: "int", "1": "str"}]})
    (('a', 0), 1, '1')
    >>> colliding_keys({"a": {1: "int", 2: "two"}}) is None
    True
    """
    if isinstance(value, dict):
        seen: dict[str, Any] = {}
        for key, item in value.items():
            name = _json_key(key)
            if name in seen:
                return path, seen[name], key
            seen[name] = key
            found = colliding_keys(item, (*path, name))
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = colliding_keys(item, (*path, index))
            if found is not None:
                return found
    return None


def _json_key(key: Any) -> str:
    """The key of a JSON object that the dict key ``key`` becomes (``json`` writes a number,
    a boolean or None as its JSON text).

    >>> _json_key(1), _json_key(True), _json_key(None), _json_key("x")
    ('1', 'true', 'null', 'x')
    """
    if isinstance(key, str):
        return key
    written: str = next(iter(json.loads(json.dumps({key: None}))))
    return written


def require_distinct_keys(value: Any, *, field: str) -> None:
    """Refuse ``value`` when a dict in it has two keys that are one key in JSON (422 naming
    where): stored, one of their values would be lost."""
    found = colliding_keys(value)
    if found is not None:
        path, first, second = found
        loc = [field, *path]
        raise InvalidInputError(
            f"{'.'.join(str(p) for p in loc)} has the keys {first!r} and {second!r}, which are "
            f"one key in JSON ({_json_key(second)!r}): one of their values would be lost",
            errors=[{"loc": [*loc, _json_key(second)], "msg": "a key given twice"}],
        )


def require_positive_int(value: Any, *, field: str, maximum: int | None = None) -> int:
    """``value`` as an int of at least 1 (and at most ``maximum``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{field} must be an integer", field=field)
    if value < 1:
        raise InvalidInputError(f"{field} must be at least 1, got {value}", field=field)
    if maximum is not None and value > maximum:
        raise InvalidInputError(f"{field} must be at most {maximum}, got {value}", field=field)
    return value


def optional_positive_int(value: Any, *, field: str) -> int | None:
    """None, or ``value`` as an int of at least 1 (optional limits such as a TTL)."""
    return None if value is None else require_positive_int(value, field=field)


def optional_ttl_seconds(value: Any) -> int | None:
    """None (nothing expires), or ``value`` as a ``ttl_seconds`` every store can take: at
    most :data:`MAX_TTL_SECONDS`.

    >>> optional_ttl_seconds(86400), optional_ttl_seconds(None)
    (86400, None)
    """
    if value is None:
        return None
    return require_positive_int(value, field="ttl_seconds", maximum=MAX_TTL_SECONDS)


def encode_cursor(payload: Mapping[str, Any]) -> str:
    """An opaque, URL-safe cursor carrying ``payload``."""
    raw = json.dumps(dict(payload), separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: Any) -> dict[str, Any]:
    """The payload of a cursor made by :func:`encode_cursor`."""
    if not isinstance(cursor, str) or not cursor:
        raise InvalidInputError("cursor must be a non-empty string", field="cursor")
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        payload = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError):
        raise InvalidInputError("cursor is not valid", field="cursor") from None
    if not isinstance(payload, dict):
        raise InvalidInputError("cursor is not valid", field="cursor")
    return payload


def _position(payload: Mapping[str, Any], key: str, valid: bool) -> int:
    value = payload.get(key)
    if not valid or isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError("cursor is not valid", field="cursor")
    return value


def session_tag(user_id: str, session_id: str, created: str) -> str:
    """A short digest naming one session: of its user and id, and ``created``, what tells it
    from an earlier session of the same id (its generation: :func:`new_session_generation`).

    >>> session_tag("u", "s", "1") == session_tag("u", "s", "1") != session_tag("u", "s", "2")
    True
    """
    digest = hashlib.sha256("\0".join((user_id, session_id, created)).encode()).digest()
    return base64.urlsafe_b64encode(digest[:9]).decode()


def new_session_generation() -> str:
    """A value telling a new session from every earlier one of its user and id (the
    ``created`` of :func:`session_tag`). Random, not a count: a count kept with the user's
    data starts again once that data is erased or expires, and a cursor of the first
    session of an id would then page the one made after it."""
    return secrets.token_hex(8)


def listing_tag(user_id: str, generation: str) -> str:
    """A short digest naming one listing of a user's sessions: of the user, and the
    generation of the creation counter ordering them (random, made with the counter), what
    tells it from the listing of the sessions made after the user's data was erased or
    expired (the counter then starts again: their orders are those of the sessions gone).

    >>> listing_tag("u", "g1") == listing_tag("u", "g1") != listing_tag("u", "g2")
    True
    """
    digest = hashlib.sha256("\0".join(("sessions", user_id, generation)).encode()).digest()
    return base64.urlsafe_b64encode(digest[:9]).decode()


def listing_cursor(position: int, tag: str | None) -> str:
    """A cursor of the listing ``tag`` names (:func:`listing_tag`; None: of a counter
    stored without a generation), read on after the creation order ``position``."""
    return encode_cursor(
        {"after": position} if tag is None else {"after": position, "listing": tag}
    )


def listing_cursor_position(cursor: str | None) -> tuple[int, str | None]:
    """The creation order a cursor made by :func:`listing_cursor` reads on after, and the
    tag of its listing (``""``: none; check it with :func:`check_cursor_listing`);
    ``(0, None)`` with no cursor. A cursor of one session's messages (see
    :func:`session_cursor`) is none of these.

    >>> listing_cursor_position(listing_cursor(4, "tag")), listing_cursor_position(None)
    ((4, 'tag'), (0, None))
    """
    if cursor is None:
        return 0, None
    payload = decode_cursor(cursor)
    tag = payload.get("listing", "")
    valid = "session" not in payload and isinstance(tag, str)
    return _position(payload, "after", valid), tag


def check_cursor_listing(tag: str | None, listing: str | None) -> None:
    """Refuse a sessions cursor (``tag``: its listing's, None when there is no cursor) not
    of ``listing`` (the tag of the user's listing now, None when their counter has no
    generation): it lists another user's sessions, or those the user had before their data
    was erased or expired, and read on from its place among the sessions made since, it
    would pass over the first of them."""
    if tag is not None and tag != (listing or ""):
        raise InvalidInputError(
            "cursor is not valid: it lists another user's sessions, or sessions erased or "
            "expired since (list again from the start)",
            field="cursor",
        )


def session_cursor(key: str, position: int, tag: str) -> str:
    """A cursor of the messages of the session ``tag`` names (:func:`session_tag`), read on
    from ``position``: used on another session (or on a list of sessions) it is refused."""
    return encode_cursor({key: position, "session": tag})


def session_cursor_position(cursor: str | None, key: str) -> tuple[int, str | None]:
    """The position ``key`` of a cursor made by :func:`session_cursor`, and the tag of its
    session (check it with :func:`check_cursor_session`); ``(0, None)`` with no cursor.

    >>> session_cursor_position(session_cursor("offset", 4, "tag"), "offset")
    (4, 'tag')
    """
    if cursor is None:
        return 0, None
    payload = decode_cursor(cursor)
    tag = payload.get("session")
    return _position(payload, key, isinstance(tag, str)), tag


def check_cursor_session(tag: str | None, session: str) -> None:
    """Refuse a messages cursor whose session tag is not ``session`` (the tag of the
    session read): it pages another session, or an earlier one of the same id."""
    if tag is not None and tag != session:
        raise InvalidInputError(
            "cursor is not valid: it pages another session, or an earlier session of this id",
            field="cursor",
        )


# Why a user message without content is refused: stored, it would reach the model with every
# later turn of its session, and some chat APIs refuse it.
BLANK_USER_MESSAGE = (
    "a user message needs content: text that is not blank, or a part such as an image"
)


def is_blank_text(text: str) -> bool:
    r"""Whether ``text`` shows nothing: it holds only whitespace and format characters (zero
    width spaces and joiners, word joiners, soft hyphens, byte order marks...), which a chat
    shows as an empty message. Text such as an emoji sequence joined by zero width joiners
    shows its emoji: it is not blank. Cheap for ordinary text: read up to its first visible
    character.

    >>> is_blank_text(" \u200b\u2060\ufeff\u00ad\n"), is_blank_text("\u200b\U0001f468\u200d")
    (True, False)
    """
    return all(char.isspace() or unicodedata.category(char) == "Cf" for char in text)


def is_blank_user_message(message: Any) -> bool:
    """Whether ``message`` is a user's message holding nothing: no content, or text that
    shows nothing (see :func:`is_blank_text`)."""
    if getattr(message, "role", None) != "user":
        return False
    return all(
        getattr(part, "type", None) == "text" and is_blank_text(getattr(part, "text", None) or "")
        for part in getattr(message, "content", None) or []
    )


def refuse_blank_user_messages(messages: list[Any], *, field: str) -> None:
    """Refuse (naming ``field[i].content``) the first user message of ``messages`` holding
    nothing (see :func:`is_blank_user_message`)."""
    for index, message in enumerate(messages):
        if is_blank_user_message(message):
            raise InvalidInputError(
                f"{field}[{index}].content: {BLANK_USER_MESSAGE}", field=f"{field}[{index}].content"
            )


def refuse_images_no_model_takes(messages: list[Message], *, field: str) -> None:
    """Refuse (naming ``field[i].content[j].image_url``) the first image of ``messages`` a
    model cannot be shown (see :func:`is_model_image_url`): stored, it would be sent with
    every later turn of the session, which the chat API refuses each time; and a path would
    be read from the server's own disk by agents that take local images."""
    for index, message in enumerate(messages):
        for at, part in enumerate(message.content or []):
            if isinstance(part, ImageContent) and not is_model_image_url(part.image_url):
                where = f"{field}[{index}].content[{at}].image_url"
                raise InvalidInputError(f"{where}: {MODEL_IMAGE_RULE}", field=where)


__all__ = [
    "BIDI_CONTROLS",
    "BLANK_USER_MESSAGE",
    "DEFAULT_SESSION_ID",
    "MAX_ID_LENGTH",
    "MAX_JSON_DEPTH",
    "MAX_TTL_SECONDS",
    "check_cursor_listing",
    "check_cursor_session",
    "clean_session_id",
    "colliding_keys",
    "decode_cursor",
    "encode_cursor",
    "is_blank_text",
    "is_blank_user_message",
    "json_copy",
    "listing_cursor",
    "listing_cursor_position",
    "listing_tag",
    "nests_deeper_than",
    "new_or_clean_session_id",
    "new_session_generation",
    "nonfinite_path",
    "optional_positive_int",
    "optional_ttl_seconds",
    "refuse_blank_user_messages",
    "refuse_images_no_model_takes",
    "require_distinct_keys",
    "require_finite",
    "require_positive_int",
    "require_shallow_json",
    "require_unpadded_user_id",
    "require_user_id",
    "require_user_id_shown_as_written",
    "require_utf8",
    "session_cursor",
    "session_cursor_position",
    "session_id_or_default",
    "session_tag",
    "to_encoded_messages",
    "to_message",
    "to_messages",
    "to_query_messages",
    "too_deep",
    "unencodable_path",
]
