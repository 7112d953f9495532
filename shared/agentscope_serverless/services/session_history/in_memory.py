"""Session history in the process's memory: the embedded default for local runs and tests.

Messages are kept as the JSON every store keeps (:mod:`.._stored`): strings, which the
garbage collector never has to walk, so a long-lived local server's collections stay short
however much history it holds.

Each message gets a number when it is appended, never given again in its session nor
changed: a ``list_messages`` cursor holds the number to read on from, so deleting messages
neither skips nor repeats one for a reader paging through the session.

With ``max_messages_per_session`` a session keeps its newest N messages, as on Redis: an
append trims the oldest, and the ids of the trimmed messages go with them (an append
repeating one stores it again); a cursor keeps its place, one into the trimmed messages
reads on from the oldest message kept.
"""

from __future__ import annotations

import itertools
from array import array
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.schemas.pagination import Page
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services._stored import (
    decode_message,
    decode_messages,
    encode_message,
    stored_session,
)
from agentscope_serverless.services._validation import (
    check_cursor_listing,
    check_cursor_session,
    listing_cursor,
    listing_cursor_position,
    listing_tag,
    new_session_generation,
    optional_positive_int,
    session_cursor,
    session_cursor_position,
    session_tag,
)
from agentscope_serverless.services.session_history.base import SessionHistoryService, remark


@dataclass(slots=True)
class _StoredSession:
    seq: int
    # Tells the session from an earlier one of its id, in its messages cursors
    # (:func:`new_session_generation`).
    generation: str = field(default_factory=new_session_generation)
    # The messages kept, as JSON in order, with their numbers (ascending: ``numbers[i]`` is
    # that of ``messages[i]``), and each one's id with its number. ``by_id`` lists the ids
    # in append order, so the trimmed ones are its first. ``appended``: how many numbers
    # were given (the next message's).
    messages: list[str] = field(default_factory=list)
    numbers: array[int] = field(default_factory=lambda: array("q"))
    by_id: dict[str, int] = field(default_factory=dict)
    appended: int = 0
    # The marks of the messages having any, by id.
    marks: dict[str, list[str]] = field(default_factory=dict)
    summary: str = ""


