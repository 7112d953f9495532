"""The session history interface, and the behaviour every backend shares.

Backends implement the ``_``-prefixed hooks; the public methods validate and normalise
their arguments first, so every backend treats ids, messages and limits the same way.
"""

from __future__ import annotations

import functools
from abc import abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from agentscope_serverless.errors import (
    InvalidInputError,
    MessageIdConflictError,
    SessionNotFoundError,
)
from agentscope_serverless.schemas.agent_schemas import Message, said
from agentscope_serverless.schemas.pagination import Page
from agentscope_serverless.schemas.session import Session, extend_messages
from agentscope_serverless.services._ported import (
    SESSION_HISTORY_HOOKS,
    SESSION_HISTORY_METHODS,
    adapt_ported_subclass,
    agentscope_base_method,
)
from agentscope_serverless.services._stored import EncodedMessages
from agentscope_serverless.services._turn import note_history_write
from agentscope_serverless.services._validation import (
    clean_session_id,
    new_or_clean_session_id,
    require_positive_int,
    require_user_id,
    require_utf8,
    to_encoded_messages,
)
from agentscope_serverless.services.base import (
    PreparedWrite,
    ServiceWithLifecycleManager,
    StartedGuard,
    service_call,
)

MAX_PAGE_SIZE = 1000


