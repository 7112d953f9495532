"""An AgentScope memory kept in a session history service.

>>> memory = AgentScopeSessionHistoryMemory(
...     service=session_history_service, user_id="alice", session_id="s1"
... )
>>> agent = ReActAgent(..., memory=memory)

What the agent adds is appended to the session (atomically, as any append); what it reads
is the session's history, so a new process (a new Lambda instance) picks the conversation
up where it was. ``state_dict()`` is empty: the state lives in the service.

Messages added with ``marks`` (AgentScope's ReActAgent marks the hints it gives its model
for one reasoning step, and deletes them by their mark right after) are kept by this object
only, after the history, until ``delete_by_mark`` or ``clear``: they are not the
conversation. Messages of the history are marked in the service
(``update_messages_mark``: AgentScope's ReActAgent marks those it compressed into a
summary, and reads its memory without them) and deleted from it (``delete``, and
``delete_by_mark``), each atomically: a message stored meanwhile by another process is
never lost. The summary (``update_compressed_summary``) is kept with the session too, and
put first when the memory is read.
"""

from __future__ import annotations

from typing import Any

from agentscope_serverless.adapters.agentscope import agentscope_missing

try:
    from agentscope.memory import MemoryBase  # type: ignore[import-not-found]
    from agentscope.message import Msg  # type: ignore[import-not-found]
except ModuleNotFoundError as exc:
    raise agentscope_missing(__name__, exc) from None

from agentscope_serverless.adapters.agentscope.message import (
    agentscope_msg_to_message,
    message_to_agentscope_msg,
)
from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services.session_history.base import SessionHistoryService, remark