class InMemorySessionHistoryService(SessionHistoryService):
    """Sessions kept in a dict: ``{user_id: {session_id: messages}}``.

    Data lives as long as the object; ``stop()`` keeps it, so a restarted service sees it.
    Stored messages are JSON: changing a returned session changes nothing stored.
    ``max_messages_per_session`` keeps only the newest messages.

    >>> service = InMemorySessionHistoryService()
    >>> short = InMemorySessionHistoryService(max_messages_per_session=100)
    """

    def __init__(self, *, max_messages_per_session: int | None = None) -> None:
        self._sessions: dict[str, dict[str, _StoredSession]] = {}
        # Each user's creation counter, as on Redis and DynamoDB: a list cursor holds its
        # value, so one shared by all users would tell how many sessions others created.
        # Kept when the user's last session is deleted (a cursor read before stays in
        # place), erased with the user's data: it starts again, of a new generation (random,
        # as a session's), which refuses the cursors of the sessions erased (see
        # :func:`listing_tag`). A tuple (count, generation): of atoms, untracked by the
        # garbage collector.
        self._created: dict[str, tuple[int, str]] = {}
        self._max_messages = optional_positive_int(
            max_messages_per_session, field="max_messages_per_session"
        )

    async def _create_session(self, user_id: str, session_id: str) -> Session:
        stored = self._stored_or_new(user_id, session_id)
        return self._to_session(user_id, session_id, stored)

    async def _open_session(self, user_id: str, session_id: str, recent: int) -> Session:
        stored = self._stored_or_new(user_id, session_id)
        return self._to_session(user_id, session_id, stored, recent)

    async def _get_session(self, user_id: str, session_id: str) -> Session | None:
        stored = self._sessions.get(user_id, {}).get(session_id)
        return None if stored is None else self._to_session(user_id, session_id, stored)

    async def _delete_session(self, user_id: str, session_id: str) -> None:
        user_sessions = self._sessions.get(user_id, {})
        user_sessions.pop(session_id, None)
        if not user_sessions:
            self._sessions.pop(user_id, None)

    async def _delete_user_sessions(self, user_id: str) -> None:
        self._sessions.pop(user_id, None)
        self._created.pop(user_id, None)

    async def _list_sessions_page(
        self, user_id: str, limit: int, cursor: str | None
    ) -> Page[Session]:
        after, tag = listing_cursor_position(cursor)
        counter = self._created.get(user_id)
        listing = None if counter is None else listing_tag(user_id, counter[1])
        check_cursor_listing(tag, listing)
        ordered = sorted(
            (stored.seq, sid) for sid, stored in self._sessions.get(user_id, {}).items()
        )
        remaining = [(seq, sid) for seq, sid in ordered if seq > after]
        page = remaining[:limit]
        next_cursor = listing_cursor(page[-1][0], listing) if len(remaining) > limit else None
        return Page[Session](
            items=[Session(id=sid, user_id=user_id, messages=[]) for _, sid in page],
            next_cursor=next_cursor,
        )

    async def _list_messages(
        self, user_id: str, session_id: str, limit: int, cursor: str | None
    ) -> Page[Message] | None:
        # The number of the first message to read (trimmed or deleted: the next one kept).
        offset, tag = session_cursor_position(cursor, "offset")  # bad: one, session or not
        stored = self._sessions.get(user_id, {}).get(session_id)
        if stored is None:
            return None
        session = session_tag(user_id, session_id, stored.generation)
        check_cursor_session(tag, session)
        first = bisect_left(stored.numbers, offset)
        end = min(first + limit, len(stored.messages))
        return Page[Message](
            items=decode_messages(stored.messages[first:end]),
            next_cursor=(
                session_cursor("offset", stored.numbers[end - 1] + 1, session)
                if end < len(stored.messages)
                else None
            ),
        )

    async def _append_messages(
        self, user_id: str, session_id: str, messages: list[Message]
    ) -> list[Message]:
        return await self._append_messages_unless(user_id, session_id, messages, None)

    async def _append_messages_unless(
        self,
        user_id: str,
        session_id: str,
        messages: list[Message],
        refuse: Callable[[list[Message]], None] | None,
    ) -> list[Message]:
        # Without an await, no other call runs until it is done.
        stored = self._stored_or_new(user_id, session_id)
        result: list[Message] = []
        new: dict[str, Message] = {}
        for message in messages:
            number = stored.by_id.get(message.id)
            if number is None:
                result.append(new.setdefault(message.id, message))
            else:
                result.append(decode_message(stored.messages[_index(stored, number)]))
        if refuse is not None:
            refuse(result)
        for message_id, message in new.items():
            stored.by_id[message_id] = stored.appended
            stored.numbers.append(stored.appended)
            stored.appended += 1
            stored.messages.append(encode_message(message, messages))
        if self._max_messages is not None and len(stored.messages) > self._max_messages:
            _trim(stored, len(stored.messages) - self._max_messages)
        return result

    async def _stored_messages(
        self, user_id: str, session_id: str, message_ids: list[str]
    ) -> dict[str, Message]:
        stored = self._sessions.get(user_id, {}).get(session_id)
        if stored is None:
            return {}
        numbers = {i: stored.by_id[i] for i in message_ids if i in stored.by_id}
        return {
            i: decode_message(stored.messages[_index(stored, number)])
            for i, number in numbers.items()
        }

    async def _delete_messages(self, user_id: str, session_id: str, message_ids: list[str]) -> int:
        stored = self._sessions.get(user_id, {}).get(session_id)
        if stored is None:
            return 0
        gone = {i for i in message_ids if i in stored.by_id}
        if not gone:
            return 0
        # The others keep their numbers (a cursor holds one).
        gone_numbers = {stored.by_id.pop(i) for i in gone}
        kept = [k for k, number in enumerate(stored.numbers) if number not in gone_numbers]
        stored.messages = [stored.messages[k] for k in kept]
        stored.numbers = array("q", [stored.numbers[k] for k in kept])
        for message_id in gone:
            stored.marks.pop(message_id, None)
        return len(gone)

    async def _message_marks(self, user_id: str, session_id: str) -> dict[str, list[str]]:
        stored = self._sessions.get(user_id, {}).get(session_id)
        if stored is None:
            return {}
        return {i: list(marks) for i, marks in stored.marks.items() if i in stored.by_id}

    async def _update_message_marks(
        self,
        user_id: str,
        session_id: str,
        new_mark: str | None,
        old_mark: str | None,
        message_ids: list[str] | None,
    ) -> int:
        stored = self._sessions.get(user_id, {}).get(session_id)
        if stored is None:
            return 0
        ids = stored.by_id if message_ids is None else [i for i in message_ids if i in stored.by_id]
        updated = 0
        for message_id in ids:
            marks = remark(stored.marks.get(message_id, []), new_mark, old_mark)
            if marks is None:
                continue
            updated += 1
            if marks:
                stored.marks[message_id] = marks
            else:
                stored.marks.pop(message_id, None)
        return updated

    async def _session_summary(self, user_id: str, session_id: str) -> str:
        stored = self._sessions.get(user_id, {}).get(session_id)
        return "" if stored is None else stored.summary

    async def _set_session_summary(self, user_id: str, session_id: str, summary: str) -> None:
        self._stored_or_new(user_id, session_id).summary = summary

    def _stored_or_new(self, user_id: str, session_id: str) -> _StoredSession:
        """The session as stored, made (empty) if missing."""
        stored = self._sessions.setdefault(user_id, {}).get(session_id)
        if stored is None:
            count, generation = self._created.get(user_id) or (0, new_session_generation())
            self._created[user_id] = (count + 1, generation)
            stored = self._sessions[user_id][session_id] = _StoredSession(count + 1)
        return stored

    @staticmethod
    def _to_session(
        user_id: str, session_id: str, stored: _StoredSession, recent: int | None = None
    ) -> Session:
        # A snapshot now (later appends are not part of this read), decoded on first use.
        first = 0 if recent is None else max(len(stored.messages) - recent, 0)
        return stored_session(user_id, session_id, stored.messages[first:] if recent != 0 else [])


def _index(stored: _StoredSession, number: int) -> int:
    """Where the message numbered ``number`` (one kept) is in ``stored.messages``."""
    return bisect_left(stored.numbers, number)


def _trim(stored: _StoredSession, count: int) -> None:
    """Drop the ``count`` oldest messages of the session, and their ids and marks."""
    del stored.messages[:count]
    del stored.numbers[:count]
    for message_id in list(itertools.islice(stored.by_id, count)):
        del stored.by_id[message_id]
        stored.marks.pop(message_id, None)


__all__ = ["InMemorySessionHistoryService"]