class SessionHistoryService(StartedGuard, ServiceWithLifecycleManager):
    """Conversations of users, each an ordered list of messages.

    >>> async def demo(service: SessionHistoryService) -> None:
    ...     session = await service.create_session("u1", "s1")
    ...     await service.append_message(session, {"role": "user", "content": "hi"})
    ...     (await service.get_session("u1", "s1")).messages[0].get_text_content()

    Guarantees on every backend:

    - ``create_session`` is idempotent: an existing session comes back unchanged.
    - ``get_session`` returns None for a missing session.
    - ``list_sessions`` lists exactly that user's sessions, without their messages.
    - ``append_message`` is atomic: concurrent appends all land, in one total order; a
      session that does not exist yet is created; a message whose id is already in the
      session is not appended again.
    - ``delete_messages`` and ``update_message_marks`` (AgentScope's memory API on the
      stored history) are atomic per message: concurrent appends, deletes and mark updates
      all land.
    """

    # Whether the backend prepares writes (see :meth:`prepare_append`).
    prepares_writes: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A backend written for AgentScope Runtime overrides the public methods instead.
        adapt_ported_subclass(
            cls, SessionHistoryService, SESSION_HISTORY_METHODS, SESSION_HISTORY_HOOKS
        )

    @agentscope_base_method
    @service_call
    async def create_session(self, user_id: str, session_id: str | None = None) -> Session:
        """Create a session (a fresh uuid when ``session_id`` is missing or blank).

        Creating a session that exists returns it unchanged, with its history.
        """
        user_id = require_user_id(user_id)
        return await self._create_session(user_id, new_or_clean_session_id(session_id))

    @service_call
    async def open_session(
        self, user_id: str, session_id: str | None = None, *, recent: int
    ) -> Session:
        """The session, created if missing, holding only its last ``recent`` messages.

        What a turn needs, read with one bounded query whatever the session's length
        (``recent=0`` reads no message at all). Older messages are paged through with
        :meth:`list_messages`.

        >>> async def turn(service: SessionHistoryService) -> None:
        ...     session = await service.open_session("u1", "s1", recent=100)
        """
        user_id = require_user_id(user_id)
        if isinstance(recent, bool) or not isinstance(recent, int) or recent < 0:
            raise InvalidInputError("recent must be an integer of at least 0", field="recent")
        recent = min(recent, MAX_PAGE_SIZE)
        return await self._open_session(user_id, new_or_clean_session_id(session_id), recent)

    @agentscope_base_method
    @service_call
    async def get_session(self, user_id: str, session_id: str) -> Session | None:
        """The session with its full history, or None when it does not exist."""
        user_id = require_user_id(user_id)
        sid = clean_session_id(session_id)
        if sid is None:
            return None
        return await self._get_session(user_id, sid)

    async def has_session(self, user_id: str, session_id: str) -> bool:
        """Whether the session exists (reading one message at most)."""
        try:
            await self.list_messages(user_id, session_id, limit=1)
        except SessionNotFoundError:
            return False
        return True

    @agentscope_base_method
    @service_call
    async def delete_session(self, user_id: str, session_id: str) -> None:
        """Delete a session and its history; deleting a missing session is not an error."""
        user_id = require_user_id(user_id)
        sid = clean_session_id(session_id)
        if sid is not None:
            await self._delete_session(user_id, sid)

    @service_call
    async def delete_user_sessions(self, user_id: str) -> None:
        """Delete every session of ``user_id`` with its history, at once.

        Sessions created after the call started may survive; none of those before do, and
        no other user's are touched.
        """
        await self._delete_user_sessions(require_user_id(user_id))

    @agentscope_base_method
    @service_call
    async def list_sessions(self, user_id: str) -> list[Session]:
        """Every session of ``user_id`` in creation order, with ``messages == []``."""
        sessions: list[Session] = []
        cursor: str | None = None
        while True:
            page = await self.list_sessions_page(user_id, limit=MAX_PAGE_SIZE, cursor=cursor)
            sessions.extend(page.items)
            if page.next_cursor is None:
                return sessions
            cursor = page.next_cursor

    @service_call
    async def list_sessions_page(
        self, user_id: str, *, limit: int = 50, cursor: str | None = None
    ) -> Page[Session]:
        """One page of ``list_sessions``; pass ``next_cursor`` back for the next one."""
        user_id = require_user_id(user_id)
        limit = require_positive_int(limit, field="limit", maximum=MAX_PAGE_SIZE)
        return await self._list_sessions_page(user_id, limit, cursor)

    @service_call
    async def list_messages(
        self, user_id: str, session_id: str, *, limit: int = 100, cursor: str | None = None
    ) -> Page[Message]:
        """One page of a session's messages in order.

        Raises :class:`SessionNotFoundError` when the session does not exist.
        """
        user_id = require_user_id(user_id)
        limit = require_positive_int(limit, field="limit", maximum=MAX_PAGE_SIZE)
        sid = clean_session_id(session_id)
        if sid is None:
            raise SessionNotFoundError(user_id, "")
        page = await self._list_messages(user_id, sid, limit, cursor)
        if page is None:
            raise SessionNotFoundError(user_id, sid)
        return page

    @agentscope_base_method
    @service_call
    async def append_message(
        self,
        session: Session,
        message: Message | dict[str, Any] | list[Message] | list[dict[str, Any]],
    ) -> None:
        """Append one message or a list of them (models or dicts) to ``session``.

        The messages are validated and stored as JSON (changing them afterwards changes
        nothing stored), and ``session.messages`` of the object passed in is extended with
        them. A session that does not exist yet is created.

        Appending is idempotent by message id: a message whose ``id`` is already in the
        session is not stored again, and ``session.messages`` gets the stored one unless it
        holds that id already (as it does on a retry with the same object, or with one read
        after the append), so a retried append duplicates neither the history nor the
        object's messages. An id given twice in one append is stored, and added, once.
        """
        await self._append(session, message)

    @service_call
    async def append_new_messages(
        self, session: Session, messages: list[Message], *, field: str, checked: bool = False
    ) -> set[str]:
        """:meth:`append_message`, refusing (:class:`MessageIdConflictError`, as
        :meth:`refuse_changed_messages` does) a message whose id, given by its sender, the
        session holds for a message saying something else: before the append (unless the
        caller ``checked`` them so already), and by the append itself, for another writer
        that stored the id in between (appends sent at once, each with its own text for one
        id: one stores its text, the others are refused). A refused append stores none of
        its messages.

        Returns the ids of the messages this append stored: not those the session held
        already, even when another writer stored them since they were checked (appends sent
        at once, each with the same message: one of them stores it, and says so).

        >>> async def post(service: SessionHistoryService, session: Session) -> set[str]:
        ...     return await service.append_new_messages(
        ...         session, [Message(id="m1")], field="message"
        ...     )
        """
        _require_session(session)
        if not checked:
            await self.refuse_changed_messages(session.user_id, session.id, messages, field=field)
        return await self._append(session, messages, field=field)

    async def _append(
        self, session: Session, message: Any, *, field: str | None = None
    ) -> set[str]:
        """Append ``message``; with ``field``, refusing, with none of them stored, messages
        one of which the append found stored under its id saying something else (see
        :meth:`append_new_messages`). Returns the ids of the messages it stored."""
        user_id, sid, messages = self._appending(session, message)
        if not messages:
            return set()
        note_history_write(user_id, sid)
        if field is not None and any("id" in m.model_fields_set for m in messages):
            refuse = functools.partial(_refuse_stored_by_others, messages, field=field)
            stored = await self._append_messages_unless(user_id, sid, messages, refuse)
        else:
            stored = await self._append_messages(user_id, sid, messages)
        _add_appended(session, messages, stored)
        # The backends answer the very message given for each one the append stored.
        return {m.id for m, result in zip(messages, stored, strict=True) if result is m}

    @service_call
    async def stored_messages(
        self, user_id: str, session_id: str, message_ids: list[str]
    ) -> dict[str, Message]:
        """The session's messages with these ids, by id: those it holds (``{}`` for a
        missing session). Reads these messages alone, whatever the session's length.

        >>> async def stored(service: SessionHistoryService) -> bool:
        ...     return "m1" in await service.stored_messages("u1", "s1", ["m1"])
        """
        user_id = require_user_id(user_id)
        ids = _message_ids(message_ids, field="message_ids")
        sid = clean_session_id(session_id)
        if sid is None or not ids:
            return {}
        return await self._stored_messages(user_id, sid, ids)

    async def refuse_changed_messages(
        self,
        user_id: str,
        session_id: str,
        messages: list[Message],
        *,
        field: str,
        made_too: bool = False,
    ) -> set[str]:
        """Refuse messages to be appended whose id, given by their sender, names another
        message: one of the session, or earlier in ``messages``, with another role, type or
        content. Raises :class:`MessageIdConflictError` (409) naming ``field[i].id``. Returns
        the ids of ``messages`` the session holds.

        Appended, such a message would not be stored (a session keeps one message per id),
        so this is checked before whatever the append follows (a run of the agent). The
        very same message again passes: it is a retry, which the append stores once. Only
        ids given by the sender are looked up (``"id" in message.model_fields_set``): a made
        one is new, unless ``made_too`` (a retry's messages, whose ids were made as its
        earlier try's were).
        """
        given = [(i, m) for i, m in enumerate(messages) if made_too or "id" in m.model_fields_set]
        if not given:
            return set()
        stored = await self.stored_messages(user_id, session_id, [m.id for _, m in given])
        held = set(stored)
        for position, message in given:
            first = stored.setdefault(message.id, message)
            if not _says_the_same(first, message):
                raise MessageIdConflictError(
                    f"{field}[{position}].id names a message already in the session (or "
                    "earlier in this request) that says something else: a session keeps one "
                    "message per id, so give a new message an id of its own (the very same "
                    "message again is taken as a retry, and stored once)"
                )
        return held

    @service_call
    async def delete_messages(self, user_id: str, session_id: str, message_ids: list[str]) -> int:
        """Delete the messages with these ids (and their marks) from the session; how many
        were deleted (an id not in it, or a missing session, counts for none).

        A deleted message's id may be appended again (at the end of the history).

        >>> async def forget(service: SessionHistoryService, message_id: str) -> int:
        ...     return await service.delete_messages("u1", "s1", [message_id])
        """
        user_id = require_user_id(user_id)
        ids = _message_ids(message_ids, field="message_ids")
        sid = clean_session_id(session_id)
        if sid is None or not ids:
            return 0
        return await self._delete_messages(user_id, sid, ids)

    @service_call
    async def message_marks(self, user_id: str, session_id: str) -> dict[str, list[str]]:
        """The marks of the session's messages: ``{message id: [mark, ...]}``, for the
        messages having any (``{}`` for a missing session)."""
        user_id = require_user_id(user_id)
        sid = clean_session_id(session_id)
        if sid is None:
            return {}
        return await self._message_marks(user_id, sid)

    @service_call
    async def update_message_marks(
        self,
        user_id: str,
        session_id: str,
        new_mark: str | None,
        old_mark: str | None = None,
        message_ids: list[str] | None = None,
    ) -> int:
        """Mark messages as AgentScope's ``MemoryBase.update_messages_mark`` does; how many
        were updated.

        The messages are those with ``message_ids`` (every message of the session when
        None) holding ``old_mark`` (when given), which they lose; each gets ``new_mark``
        (when given). With neither mark, nothing changes.

        >>> async def compress(service: SessionHistoryService, ids: list[str]) -> int:
        ...     return await service.update_message_marks("u1", "s1", "compressed", None, ids)
        """
        user_id = require_user_id(user_id)
        new_mark = _optional_mark(new_mark, field="new_mark")
        old_mark = _optional_mark(old_mark, field="old_mark")
        ids = None if message_ids is None else _message_ids(message_ids, field="message_ids")
        sid = clean_session_id(session_id)
        if sid is None or (new_mark is None and old_mark is None) or ids == []:
            return 0
        return await self._update_message_marks(user_id, sid, new_mark, old_mark, ids)

    @service_call
    async def session_summary(self, user_id: str, session_id: str) -> str:
        """The summary kept with the session (``""`` when none, or no session): what an
        AgentScope memory compressed its older messages into."""
        user_id = require_user_id(user_id)
        sid = clean_session_id(session_id)
        if sid is None:
            return ""
        return await self._session_summary(user_id, sid)

    @service_call
    async def set_session_summary(self, user_id: str, session_id: str, summary: str) -> None:
        """Keep ``summary`` with the session (created if missing), in place of the one it
        had; ``""`` removes it. The history stays as it is.

        A summary of any length is kept whole on every backend, as a message is: no limit
        of its own (on DynamoDB it is split across items as a large message is, and kept
        out of the session item, so a turn reading the session reads none of it).

        >>> async def compress(service: SessionHistoryService) -> None:
        ...     await service.set_session_summary("u1", "s1", "They planned a trip.")
        """
        user_id = require_user_id(user_id)
        if not isinstance(summary, str):
            raise InvalidInputError("summary must be a string", field="summary")
        require_utf8(summary, field="summary")
        await self._set_session_summary(user_id, new_or_clean_session_id(session_id), summary)

    def prepare_append(self, session: Session, messages: list[Message]) -> PreparedWrite | None:
        """:meth:`append_message` of ``messages``, prepared to be applied with a write of
        another service in one request (see :class:`PreparedWrite`); its result is None.
        None when the backend cannot (then call :meth:`append_message`)."""
        if not self.prepares_writes:
            return None
        user_id, sid, checked = self._appending(session, messages)
        if not checked:
            return None
        return self._prepare_append(
            user_id, sid, checked, functools.partial(_add_appended, session, checked)
        )

    def _appending(self, session: Session, message: Any) -> tuple[str, str, list[Message]]:
        self._ensure_started()
        _require_session(session)
        user_id = require_user_id(session.user_id)
        sid = clean_session_id(session.id)
        if sid is None:
            raise InvalidInputError("session.id must not be blank", field="session.id")
        return user_id, sid, EncodedMessages(to_encoded_messages(message))

    def _prepare_append(
        self,
        user_id: str,
        session_id: str,
        messages: list[Message],
        stored: Callable[[list[Message]], Any],
    ) -> PreparedWrite | None:
        """``_append_messages`` as a prepared write whose result is ``stored`` of its
        result (backends that set ``prepares_writes``)."""
        return None

    @abstractmethod
    async def _create_session(self, user_id: str, session_id: str) -> Session:
        """Create the session if missing; return it as stored (with its history)."""

    @abstractmethod
    async def _open_session(self, user_id: str, session_id: str, recent: int) -> Session:
        """Create the session if missing; return it with its last ``recent`` messages only.

        Reads at most ``recent`` messages from the store.
        """

    @abstractmethod
    async def _get_session(self, user_id: str, session_id: str) -> Session | None:
        """The stored session with every message, or None."""

    @abstractmethod
    async def _delete_session(self, user_id: str, session_id: str) -> None:
        """Remove the session and its messages, if present."""

    @abstractmethod
    async def _list_sessions_page(
        self, user_id: str, limit: int, cursor: str | None
    ) -> Page[Session]:
        """A page of the user's sessions, oldest first, without messages.

        The cursor must only encode a position inside this user's own listing, never a
        raw store key, so a forged cursor cannot reach another user's data.
        """

    @abstractmethod
    async def _list_messages(
        self, user_id: str, session_id: str, limit: int, cursor: str | None
    ) -> Page[Message] | None:
        """A page of the session's messages, or None when the session does not exist."""

    @abstractmethod
    async def _append_messages(
        self, user_id: str, session_id: str, messages: list[Message]
    ) -> list[Message]:
        """Append ``messages`` (already validated) in order, creating the session.

        A message whose id is already in the session (or earlier in ``messages``) is skipped.
        Returns, for each message given, that very message when this call stored it, else the
        stored one with its id (another object).
        """

    async def _append_messages_unless(
        self,
        user_id: str,
        session_id: str,
        messages: list[Message],
        refuse: Callable[[list[Message]], None],
    ) -> list[Message]:
        """``_append_messages``, all or none: ``refuse`` is called with what it would answer
        (for each message the one the session holds under its id, else itself) before any
        of them is stored, and none is when it raises.

        This one stores them, then calls ``refuse`` (a backend written for AgentScope
        Runtime): the backends here override it to call it first, atomically."""
        stored = await self._append_messages(user_id, session_id, messages)
        refuse(stored)
        return stored

    @abstractmethod
    async def _delete_user_sessions(self, user_id: str) -> None:
        """Remove every session of the user and their messages."""

    async def _stored_messages(
        self, user_id: str, session_id: str, message_ids: list[str]
    ) -> dict[str, Message]:
        """The session's messages with ``message_ids`` (distinct), by id. This reads the
        whole session: backends look the ids up instead."""
        session = await self._get_session(user_id, session_id)
        wanted = set(message_ids)
        return {
            m.id: m
            for m in (session.messages if session is not None else [])
            if isinstance(m, Message) and m.id in wanted
        }

    async def _delete_messages(self, user_id: str, session_id: str, message_ids: list[str]) -> int:
        """Remove the messages with ``message_ids`` (distinct) and their marks, atomically
        for each; how many there were."""
        raise NotImplementedError(f"{type(self).__name__} cannot delete messages")

    async def _message_marks(self, user_id: str, session_id: str) -> dict[str, list[str]]:
        """The marks of the session's messages having any."""
        return {}

    async def _update_message_marks(
        self,
        user_id: str,
        session_id: str,
        new_mark: str | None,
        old_mark: str | None,
        message_ids: list[str] | None,
    ) -> int:
        """Apply :func:`remark` to the marks of each message (of ``message_ids``, distinct,
        or every one), atomically for each; how many it changed."""
        raise NotImplementedError(f"{type(self).__name__} cannot mark messages")

    async def _session_summary(self, user_id: str, session_id: str) -> str:
        """The session's summary, ``""`` when none."""
        return ""

    async def _set_session_summary(self, user_id: str, session_id: str, summary: str) -> None:
        """Replace the session's summary (``""``: remove it), creating the session."""
        raise NotImplementedError(f"{type(self).__name__} cannot keep a summary")


