"""The long-term memory interface, and the behaviour every backend shares.

Memory is organised by user, then by session (``"default"`` when none is given). Search is
keyword search over tokens, ranked by BM25 with ties to the most recent memory.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentscope_serverless.errors import InvalidInputError
from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.services._once import next_write_id
from agentscope_serverless.services._ported import (
    MEMORY_HOOKS,
    MEMORY_METHODS,
    adapt_ported_subclass,
    agentscope_base_method,
)
from agentscope_serverless.services._turn import note_memory_write
from agentscope_serverless.services._validation import (
    clean_session_id,
    require_positive_int,
    require_user_id,
    session_id_or_default,
    to_encoded_messages,
    to_query_messages,
)
from agentscope_serverless.services.base import (
    ServiceWithLifecycleManager,
    StartedGuard,
    service_call,
)
from agentscope_serverless.services.memory.text import message_text, query_terms

DEFAULT_PAGE_SIZE = 10
MAX_PAGE_SIZE = 1000
# The most results a search gives, with or without a top_k: else every match of a word
# most memories hold would be read, scored and sent in one answer (on Redis, by one script
# holding the server for every user).
MAX_TOP_K = 1000


@dataclass(frozen=True, slots=True)
class NewMemory:
    """A validated message to remember: its JSON (stored, and returned by search and
    listing) and its text (what search indexes)."""

    raw: str
    text: str


def _filters(filters: Any) -> Mapping[str, Any]:
    if filters is None:
        return {}
    if not isinstance(filters, Mapping):
        raise InvalidInputError("filters must be a dict", field="filters")
    return filters


class MemoryService(StartedGuard, ServiceWithLifecycleManager):
    """Long-term memory of users: messages to remember, found again by keyword search.

    >>> async def demo(memory: MemoryService) -> None:
    ...     await memory.add_memory("u1", [{"role": "user", "content": "I love green tea"}])
    ...     hits = await memory.search_memory("u1", [{"role": "user", "content": "tea?"}])
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A backend written for AgentScope Runtime overrides the public methods instead.
        adapt_ported_subclass(cls, MemoryService, MEMORY_METHODS, MEMORY_HOOKS)

    @agentscope_base_method
    @service_call
    async def add_memory(self, user_id: str, messages: Any, session_id: str | None = None) -> None:
        """Remember ``messages`` (a message or a list; models or dicts) for the user."""
        user_id = require_user_id(user_id)
        # What is stored and indexed is read from the messages now, before any await.
        memories = [
            NewMemory(raw, message_text(message)) for message, raw in to_encoded_messages(messages)
        ]
        if memories:
            note_memory_write(user_id)
            # Under an Idempotency-Key the add is keyed: its run again (after a store
            # froze mid-write) stores nothing twice.
            write_id = next_write_id()
            await self._add(user_id, session_id_or_default(session_id), memories, write_id)

    @agentscope_base_method
    @service_call
    async def search_memory(
        self, user_id: str, messages: Any, filters: dict[str, Any] | None = None
    ) -> list[Message]:
        """Memories matching the text of the last message, best first.

        ``filters={"top_k": k}`` keeps the ``k`` best (1 to :data:`MAX_TOP_K`); without it,
        the :data:`MAX_TOP_K` best. An unknown user or a query without words gives ``[]``.
        """
        user_id = require_user_id(user_id)
        top_k = _filters(filters).get("top_k")
        if top_k is not None:
            top_k = require_positive_int(top_k, field="top_k", maximum=MAX_TOP_K)
        items = to_query_messages(messages)
        terms = query_terms(items[-1] if items else None)
        if not terms:
            return []
        return await self._search(user_id, terms, top_k or MAX_TOP_K)

    @agentscope_base_method
    @service_call
    async def list_memory(
        self, user_id: str, filters: dict[str, Any] | None = None
    ) -> list[Message]:
        """One page of the user's memories, oldest first.

        ``filters={"page_num": 1, "page_size": 10}`` (the defaults) selects the page.
        """
        user_id = require_user_id(user_id)
        options = _filters(filters)
        page_num = require_positive_int(options.get("page_num", 1), field="page_num")
        page_size = require_positive_int(
            options.get("page_size", DEFAULT_PAGE_SIZE), field="page_size", maximum=MAX_PAGE_SIZE
        )
        return await self._list(user_id, (page_num - 1) * page_size, page_size)

    @agentscope_base_method
    @service_call
    async def delete_memory(self, user_id: str, session_id: str | None = None) -> None:
        """Forget one session's memories, or all of the user's when ``session_id`` is None.

        A blank ``session_id`` is an error, not "everything": forgetting all of a user's
        memory has to be asked for explicitly.
        """
        user_id = require_user_id(user_id)
        if session_id is None:
            await self._delete(user_id, None)
            return
        sid = clean_session_id(session_id)
        if sid is None:
            raise InvalidInputError(
                "session_id must not be blank (pass None to delete all memory)",
                field="session_id",
            )
        await self._delete(user_id, sid)

    async def delete_user_memory(self, user_id: str) -> None:
        """Forget every memory of ``user_id``, at once (``delete_memory(user_id)``)."""
        await self.delete_memory(user_id, None)

    @service_call
    async def clear_all_memory(self) -> None:
        """Forget every user's memories (an operator's action: it spans all users)."""
        await self._clear_all()

    async def get_query_text(self, message: Message) -> str:
        """The text a search uses from ``message``: its text content (``""`` if none)."""
        if isinstance(message, Message) and message.type == "message":
            return message.get_text_content() or ""
        return ""

    @abstractmethod
    async def _clear_all(self) -> None:
        """Remove every user's memories."""

    @abstractmethod
    async def _add(
        self, user_id: str, session_id: str, memories: list[NewMemory], write_id: str | None
    ) -> None:
        """Store and index ``memories`` after the user's other memories.

        A ``write_id`` the user's memory applied (within
        :data:`~agentscope_serverless.services._once.WRITE_ID_SECONDS`) stores nothing; a
        new one is recorded atomically with what it stores (a backend writing in steps
        keys each step, ``f"{write_id}:{step}"``, so a run again does only the steps left).
        """

    @abstractmethod
    async def _search(self, user_id: str, terms: list[str], top_k: int) -> list[Message]:
        """The ``top_k`` best memories for ``terms`` by BM25, ties to the most recent.

        Must read what matches (an index), not the user's whole memory.
        """

    @abstractmethod
    async def _list(self, user_id: str, offset: int, limit: int) -> list[Message]:
        """``limit`` memories starting at ``offset``, in the order they were added."""

    @abstractmethod
    async def _delete(self, user_id: str, session_id: str | None) -> None:
        """Remove one session's memories (or all the user's) from storage and index."""


__all__ = ["MemoryService", "NewMemory"]
