"""Long-term memory in the process's memory, with an inverted index for search."""

from __future__ import annotations

import bisect
import heapq
import itertools
from dataclasses import dataclass

from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.services._stored import decode_messages
from agentscope_serverless.services.memory.base import MemoryService, NewMemory
from agentscope_serverless.services.memory.text import (
    BM25_B,
    BM25_K1,
    CorpusStats,
    bm25_score,
    idf,
    term_frequencies,
)

# Scores closer than this count as equal when deciding to stop reading (float rounding).
_EPSILON = 1e-9

# A posting: (-term frequency, length, -memory seq), so a term's postings sort in the order
# in which a memory's BM25 contribution for that term decreases, newest first among equals.
Posting = tuple[int, int, int]
# A term's postings, sorted: a tuple while there is one (tuples of numbers are never walked by
# the garbage collector, and most terms of most users have a single memory), then a list.
Postings = tuple[Posting] | list[Posting]


@dataclass(slots=True)
class _Memory:
    session_id: str
    # The message's JSON: what search returns, without a second copy of the model.
    raw: str
    # (term, frequency) pairs: a tuple of strings and numbers, like ``raw`` left alone by
    # the garbage collector.
    terms: tuple[tuple[str, int], ...]
    length: int


@dataclass(slots=True)
class _UserMemory:
    memories: dict[int, _Memory]
    postings: dict[str, Postings]
    total_length: int = 0
    # The write ids of the adds made under an Idempotency-Key.
    applied: set[str] | None = None


class InMemoryMemoryService(MemoryService):
    """Memories kept in a dict per user, indexed by token for search.

    A search reads only the memories that contain a query token, best first, and stops as
    soon as no unread one can enter the top ``k``. Memories are kept as JSON (changing a
    returned message changes nothing stored); ``stop()`` keeps the data.

    >>> memory = InMemoryMemoryService()
    """

    def __init__(self) -> None:
        self._users: dict[str, _UserMemory] = {}
        self._seq = itertools.count(1)

    async def _add(
        self, user_id: str, session_id: str, memories: list[NewMemory], write_id: str | None
    ) -> None:
        user = self._users.setdefault(user_id, _UserMemory(memories={}, postings={}))
        if write_id is not None:
            if user.applied is None:
                user.applied = set()
            elif write_id in user.applied:
                return
            user.applied.add(write_id)
        for memory in memories:
            counts, length = term_frequencies(memory.text)
            seq = next(self._seq)
            terms = tuple(counts.items())
            user.memories[seq] = _Memory(session_id, memory.raw, terms, length)
            user.total_length += length
            for term, tf in terms:
                posting = (-tf, length, -seq)
                postings = user.postings.get(term)
                if postings is None:
                    user.postings[term] = (posting,)
                    continue
                if isinstance(postings, tuple):
                    postings = user.postings[term] = list(postings)
                bisect.insort(postings, posting)

    async def _search(self, user_id: str, terms: list[str], top_k: int) -> list[Message]:
        user = self._users.get(user_id)
        if user is None:
            return []
        stats = CorpusStats(len(user.memories), user.total_length)
        avg = stats.average_length or 1.0

        def contribution(term_idf: float, tf: int, length: int) -> float:
            return (
                term_idf
                * tf
                * (BM25_K1 + 1)
                / (tf + BM25_K1 * (1 - BM25_B + BM25_B * length / avg))
            )

        idfs = {t: idf(stats.documents, len(user.postings[t])) for t in terms if t in user.postings}
        # The largest contribution of each term (tf <= length; it grows with tf and shrinks
        # with length), read largest first; rest[p] bounds what later terms can still add.
        bounds = {
            t: contribution(i, -user.postings[t][0][0], -user.postings[t][0][0])
            for t, i in idfs.items()
        }
        order = sorted(idfs, key=bounds.__getitem__, reverse=True)
        rest = [sum(bounds[t] for t in order[p + 1 :]) for p in range(len(order))]
        best: list[tuple[float, int]] = []  # min-heap of (score, seq): best[0] is to beat
        seen: set[int] = set()
        for p, term in enumerate(order):
            if len(best) == top_k and bounds[term] + rest[p] + _EPSILON < best[0][0]:
                break
            term_idf = idfs[term]
            for negative_tf, length, negative_seq in user.postings[term]:
                seq = -negative_seq
                if len(best) == top_k:
                    tf = -negative_tf
                    # Every later posting has a lower tf, or the same tf and a longer text,
                    # or the same tf and length and an older memory.
                    bound = contribution(term_idf, tf, length)
                    if tf > 1:
                        bound = max(bound, contribution(term_idf, tf - 1, tf - 1))
                    theta, oldest = best[0]
                    if bound + rest[p] + _EPSILON < theta:
                        break
                    # With no term left after this one, a memory first met here scores its
                    # contribution for this term exactly: ties go to the newest.
                    if rest[p] == 0 and (bound < theta or (bound == theta and seq < oldest)):
                        break
                if seq in seen:
                    continue
                seen.add(seq)
                memory = user.memories[seq]
                entry = (bm25_score(dict(memory.terms), memory.length, idfs, stats), seq)
                if len(best) < top_k:
                    heapq.heappush(best, entry)
                elif entry > best[0]:
                    heapq.heapreplace(best, entry)
        ranked = sorted(best, reverse=True)
        return decode_messages([user.memories[seq].raw for _, seq in ranked])

    async def _list(self, user_id: str, offset: int, limit: int) -> list[Message]:
        user = self._users.get(user_id)
        if user is None:
            return []
        ordered = sorted(user.memories)[offset : offset + limit]
        return decode_messages([user.memories[seq].raw for seq in ordered])

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
            for term, tf in memory.terms:
                postings = user.postings[term]
                if isinstance(postings, tuple):
                    del user.postings[term]
                    continue
                del postings[bisect.bisect_left(postings, (-tf, memory.length, -seq))]
                if not postings:
                    del user.postings[term]
        if not user.memories:
            del self._users[user_id]


__all__ = ["InMemoryMemoryService"]
