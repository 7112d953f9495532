"""In-memory memory search stops reading early, yet ranks exactly like scoring every match."""

from __future__ import annotations

import random
import re
from collections import Counter
from typing import Any

import pytest

from agentscope_serverless.schemas.agent_schemas import Message, TextContent
from agentscope_serverless.services.memory import InMemoryMemoryService, in_memory
from agentscope_serverless.services.memory.text import (
    MAX_QUERY_TERMS,
    CorpusStats,
    bm25_score,
    idf,
    message_text,
    query_terms,
    term_frequencies,
    tokenize,
)

WORDS = [f"w{i}" for i in range(30)]
WEIGHTS = [1 / (rank + 1) for rank in range(len(WORDS))]


def msg(text: str) -> Message:
    return Message(role="user", content=[TextContent(text=text)])


def exhaustive(memories: list[Message], query: Message, top_k: int) -> list[str]:
    """The top ``top_k`` ids by BM25 over every memory (ties: the most recent)."""
    counted = [term_frequencies(message_text(m)) for m in memories]
    stats = CorpusStats(len(memories), sum(length for _, length in counted))
    terms = query_terms(query)
    frequencies = {t: sum(1 for counts, _ in counted if t in counts) for t in terms}
    idfs = {t: idf(stats.documents, df) for t, df in frequencies.items() if df}
    scored = [
        (bm25_score(counts, length, idfs, stats), position)
        for position, (counts, length) in enumerate(counted)
        if any(t in counts for t in idfs)
    ]
    return [memories[position].id for _, position in sorted(scored, reverse=True)[:top_k]]


async def test_search_ranks_like_scoring_every_matching_memory(user_id: str) -> None:
    rng = random.Random("in-memory-cutoff")
    memories: list[Message] = []
    for _ in range(800):
        if memories and rng.random() < 0.2:  # exact duplicates: ties to break by recency
            memories.append(msg(memories[rng.randrange(len(memories))].get_text_content() or ""))
        else:
            memories.append(msg(" ".join(rng.choices(WORDS, WEIGHTS, k=rng.randint(1, 10)))))
    async with InMemoryMemoryService() as service:
        for start in range(0, len(memories), 100):
            await service.add_memory(user_id, memories[start : start + 100])
        for _ in range(200):
            query = msg(" ".join(rng.choices(WORDS, WEIGHTS, k=rng.randint(1, 4))))
            top_k = rng.choice([1, 2, 3, 5, 10, 50])
            got = [m.id for m in await service.search_memory(user_id, [query], {"top_k": top_k})]
            assert got == exhaustive(memories, query, top_k), (query.get_text_content(), top_k)


async def test_search_ranks_like_scoring_every_matching_memory_after_deletions(
    user_id: str,
) -> None:
    # Sessions deleted from the middle empty some groups of postings and thin others.
    rng = random.Random("in-memory-deletions")
    added: list[tuple[str, Message]] = []
    async with InMemoryMemoryService() as service:
        for _ in range(600):
            session = f"s{rng.randrange(6)}"
            text = " ".join(rng.choices(WORDS[:8], WEIGHTS[:8], k=rng.randint(1, 4)))
            memory = msg(text if rng.random() > 0.3 else "w0")  # many exact ties
            added.append((session, memory))
            await service.add_memory(user_id, [memory], session_id=session)
        for session in ("s1", "s4", "s5"):
            await service.delete_memory(user_id, session)
        remaining = [m for session, m in added if session not in ("s1", "s4", "s5")]
        stored = await service.list_memory(user_id, {"page_size": 1000})
        assert [m.id for m in stored] == [m.id for m in remaining]
        for _ in range(150):
            query = msg(" ".join(rng.choices(WORDS[:8], WEIGHTS[:8], k=rng.randint(1, 3))))
            top_k = rng.choice([1, 3, 10, 50])
            got = [m.id for m in await service.search_memory(user_id, [query], {"top_k": top_k})]
            assert got == exhaustive(remaining, query, top_k), (query.get_text_content(), top_k)


