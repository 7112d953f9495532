"""Long-term memory in the process's memory, with an inverted index for search."""

from __future__ import annotations

import bisect
import heapq
import itertools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

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

# A term's only posting, (-term frequency, length, memory seq): most terms of most users
# have a single memory, and tuples of numbers are never walked by the garbage collector.
Posting = tuple[int, int, int]
# A term's postings once it has more than one, by group: the memories of equal term
# frequency and length, as their seqs in the order added (8 bytes each, in the machine's
# byte order: a memoryview reads them so), so a new memory is appended to its group
# whatever the term's size. A group's key packs (-tf, length) into an int that sorts like
# the pair: the order in which the BM25 contribution decreases. Neither the bytearrays nor
# (then) the dict holding them are walked by the garbage collector.
Groups = dict[int, bytearray]
Postings = Posting | Groups

_SEQ_BYTES = 8
_SEQ_FORMAT: Final = "Q"  # a native unsigned 8-byte integer, as a memoryview reads it
_MAX_TF = 1 << 31
_LENGTHS = 1 << 32  # more tokens than any message a request can carry


def _group(tf: int, length: int) -> int:
    return (_MAX_TF - tf) * _LENGTHS + length


def _seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(_SEQ_BYTES, sys.byteorder)


def _document_frequency(postings: Postings) -> int:
    if isinstance(postings, tuple):
        return 1
    return sum(map(len, postings.values())) // _SEQ_BYTES


def _best_tf(postings: Postings) -> int:
    if isinstance(postings, tuple):
        return -postings[0]
    return _MAX_TF - min(postings) // _LENGTHS


def _best_first(postings: Postings) -> Iterator[tuple[int, int, int]]:
    """(tf, length, seq) of each posting, in the order the contribution decreases, newest
    first among equals."""
    if isinstance(postings, tuple):
        yield -postings[0], postings[1], postings[2]
        return
    for group in sorted(postings):
        negative_tf, length = divmod(group, _LENGTHS)
        tf, seqs = _MAX_TF - negative_tf, postings[group]
        for end in range(len(seqs), 0, -_SEQ_BYTES):
            yield tf, length, int.from_bytes(seqs[end - _SEQ_BYTES : end], sys.byteorder)


def _add_posting(postings: Postings, tf: int, length: int, seq: int) -> Groups:
    if isinstance(postings, tuple):
        negative_tf, first_length, first_seq = postings
        postings = {_group(-negative_tf, first_length): bytearray(_seq_bytes(first_seq))}
    group = _group(tf, length)
    seqs = postings.get(group)
    if seqs is None:
        postings[group] = bytearray(_seq_bytes(seq))
    else:
        seqs += _seq_bytes(seq)
    return postings


def _without(seqs: bytearray, removed: list[int]) -> bytearray:
    """A group's ``seqs`` but the ``removed`` ones (ascending, all of them in it): found by
    bisection (seqs grow as memories are added: a group is sorted), the runs between them
    copied whole."""
    kept = bytearray()
    with memoryview(seqs) as view, view.cast(_SEQ_FORMAT) as ids:
        start = 0
        for seq in removed:
            at = bisect.bisect_left(ids, seq, start)
            kept += ids[start:at]
            start = at + 1
        kept += ids[start:]
    return kept


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
                else:
                    user.postings[term] = _add_posting(postings, tf, length, seq)

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
        # The largest contribution of each term (term_frequencies keeps tf <= length; it
        # grows with tf and shrinks with length), read largest first; rest[p] bounds what
        # later terms can still add.
        best_tfs = {t: _best_tf(user.postings[t]) for t in idfs}
        bounds = {t: contribution(i, best_tfs[t], best_tfs[t]) for t, i in idfs.items()}
        order = sorted(idfs, key=bounds.__getitem__, reverse=True)
        rest = [0.0] * len(order)
        for p in range(len(order) - 2, -1, -1):
            rest[p] = rest[p + 1] + bounds[order[p + 1]]
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
        # The seqs to remove by term and group (ascending: memories are kept in the order
        # added), so that each group touched is rewritten once: a session of thousands of
        # memories sharing a word costs a pass over their postings, not one per memory.
        removed: dict[tuple[str, int], list[int]] = {}
        for seq in [s for s, m in user.memories.items() if m.session_id == session_id]:
            memory = user.memories.pop(seq)
            user.total_length -= memory.length
            for term, tf in memory.terms:
                key = (term, _group(tf, memory.length))
                seqs = removed.get(key)
                if seqs is None:
                    removed[key] = [seq]
                else:
                    seqs.append(seq)
        if not user.memories:
            del self._users[user_id]
            return
        for (term, group), seqs in removed.items():
            postings = user.postings[term]
            if isinstance(postings, tuple):  # the memory removed was its only one
                del user.postings[term]
                continue
            kept = _without(postings[group], seqs)
            if kept:
                postings[group] = kept
            else:
                del postings[group]
                if not postings:
                    del user.postings[term]


__all__ = ["InMemoryMemoryService"]