def _require_session(session: object) -> None:
    """Refuse what is not a :class:`Session` (a session id, say) where one is taken."""
    if not isinstance(session, Session):
        raise InvalidInputError(
            f"session must be a Session, got {type(session).__name__}", field="session"
        )


def _add_appended(session: Session, given: list[Message], stored: list[Message]) -> None:
    """Extend ``session.messages`` with what an append of ``given`` stored (``stored``, the
    answer of :meth:`SessionHistoryService._append_messages`): each id once, and a message
    the session held before the append only when the object does not hold its id yet.

    A message this append stored was in neither, so only for one it found stored are the
    object's messages looked at (their ids gathered once): a turn that appends to a window
    of history it never read does not decode it.
    """
    added: set[str] = set()
    held: set[Any] | None = None
    new: list[Message] = []
    for message, result in zip(given, stored, strict=True):
        if result.id in added:
            continue
        added.add(result.id)
        if result is not message:
            if held is None:
                held = {m.id if isinstance(m, Message) else m.get("id") for m in session.messages}
            if result.id in held:
                continue
        new.append(result)
    extend_messages(session, new)


def _refuse_stored_by_others(given: list[Message], stored: list[Message], *, field: str) -> None:
    """Raise :class:`MessageIdConflictError` when an append of ``given`` found one of their
    ids stored (``stored``, its answer) for a message saying something else."""
    for position, (message, result) in enumerate(zip(given, stored, strict=True)):
        if result is not message and not _says_the_same(result, message):
            raise MessageIdConflictError(
                f"{field}[{position}].id names a message another request stored in the "
                "session at the same time, which says something else: a session keeps one "
                "message per id, so give a new message an id of its own"
            )