async def test_a_search_among_identical_memories_scores_only_the_newest(
    user_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scored: list[int] = []

    def counting_score(*args: Any) -> float:
        scored.append(1)
        return bm25_score(*args)

    monkeypatch.setattr(in_memory, "bm25_score", counting_score)
    memories = [msg("hello") for _ in range(300)]
    async with InMemoryMemoryService() as service:
        await service.add_memory(user_id, memories)
        found = await service.search_memory(user_id, [msg("hello")], {"top_k": 3})
    assert [m.id for m in found] == [m.id for m in memories[-1:-4:-1]]
    assert len(scored) == 3


def test_ascii_text_is_tokenized_like_any_other_text() -> None:
    # ASCII text takes a faster path than the word pattern; it must give the same tokens.
    word = re.compile(r"\w+", re.UNICODE)
    rng = random.Random("ascii")
    alphabet = [chr(c) for c in range(128)]
    for _ in range(20000):
        text = "".join(rng.choices(alphabet, k=rng.randint(0, 24)))
        assert tokenize(text) == word.findall(text.casefold()), repr(text)
    assert tokenize("Don't STOP_me-now, 42x!") == ["don", "t", "stop_me", "now", "42x"]


def test_a_memory_is_never_shorter_than_a_token_occurs_in_it() -> None:
    # Search stops early on that bound. Format characters split a word for the first
    # tokenizer ("x\u00adx" holds "x" twice) and join it for the forms added.
    rng = random.Random("lengths")
    alphabet = [*"xé 小明ㄅก\u0e34\u064e🍕.", "\u00ad", "\u200b", "\u200c", "\u200d", "\ufeff"]
    for _ in range(20000):
        text = "".join(rng.choices(alphabet, k=rng.randint(1, 12)))
        counts, length = term_frequencies(text)
        assert max(counts.values(), default=0) <= length, (text, counts, length)
    assert term_frequencies("x\u00adx") == (Counter({"x": 2, "xx": 1}), 2)


# What the tokenizer made of these texts before it added forms for matching (Redis keeps
# the tokens of memories added then).
FIRST_TOKENS = {
    "my pass\u00adword is hunter2": ["my", "pass", "word", "is", "hunter2"],
    "I love café au lait": ["i", "love", "café", "au", "lait"],
    "Tôi tên là Nguyễn": ["tôi", "tên", "là", "nguyễn"],
    "اسمي مُحَمَّد": ["اسمي", "مُحَمَّد"],
    "مـحـمـد": ["مـحـمـد"],
    "שָׁלוֹם עולם": ["שָׁלוֹם", "עולם"],
    "𠮷𠮷 restaurant": ["𠮷𠮷", "restaurant"],
    "ㄅㄆㄇ 注音": ["ㄅㄆㄇ", "注", "音"],
    "🍕 I❤️NY 👨\u200d👩\u200d👧 1️⃣": ["i", "\ufe0fny", "1\ufe0f\u20e3"],
    "मुझे किताब पसंद है": ["मुझे", "किताब", "पसंद", "है"],
    "ฉันชื่ออลิซ": ["ฉั", "น", "ชื่", "อ", "อ", "ลิ", "ซ"],
    "ｶﾌｪ": ["カ", "フ", "ェ"],
    "İstanbul Straße": ["istanbul", "strasse"],
    "我叫小明\uff0c住在北京": ["我", "叫", "小", "明", "住", "在", "北", "京"],
    "a\u0301\u200b\u0301b x\u00ad\u00ady \ufeffz": ["á", "\u0301b", "x", "y", "z"],
}


@pytest.mark.parametrize("text", list(FIRST_TOKENS))
def test_every_token_made_before_is_still_made_as_often(text: str) -> None:
    tokens = tokenize(text)
    missing = Counter(FIRST_TOKENS[text]) - Counter(tokens)
    assert not missing, f"{text!r} lost {dict(missing)}"
    assert tokens[: len(FIRST_TOKENS[text])] == FIRST_TOKENS[text]


def test_a_long_cjk_query_keeps_its_characters_before_their_pairs() -> None:
    # Pairs of adjacent characters are added to a query's terms: the 128 it uses are still
    # its first 128 distinct characters.
    characters = [chr(0x4E00 + i) for i in range(200)]
    assert query_terms(msg("".join(characters))) == characters[:MAX_QUERY_TERMS]
    assert query_terms(msg("小明")) == ["小", "明", "小明"]
