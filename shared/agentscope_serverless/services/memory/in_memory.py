"""Long-term memory in the process's memory, with an inverted index for search."""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Iterator
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

# A group of postings: (-term frequency, length). Groups sort in the order in which a
# memory's BM25 contribution for the term decreases.
Group = tuple[int, int]
# A term's only posting, (-term frequency, length, memory seq): most terms of most users
# have a single memory, and tuples of numbers are never walked by the garbage collector.
Posting = tuple[int, int, int]


@dataclass(slots=True)
class _Postings:
    """A term's postings, once it has more than one: the memory seqs of each group, in the
    order they were added (a new memory is appended to its group, whatever the term's size).
    Read best group first, newest first within a group."""

    groups: dict[Group, list[int]]
    order: list[Group]  # the groups, sorted
    count: int

    @classmethod
    def of(cls, posting: Posting) -> _Postings:
        negative_tf, length, seq = posting
        return cls({(negative_tf, length): [seq]}, [(negative_tf, length)], 1)

    def add(self, group: Group, seq: int) -> None:
        seqs = self.groups.get(group)
        if seqs is None:
            self.groups[group] = [seq]
            bisect.insort(self.order, group)
        else:
            seqs.append(seq)
        self.count += 1

    def remove(self, group: Group, seq: int) -> None:
        seqs = self.groups[group]
        del seqs[bisect.bisect_left(seqs, seq)]
        if not seqs:
            del self.groups[group]
            del self.order[bisect.bisect_left(self.order, group)]
        self.count -= 1


Postings = Posting | _Postings


def _document_frequency(postings: Postings) -> int:
    return postings.count if isinstance(postings, _Postings) else 1


def _best_tf(postings: Postings) -> int:
    group = postings.order[0] if isinstance(postings, _Postings) else postings
    return -group[0]


def _best_first(postings: Postings) -> Iterator[tuple[int, int, int]]:
    """(tf, length, seq) of each posting, in the order the contribution decreases, newest
    first among equals."""
    if not isinstance(postings, _Postings):
        yield -postings[0], postings[1], postings[2]
        return
    for group in postings.order:
        tf, length = -group[0], group[1]
        for seq in reversed(postings.groups[group]):
            yield tf, length, seq


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
                postings = user.postings.get(term)
                if postings is None:
                    user.postings[term] = (-tf, length, seq)
                    continue
                if not isinstance(postings, _Postings):
                    postings = user.postings[term] = _Postings.of(postings)
                postings.add((-tf, length), seq)

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

        idfs = {
            t: idf(stats.documents, _document_frequency(user.postings[t]))
            for t in terms
            if t in user.postings
        }
        # The largest contribution of each term (tf <= length; it grows with tf and shrinks
        # with length), read largest first; rest[p] bounds what later terms can still add.
        best_tfs = {t: _best_tf(user.postings[t]) for t in idfs}
        bounds = {t: contribution(i, best_tfs[t], best_tfs[t]) for t, i in idfs.items()}
        order = sorted(idfs, key=bounds.__getitem__, reverse=True)
        rest = [sum(bounds[t] for t in order[p + 1 :]) for p in range(len(order))]
        best: list[tuple[float, int]] = []  # min-heap of (score, seq): best[0] is to beat
        seen: set[int] = set()
        for p, term in enumerate(order):
            if len(best) == top_k and bounds[term] + rest[p] + _EPSILON < best[0][0]:
                break
            term_idf = idfs[term]
            for tf, length, seq in _best_first(user.postings[term]):
                if len(best) == top_k:
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
                if not isinstance(postings, _Postings):
                    del user.postings[term]
                    continue
                postings.remove((-tf, memory.length), seq)
                if not postings.count:
                    del user.postings[term]
        if not user.memories:
            del self._users[user_id]


__all__ = ["InMemoryMemoryService"]