def _says_the_same(stored: Message, given: Message) -> bool:
    """Whether ``given`` is ``stored`` again: the same role, type and content parts."""
    return stored.role == given.role and stored.type == given.type and said(stored) == said(given)


def remark(marks: list[str], new_mark: str | None, old_mark: str | None) -> list[str] | None:
    """``marks`` after ``update_message_marks``, None when the message is not updated.

    >>> remark(["a"], "b", "a"), remark(["a"], "b", None), remark(["a"], None, "c")
    (['b'], ['a', 'b'], None)
    """
    if old_mark is not None and old_mark not in marks:
        return None
    kept = [mark for mark in marks if mark != old_mark]
    if new_mark is None:
        return kept
    return kept if new_mark in kept else [*kept, new_mark]


def _message_ids(value: Any, *, field: str) -> list[str]:
    """The ids to look up, once each. Only text no store can take is refused: an id that a
    new message may no longer have (a control character, only whitespace) may name one
    stored before that rule, which stays reachable by it."""
    if not isinstance(value, list | tuple) or not all(isinstance(i, str) for i in value):
        raise InvalidInputError(f"{field} must be a list of message ids (strings)", field=field)
    require_utf8(value, field=field)
    return list(dict.fromkeys(value))


def _optional_mark(value: Any, *, field: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise InvalidInputError(f"{field} must be a non-empty string or None", field=field)
    require_utf8(value, field=field)
    return value


__all__ = ["MAX_PAGE_SIZE", "SessionHistoryService", "remark"]
