"""Long-term memory in the process's memory, with an inverted index for search."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.services.memory.base import MemoryService
from agentscope_serverless.services.memory.text import (
    CorpusStats,
    bm25_score,
    idf,
    term_frequencies,
)


@dataclass
class _Memory:
    seq: int
    session_id: str
    message: Message
    terms: Counter[str]
    length: int


@dataclass
class _UserMemory:
    memories: dict[int, _Memory]
    postings: dict[str, set[int]]
    total_length: int = 0


class InMemoryMemoryService(MemoryService):
    """Memories kept in a dict per user, indexed by token for search.

    A search reads only the memories that contain a query token. Stored messages are
    private copies; ``stop()`` keeps the data.

    >>> memory = InMemoryMemoryService()
    """

    def __init__(self) -> None:
        self._users: dict[str, _UserMemory] = {}
        self._seq = itertools.count(1)

    async def _add(self, user_id: str, session_id: str, messages: list[Message]) -> None:
        user = self._users.setdefault(user_id, _UserMemory(memories={}, postings={}))
        for message in messages:
            terms, length = term_frequencies(message)
            memory = _Memory(
                next(self._seq), session_id, message.model_copy(deep=True), terms, length
            )
            user.memories[memory.seq] = memory
            user.total_length += length
            for term in terms:
                user.postings.setdefault(term, set()).add(memory.seq)

    async def _search(self, user_id: str, terms: list[str], top_k: int) -> list[Message]:
        user = self._users.get(user_id)
        if user is None:
            return []
        stats = CorpusStats(len(user.memories), user.total_length)
        idfs = {t: idf(stats.documents, len(user.postings[t])) for t in terms if t in user.postings}
        candidates = set().union(*(user.postings[t] for t in idfs)) if idfs else set()
        ranked = sorted(
            (
                (bm25_score(m.terms, m.length, idfs, stats), m.seq)
                for m in (user.memories[seq] for seq in candidates)
            ),
            reverse=True,
        )
        return [user.memories[seq].message.model_copy(deep=True) for _, seq in ranked[:top_k]]

    async def _list(self, user_id: str, offset: int, limit: int) -> list[Message]:
        user = self._users.get(user_id)
        if user is None:
            return []
        ordered = sorted(user.memories)[offset : offset + limit]
        return [user.memories[seq].message.model_copy(deep=True) for seq in ordered]

    async def _clear_all(self) -> None:
        self._users.clear()

    async def _delete(self, user_id: str, session_id: str | None) -> None:
        user = self._users.get(user_id)
        if user is None:
            return
        if session_id is None:
            del self._users[user_id]
            return
        for seq in [s for s, m in user.memories.items() if m.session_id == session_id]:
            memory = user.memories.pop(seq)
            user.total_length -= memory.length
            for term in memory.terms:
                postings = user.postings[term]
                postings.discard(seq)
                if not postings:
                    del user.postings[term]
        if not user.memories:
            del self._users[user_id]


__all__ = ["InMemoryMemoryService"]