class AgentScopeSessionHistoryMemory(MemoryBase):  # type: ignore[misc]
    """The history of ``(user_id, session_id)`` in ``service``, as an AgentScope memory."""

    def __init__(self, service: SessionHistoryService, user_id: str, session_id: str) -> None:
        super().__init__()
        self.service = service
        self.user_id = user_id
        self.session_id = session_id
        self._marked: list[tuple[Any, list[str]]] = []

    async def _session(self) -> Session:
        session = await self.service.get_session(self.user_id, self.session_id)
        if session is None:
            session = await self.service.create_session(self.user_id, self.session_id)
        return session

    async def add(
        self,
        memories: Any,
        allow_duplicates: bool = False,
        marks: str | list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        """Append ``memories`` (a ``Msg`` or a list; None is ignored) to the session; with
        ``marks``, keep them here instead."""
        if memories is None:
            return
        msgs = memories if isinstance(memories, list) else [memories]
        msgs = [m for m in msgs if m is not None]
        others = [m for m in msgs if not isinstance(m, Msg)]
        if others:
            raise TypeError(
                "memories must be AgentScope Msg objects (or a list of them), "
                f"got {type(others[0]).__name__}"
            )
        if not msgs:
            return
        if marks:
            self._marked += [(msg, _marks(marks)) for msg in msgs]
            return
        session = Session(id=self.session_id, user_id=self.user_id)
        await self.service.append_message(session, agentscope_msg_to_message(msgs))

    async def get_memory(
        self,
        mark: str | None = None,
        exclude_mark: str | None = None,
        prepend_summary: bool = True,
        **kwargs: Any,
    ) -> list[Any]:
        """The session's history as ``Msg``\\ s, oldest first, then the messages kept here;
        those with ``mark`` alone, or all but those with ``exclude_mark``."""
        session = await self._session()
        stored_marks: dict[str, list[str]] = {}
        if mark is not None or exclude_mark is not None:
            stored_marks = await self.service.message_marks(self.user_id, self.session_id)
        msgs = [
            message_to_agentscope_msg(m)
            for m in session.messages
            if (mark is None or mark in stored_marks.get(_message_id(m), []))
            and exclude_mark not in stored_marks.get(_message_id(m), [])
        ]
        msgs += [
            msg
            for msg, marks in self._marked
            if (mark is None or mark in marks) and exclude_mark not in marks
        ]
        summary = ""
        if prepend_summary:
            summary = await self.service.session_summary(self.user_id, self.session_id)
        if summary:
            msgs.insert(0, message_to_agentscope_msg({"role": "user", "content": summary}))
        return msgs

    async def update_compressed_summary(self, summary: str) -> None:
        """Keep ``summary`` (of the messages compressed) with the session, in place of the
        one before."""
        await self.service.set_session_summary(self.user_id, self.session_id, summary)

    async def delete_by_mark(self, mark: str | list[str], *args: Any, **kwargs: Any) -> int:
        """Delete the messages with ``mark`` (or any of the marks), kept here or stored;
        how many."""
        dropped = set(_marks(mark))
        kept = [(msg, marks) for msg, marks in self._marked if not dropped.intersection(marks)]
        count = len(self._marked) - len(kept)
        self._marked = kept
        stored_marks = await self.service.message_marks(self.user_id, self.session_id)
        ids = [i for i, marks in stored_marks.items() if dropped.intersection(marks)]
        if ids:
            count += await self.service.delete_messages(self.user_id, self.session_id, ids)
        return count

    async def delete(self, msg_ids: list[str] | str, **kwargs: Any) -> int:
        """Delete the messages with these ids (or this one), kept here or stored; how many."""
        ids = [msg_ids] if isinstance(msg_ids, str) else list(msg_ids)
        kept = [(msg, marks) for msg, marks in self._marked if msg.id not in ids]
        count = len(self._marked) - len(kept)
        self._marked = kept
        stored = await self._stored_ids(ids)
        return count + await self.service.delete_messages(self.user_id, self.session_id, stored)

    async def update_messages_mark(
        self,
        new_mark: str | None,
        old_mark: str | None = None,
        msg_ids: list[str] | None = None,
    ) -> int:
        """Mark messages, kept here or stored, as AgentScope's memories do; how many were
        updated.

        The messages are those with ``msg_ids`` (every one when None) holding ``old_mark``
        (when given), which they lose; each gets ``new_mark`` (when given).
        """
        if new_mark is None and old_mark is None:
            return 0
        count = 0
        for index, (msg, marks) in enumerate(self._marked):
            if msg_ids is not None and msg.id not in msg_ids:
                continue
            updated = remark(marks, new_mark, old_mark)
            if updated is not None:
                self._marked[index] = (msg, updated)
                count += 1
        stored = None if msg_ids is None else await self._stored_ids(msg_ids)
        return count + await self.service.update_message_marks(
            self.user_id, self.session_id, new_mark, old_mark, stored
        )

    async def _stored_ids(self, msg_ids: list[str]) -> list[str]:
        """The ids in the history of the messages with ``msg_ids`` (a ``Msg``'s id, kept
        with the message it is stored as, or the stored message's own)."""
        wanted = set(msg_ids)
        session = await self._session()
        return [
            _message_id(m)
            for m in session.messages
            if _message_id(m) in wanted or _agentscope_id(m) in wanted
        ]

    async def size(self) -> int:
        """How many messages the session holds, and the marked ones."""
        return len((await self._session()).messages) + len(self._marked)

    async def clear(self) -> None:
        """Empty the session (its id stays), and drop the marked messages."""
        self._marked = []
        await self.service.delete_session(self.user_id, self.session_id)
        await self.service.create_session(self.user_id, self.session_id)

    async def retrieve(self, *args: Any, **kwargs: Any) -> None:
        """Not supported: search long-term memory with a memory service instead."""
        raise NotImplementedError("use a memory service's search_memory() to retrieve")

    def state_dict(self) -> dict[str, Any]:
        """Empty: the history lives in the service."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Nothing to load: the history lives in the service."""


def _message_id(message: Message | dict[str, Any]) -> Any:
    return message.id if isinstance(message, Message) else message.get("id")


def _agentscope_id(message: Message | dict[str, Any]) -> Any:
    metadata = message.metadata if isinstance(message, Message) else message.get("metadata")
    origin = (metadata or {}).get("agentscope")
    return origin.get("id") if isinstance(origin, dict) else None


def _marks(marks: str | list[str]) -> list[str]:
    return [marks] if isinstance(marks, str) else list(marks)


__all__ = ["AgentScopeSessionHistoryMemory"]
