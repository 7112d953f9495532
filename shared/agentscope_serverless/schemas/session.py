"""The :class:`Session` model: one conversation of one user."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, field_serializer
from pydantic.main import TupleGenerator

from agentscope_serverless.schemas.agent_schemas import Message

SessionMessages = list[Message | dict[str, Any]]


class Session(BaseModel):
    """A conversation: its id, its owner and its messages in order.

    >>> Session(id="s1", user_id="u1").messages
    []
    """

    id: str
    user_id: str
    messages: SessionMessages = Field(default_factory=list)

    @classmethod
    def with_deferred_messages(
        cls, id: str, user_id: str, load: Callable[[], SessionMessages]
    ) -> Session:
        """A session whose ``messages`` are ``load()``, called once, on their first use.

        What a store returns: a read that only needs the session, or a few of its messages,
        does not pay for decoding a long history. ``id`` and ``user_id`` are taken as they
        are (a store's own, already checked).

        >>> session = Session.with_deferred_messages("s1", "u1", lambda: [])
        >>> session.messages
        []
        """
        deferred = _DeferredMessages(load)
        return cls.model_construct(id=id, user_id=user_id, messages=deferred)  # type: ignore[arg-type]

    # pydantic-core reads the field from ``__dict__``, past the attribute set below. No
    # return annotation: the field's own type stays its schema (OpenAPI included).
    @field_serializer("messages", mode="wrap")
    def _serialize_messages(self, _stored: Any, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        return handler(self.messages)

    def __iter__(self) -> TupleGenerator:
        # ``dict(session)`` reads ``__dict__`` too: hand out the made list.
        for name, value in super().__iter__():
            yield name, self.messages if name == "messages" else value


class _DeferredMessages:
    """Messages not made yet: what ``Session.__dict__["messages"]`` holds until first use.

    Shallow copies of the session share it, so they share the one list it makes, as they
    would share a list. Equality, ``repr``, deep copies and pickling use the made list.
    """

    __slots__ = ("_appended", "_load", "_messages")

    def __init__(self, load: Callable[[], SessionMessages]) -> None:
        self._load: Callable[[], SessionMessages] | None = load
        self._messages: SessionMessages | None = None
        # Messages added before the list was made: they follow the loaded ones.
        self._appended: SessionMessages = []

    def load(self) -> SessionMessages:
        if self._messages is None:
            assert self._load is not None
            messages = self._load()
            messages.extend(self._appended)
            self._messages, self._load, self._appended = messages, None, []
        return self._messages

    def extend(self, messages: Iterable[Message | dict[str, Any]]) -> None:
        target = self._appended if self._messages is None else self._messages
        target.extend(messages)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _DeferredMessages):
            other = other.load()
        return self.load() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self.load())

    def __deepcopy__(self, memo: dict[int, Any]) -> SessionMessages:
        return copy.deepcopy(self.load(), memo)

    def __reduce__(self) -> tuple[type[list[Any]], tuple[SessionMessages]]:
        return list, (self.load(),)


class _MessagesAttribute:
    """``session.messages``: makes deferred messages on first access, then a plain list.

    Pydantic keeps field values in the instance ``__dict__``; this data descriptor stands in
    front of that entry so that whoever reads ``session.messages`` (the runtime, an agent,
    a user's code handing it to another model) always gets the complete list itself.
    """

    def __get__(self, session: Session | None, owner: type[Session] | None = None) -> Any:
        if session is None:
            # A field, not a class attribute: pydantic looks it up on subclasses and must
            # not mistake this object for a default value.
            raise AttributeError("messages")
        messages = session.__dict__["messages"]
        if isinstance(messages, _DeferredMessages):
            messages = session.__dict__["messages"] = messages.load()
        return messages

    def __set__(self, session: Session, messages: Any) -> None:
        session.__dict__["messages"] = messages

    def __delete__(self, session: Session) -> None:
        del session.__dict__["messages"]


def extend_messages(session: Session, messages: Iterable[Message | dict[str, Any]]) -> None:
    """``session.messages.extend(messages)``, leaving deferred messages unmade: a turn that
    appends to its session without reading its history does not decode it.

    >>> session = Session.with_deferred_messages("s1", "u1", lambda: [Message(role="user")])
    >>> extend_messages(session, [Message(role="assistant")])
    >>> [m.role for m in session.messages]
    ['user', 'assistant']
    """
    messages_now = session.__dict__.get("messages")
    if isinstance(messages_now, _DeferredMessages):
        messages_now.extend(messages)
    else:
        session.messages.extend(messages)


# Set after the class is built, so pydantic still sees ``messages`` as a plain field.
type.__setattr__(Session, "messages", _MessagesAttribute())


__all__ = ["Session", "extend_messages"]
