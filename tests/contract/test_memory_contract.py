"""CONTRACT §1 and §3: long-term memory, on every backend."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from agentscope_serverless.errors import InvalidInputError, ServiceNotStartedError
from agentscope_serverless.schemas.agent_schemas import Message, TextContent
from agentscope_serverless.services._once import seed_writes
from agentscope_serverless.services.memory import MemoryService
from agentscope_serverless.services.memory.base import MAX_TOP_K
from agentscope_serverless.services.memory.text import MAX_INDEXED_CHARS


def msg(text: str, role: str = "user") -> Message:
    return Message(role=role, content=[TextContent(text=text)])  # type: ignore[arg-type]


def query(text: str) -> list[Message]:
    return [msg(text)]


def texts(messages: list[Message]) -> list[str | None]:
    return [m.get_text_content() for m in messages]


# --- add_memory -----------------------------------------------------------------------


async def test_add_memory_accepts_messages_and_dicts(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(user_id, [msg("hello world")])
    await memory.add_memory(user_id, {"role": "user", "content": [{"type": "text", "text": "bye"}]})
    await memory.add_memory(user_id, msg("single message"))
    listed = await memory.list_memory(user_id)
    assert texts(listed) == ["hello world", "bye", "single message"]
    assert all(isinstance(m, Message) for m in listed)


async def test_add_memory_rejects_an_invalid_message_and_stores_nothing(
    memory: MemoryService, user_id: str
) -> None:
    with pytest.raises(InvalidInputError):
        await memory.add_memory(user_id, [msg("fine"), {"role": "robot", "content": "x"}])
    assert await memory.list_memory(user_id) == []


async def test_add_memory_refuses_a_message_id_holding_a_control_character_and_stores_nothing(
    memory: MemoryService, user_id: str
) -> None:
    for bad in ("a\x00b", " "):
        with pytest.raises(InvalidInputError, match=r"^message\[1\]\.id must not") as raised:
            await memory.add_memory(user_id, [msg("fine"), {**msg("x").model_dump(), "id": bad}])
        assert raised.value.errors[0]["loc"] == ["message[1].id"]
    assert await memory.list_memory(user_id) == []


async def test_add_memory_refuses_a_message_nesting_too_deeply_and_stores_nothing(
    memory: MemoryService, user_id: str
) -> None:
    value: object = 1
    for _ in range(200):
        value = [value]
    deep = {"role": "user", "content": [{"type": "data", "data": {"v": value}}]}
    with pytest.raises(InvalidInputError, match=r"message\[1\] nests deeper than 100 levels"):
        await memory.add_memory(user_id, [msg("fine"), deep])
    assert await memory.list_memory(user_id) == []


async def test_add_memory_stores_a_copy(memory: MemoryService, user_id: str) -> None:
    message = msg("original text")
    await memory.add_memory(user_id, [message])
    message.content = [TextContent(text="mutated")]
    assert texts(await memory.list_memory(user_id)) == ["original text"]
    assert texts(await memory.search_memory(user_id, query("original"))) == ["original text"]


async def test_add_empty_list_is_a_no_op(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(user_id, [])
    assert await memory.list_memory(user_id) == []


async def test_concurrent_adds_are_all_kept(memory: MemoryService, user_id: str) -> None:
    await asyncio.gather(*(memory.add_memory(user_id, [msg(f"fact number{i}")]) for i in range(30)))
    listed = await memory.list_memory(user_id, filters={"page_size": 100})
    assert sorted(texts(listed), key=str) == sorted((f"fact number{i}" for i in range(30)), key=str)
    hits = await memory.search_memory(user_id, query("fact"), filters={"top_k": 100})
    assert len(hits) == 30


# --- search_memory --------------------------------------------------------------------


async def test_search_finds_by_keyword_case_insensitively(
    memory: MemoryService, user_id: str
) -> None:
    await memory.add_memory(user_id, [msg("Hello World"), msg("something else")])
    assert texts(await memory.search_memory(user_id, query("HELLO"))) == ["Hello World"]


async def test_search_matches_tokens_not_substrings(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(user_id, [msg("I like Banana bread"), msg("a cat")])
    assert texts(await memory.search_memory(user_id, query("a"))) == ["a cat"]
    assert await memory.search_memory(user_id, query("ban")) == []


async def test_search_ignores_punctuation(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(user_id, [msg("My name is Alice.")])
    assert texts(await memory.search_memory(user_id, query("alice?"))) == ["My name is Alice."]


async def test_search_ranks_by_relevance(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(
        user_id,
        [
            msg("tea is a drink"),
            msg("green tea and green leaves, green everywhere"),
            msg("coffee is a drink too"),
            msg("green tea"),
        ],
    )
    hits = texts(await memory.search_memory(user_id, query("green tea")))
    # both terms beat one term; a short document with both beats a long one with more noise
    assert hits[:2] == ["green tea", "green tea and green leaves, green everywhere"]
    assert hits[2] == "tea is a drink"
    assert "coffee is a drink too" not in hits


async def test_search_prefers_rare_terms(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(
        user_id,
        [msg("the weather today"), msg("the meeting today"), msg("the zebra"), msg("the end")],
    )
    hits = texts(await memory.search_memory(user_id, query("the zebra")))
    assert hits[0] == "the zebra"


async def test_search_breaks_ties_by_recency(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(user_id, [msg("lunch at noon", role="user")])
    await memory.add_memory(user_id, [msg("lunch at noon", role="assistant")])
    hits = await memory.search_memory(user_id, query("lunch"))
    assert [m.role for m in hits] == ["assistant", "user"]


async def test_search_uses_the_last_message_as_query(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(user_id, [msg("apples"), msg("pears")])
    hits = await memory.search_memory(user_id, [msg("apples"), msg("pears")])
    assert texts(hits) == ["pears"]


async def test_search_accepts_dict_queries(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(user_id, [msg("hello world")])
    hits = await memory.search_memory(
        user_id, [{"role": "user", "content": [{"type": "text", "text": "world"}]}]
    )
    assert texts(hits) == ["hello world"]


async def test_search_top_k_caps_the_results(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(user_id, [msg(f"note {i} about rust") for i in range(8)])
    hits = await memory.search_memory(user_id, query("rust"), filters={"top_k": 3})
    assert len(hits) == 3
    # equal relevance: most recent first
    assert texts(hits) == ["note 7 about rust", "note 6 about rust", "note 5 about rust"]


async def test_search_without_top_k_gives_the_best_1000(
    memory: MemoryService, user_id: str
) -> None:
    notes = [msg(f"note {i} about otters") for i in range(MAX_TOP_K + 50)]
    await memory.add_memory(user_id, notes)
    hits = await memory.search_memory(user_id, query("otters"))
    # equal relevance: the most recent first
    assert [m.id for m in hits] == [m.id for m in reversed(notes[-MAX_TOP_K:])]


async def test_search_uses_the_first_128_distinct_words_of_a_long_query(
    memory: MemoryService, user_id: str
) -> None:
    # A user can fill their memory with many words, then search with all of them (a
    # pasted document as a turn's input): each memory met would be scored against each.
    words = [f"word{i}" for i in range(20_000)]
    await memory.add_memory(
        user_id, [msg(" ".join(words[i : i + 1000])) for i in range(0, 20_000, 1000)]
    )
    await memory.add_memory(user_id, [msg("needle"), msg("pin")])
    first = [*words[1000:1127], "needle"]  # 128 distinct words, "needle" the last
    found = await memory.search_memory(user_id, query(" ".join(first * 2 + words + ["pin"])))
    # Not "pin", the 20,129th distinct word, nor any memory holding only later words.
    assert sorted(texts(found)) == sorted(["needle", " ".join(words[1000:2000])])
    capped = await memory.search_memory(user_id, query(" ".join([*words[:128], "pin"])))
    assert texts(capped) == [" ".join(words[:1000])]


async def test_a_memory_is_indexed_by_its_first_characters_and_kept_whole(
    memory: MemoryService, user_id: str
) -> None:
    # A reply of megabytes is not analysed whole: only its first MAX_INDEXED_CHARS are.
    filler = "filler " * (MAX_INDEXED_CHARS // 7)
    await memory.add_memory(user_id, [msg(f"early {filler}late"), msg("later")])
    assert texts(await memory.search_memory(user_id, query("early"))) == [f"early {filler}late"]
    assert texts(await memory.search_memory(user_id, query("late"))) == []
    # A query too: its words past them are not searched for.
    assert await memory.search_memory(user_id, query(f"{filler.replace('f', 'k')} later")) == []
    assert texts(await memory.search_memory(user_id, query("later"))) == ["later"]


@pytest.mark.parametrize("top_k", [0, -1, "3", 2.5, True])
async def test_search_rejects_a_bad_top_k(
    memory: MemoryService, user_id: str, top_k: object
) -> None:
    await memory.add_memory(user_id, [msg("x")])
    with pytest.raises(InvalidInputError):
        await memory.search_memory(user_id, query("x"), filters={"top_k": top_k})


async def test_search_of_unknown_user_is_empty(memory: MemoryService, user_id: str) -> None:
    assert await memory.search_memory(user_id, query("hello")) == []


@pytest.mark.parametrize("empty", ["", "   ", "?!.,"])
async def test_search_with_an_empty_query_is_empty(
    memory: MemoryService, user_id: str, empty: str
) -> None:
    await memory.add_memory(user_id, [msg("hello")])
    assert await memory.search_memory(user_id, query(empty)) == []
    assert await memory.search_memory(user_id, []) == []


async def test_search_returns_copies(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(user_id, [msg("keep me")])
    hits = await memory.search_memory(user_id, query("keep"))
    hits[0].content = [TextContent(text="broken")]
    assert texts(await memory.search_memory(user_id, query("keep"))) == ["keep me"]


async def test_search_indexes_every_text_part(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(
        user_id,
        [Message(role="user", content=[TextContent(text="first part"), TextContent(text="zebra")])],
    )
    assert len(await memory.search_memory(user_id, query("zebra"))) == 1


async def test_search_handles_unicode_words(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(user_id, [msg("Straße in München"), msg("我喜欢绿茶")])
    assert texts(await memory.search_memory(user_id, query("münchen"))) == ["Straße in München"]
    assert texts(await memory.search_memory(user_id, query("绿茶"))) == ["我喜欢绿茶"]


async def test_search_keeps_combining_marks_in_their_words(
    memory: MemoryService, user_id: str
) -> None:
    # \\w leaves combining marks out: Hindi's vowel signs split its words into fragments
    # ("कितना", how much, matched "किताब", book, on "क"), and a decomposed "é" matched nothing.
    await memory.add_memory(
        user_id,
        [
            msg("मुझे किताब पसंद है"),
            msg("a cafe\u0301 in Paris"),
            msg("\uff21\uff22\uff23 dépôt"),
            msg("مُحَمَّد"),
        ],
    )
    assert texts(await memory.search_memory(user_id, query("कितना"))) == []
    assert texts(await memory.search_memory(user_id, query("किताब"))) == ["मुझे किताब पसंद है"]
    assert texts(await memory.search_memory(user_id, query("café"))) == ["a cafe\u0301 in Paris"]
    assert texts(await memory.search_memory(user_id, query("abc"))) == ["\uff21\uff22\uff23 dépôt"]
    assert texts(await memory.search_memory(user_id, query("مُحَمَّد"))) == ["مُحَمَّد"]


async def test_search_splits_scripts_written_without_spaces(
    memory: MemoryService, user_id: str
) -> None:
    # A run of Thai was one token, so a question found only the very same sentence; the
    # capital dotted I folded to "i" and a combining dot, so "istanbul" missed "İstanbul";
    # half-width katakana were one token.
    await memory.add_memory(
        user_id,
        [msg("ฉันชื่ออลิซ"), msg("ฉันชอบกาแฟ"), msg("İstanbul'da evim"), msg("ｶﾌｪ")],
    )
    assert texts(await memory.search_memory(user_id, query("ชื่ออะไร"), filters={"top_k": 1})) == [
        "ฉันชื่ออลิซ"
    ]
    assert texts(await memory.search_memory(user_id, query("istanbul"))) == ["İstanbul'da evim"]
    assert texts(await memory.search_memory(user_id, query("カフェ"))) == ["ｶﾌｪ"]


async def test_search_orders_the_characters_of_scripts_written_without_spaces(
    memory: MemoryService, user_id: str
) -> None:
    # Each character was a token of its own: "明天小王要来" (tomorrow Xiao Wang comes) has
    # both characters of "小明" and ranked first as the newer, over the memory holding the name.
    await memory.add_memory(user_id, [msg("我叫小明\uff0c住在北京"), msg("明天小王要来")])
    await memory.add_memory(user_id, [msg("东京大学的学生"), msg("京东的大学")])
    assert texts(await memory.search_memory(user_id, query("小明"), filters={"top_k": 1})) == [
        "我叫小明\uff0c住在北京"
    ]
    assert texts(await memory.search_memory(user_id, query("东京"), filters={"top_k": 1})) == [
        "东京大学的学生"
    ]


async def test_search_matches_words_whatever_their_accents_and_vowel_marks(
    memory: MemoryService, user_id: str
) -> None:
    # Marks had to match exactly: "cafe" missed "café", unvocalized Arabic missed vocalized.
    await memory.add_memory(
        user_id,
        [
            msg("I love café au lait"),
            msg("Tôi tên là Nguyễn"),
            msg("اسمي مُحَمَّد"),
            msg("שָׁלוֹם עולם"),
            msg("مـحـمـد صديقي"),
            msg("cafe racer"),
        ],
    )
    found = {
        q: sorted(texts(await memory.search_memory(user_id, query(q))), key=str)
        for q in ["cafe", "café", "nguyen", "محمد", "שלום"]
    }
    assert found == {
        "cafe": ["I love café au lait", "cafe racer"],
        "café": ["I love café au lait", "cafe racer"],
        "nguyen": ["Tôi tên là Nguyễn"],
        "محمد": ["اسمي مُحَمَّد", "مـحـمـد صديقي"],
        "שלום": ["שָׁלוֹם עולם"],
    }


async def test_search_ignores_invisible_format_characters_inside_words(
    memory: MemoryService, user_id: str
) -> None:
    # A soft hyphen, zero-width space, word joiner or BOM split the word it was in.
    hidden = ["\u00ad", "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"]
    await memory.add_memory(user_id, [msg(f"my pass{c}word is {c}hunter2") for c in hidden])
    assert len(await memory.search_memory(user_id, query("password"), {"top_k": 10})) == 6
    assert len(await memory.search_memory(user_id, query("hunter2"), {"top_k": 10})) == 6
    # Memories stored before still match what matched them: the pieces are still tokens.
    assert len(await memory.search_memory(user_id, query("word"), {"top_k": 10})) == 6


FORMAT_CHARACTERS = ["\u00ad", "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"]


def split_words(rng: random.Random, count: int) -> str:
    """``count`` words of a few letters, some of them pieces joined by format characters."""
    return " ".join(
        "".join(
            piece + rng.choice(["", *FORMAT_CHARACTERS])
            for piece in rng.choices("xyzw", k=rng.randint(1, 3))
        )
        for _ in range(count)
    )


async def test_top_k_keeps_the_best_of_the_full_ranking_when_format_characters_split_words(
    memory: MemoryService, user_id: str
) -> None:
    # "x\u00adx" holds the token "x" twice: counted as one word, it outranked what a search
    # with top_k stopped at.
    await memory.add_memory(user_id, [msg("x\u00adx"), msg("x f0 f1 f2"), msg("y g0 g1 g2 g3 g4")])
    full = [m.id for m in await memory.search_memory(user_id, query("y x"))]
    for top_k in (1, 2, 3):
        hits = await memory.search_memory(user_id, query("y x"), {"top_k": top_k})
        assert [m.id for m in hits] == full[:top_k]


async def test_top_k_keeps_the_best_of_the_full_ranking_of_words_split_by_format_characters(
    memory: MemoryService, user_id: str
) -> None:
    rng = random.Random("format characters")
    await memory.add_memory(user_id, [msg(split_words(rng, rng.randint(1, 6))) for _ in range(150)])
    for _ in range(40):
        words = query(split_words(rng, rng.randint(1, 2)))
        full = [m.id for m in await memory.search_memory(user_id, words)]
        for top_k in (1, 2, 3, 5):
            hits = await memory.search_memory(user_id, words, {"top_k": top_k})
            assert [m.id for m in hits] == full[:top_k], (words[0].get_text_content(), top_k)


async def test_search_finds_emoji(memory: MemoryService, user_id: str) -> None:
    # Emoji were no tokens at all: a search for one found nothing.
    await memory.add_memory(
        user_id,
        [
            msg("my favourite food is 🍕"),
            msg("waving 👋🏽 at the family 👨\u200d👩\u200d👧"),
            msg("flag 🇯🇵 and ❤️"),
        ],
    )
    assert texts(await memory.search_memory(user_id, query("🍕"))) == ["my favourite food is 🍕"]
    assert texts(await memory.search_memory(user_id, query("👋🏽"))) == [
        "waving 👋🏽 at the family 👨\u200d👩\u200d👧"
    ]
    assert texts(await memory.search_memory(user_id, query("👨\u200d👩\u200d👧"))) == [
        "waving 👋🏽 at the family 👨\u200d👩\u200d👧"
    ]
    assert texts(await memory.search_memory(user_id, query("🇯🇵 ❤️"))) == ["flag 🇯🇵 and ❤️"]


async def test_search_splits_every_cjk_block_per_character(
    memory: MemoryService, user_id: str
) -> None:
    # CJK Extension B and beyond, Bopomofo and the Katakana phonetic extensions were runs
    # of one token: a character of them found nothing.
    await memory.add_memory(user_id, [msg("𠮷𠮷 restaurant"), msg("ㄅㄆㄇ 注音"), msg("ㇰㇱ")])
    assert texts(await memory.search_memory(user_id, query("𠮷"))) == ["𠮷𠮷 restaurant"]
    assert texts(await memory.search_memory(user_id, query("ㄆ"))) == ["ㄅㄆㄇ 注音"]
    assert texts(await memory.search_memory(user_id, query("ㇱ"))) == ["ㇰㇱ"]
    # What a run matched before, it still matches.
    assert texts(await memory.search_memory(user_id, query("𠮷𠮷"))) == ["𠮷𠮷 restaurant"]


async def test_memory_of_users_is_separate(memory: MemoryService, user_id: str) -> None:
    a, a_b, star = user_id, f"{user_id}:b", "*"
    await memory.add_memory(a_b, [msg("secret of a-b")])
    await memory.add_memory(star, [msg(f"secret of star {user_id}")])
    await memory.add_memory(a, [msg("note of a")])
    assert texts(await memory.search_memory(a, query("secret"))) == []
    assert texts(await memory.list_memory(a)) == ["note of a"]
    star_hits = texts(await memory.search_memory(star, query("secret"), filters={"top_k": 1000}))
    assert "secret of a-b" not in star_hits
    await memory.delete_memory(a)
    assert texts(await memory.list_memory(a_b)) == ["secret of a-b"]


# --- list_memory ----------------------------------------------------------------------


async def test_list_memory_pages_chronologically(memory: MemoryService, user_id: str) -> None:
    for i in range(5):
        await memory.add_memory(user_id, [msg(f"m{i}")], session_id=f"s{i % 2}")
    page1 = await memory.list_memory(user_id, filters={"page_num": 1, "page_size": 2})
    page2 = await memory.list_memory(user_id, filters={"page_num": 2, "page_size": 2})
    page3 = await memory.list_memory(user_id, filters={"page_num": 3, "page_size": 2})
    page4 = await memory.list_memory(user_id, filters={"page_num": 4, "page_size": 2})
    assert [texts(p) for p in (page1, page2, page3, page4)] == [
        ["m0", "m1"],
        ["m2", "m3"],
        ["m4"],
        [],
    ]


async def test_list_memory_defaults_to_ten_per_page(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(user_id, [msg(f"m{i}") for i in range(12)])
    assert texts(await memory.list_memory(user_id)) == [f"m{i}" for i in range(10)]


@pytest.mark.parametrize(
    "filters", [{"page_num": 0}, {"page_size": 0}, {"page_num": "1"}, {"page_size": 1001}, [1]]
)
async def test_list_memory_rejects_bad_pages(
    memory: MemoryService, user_id: str, filters: object
) -> None:
    with pytest.raises(InvalidInputError):
        await memory.list_memory(user_id, filters=filters)  # type: ignore[arg-type]


async def test_list_memory_of_unknown_user_is_empty(memory: MemoryService, user_id: str) -> None:
    assert await memory.list_memory(user_id) == []


# --- delete_memory --------------------------------------------------------------------


async def test_delete_one_session_keeps_the_others(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(user_id, [msg("alpha fact")], session_id="s1")
    await memory.add_memory(user_id, [msg("beta fact")], session_id="s2")
    await memory.add_memory(user_id, [msg("gamma fact")])
    await memory.delete_memory(user_id, "s1")
    assert texts(await memory.list_memory(user_id)) == ["beta fact", "gamma fact"]
    assert texts(await memory.search_memory(user_id, query("alpha"))) == []
    assert set(texts(await memory.search_memory(user_id, query("fact")))) == {
        "beta fact",
        "gamma fact",
    }


async def test_deleting_sessions_sharing_words_leaves_exactly_the_other_memories(
    memory: MemoryService, user_id: str
) -> None:
    # Sessions added in turns, of the same few words (repeated, in texts of every length):
    # a delete removes some memories of each posting group, all of others, and a word's
    # only memory.
    rng = random.Random("sessions sharing words")
    words = ["tea", "green", "cup", "pot", "leaf"]
    added: list[tuple[str, Message]] = []
    for _ in range(12):
        for session in ("s1", "s2", "s3"):
            batch = [
                msg(" ".join(rng.choices(words, k=rng.randint(1, 6))))
                for _ in range(rng.randint(1, 8))
            ]
            added += [(session, message) for message in batch]
            await memory.add_memory(user_id, batch, session_id=session)
    added.append(("s2", msg("rare tea")))
    await memory.add_memory(user_id, [added[-1][1]], session_id="s2")
    untouched = f"{user_id}-untouched"  # the memories left, added alone
    queries = [*words, "rare", "green tea", "cup pot leaf", "tea tea rare"]
    for session in ("s2", "s1"):
        await memory.delete_memory(user_id, session)
        added = [(owner, message) for owner, message in added if owner != session]
        left = [message for _, message in added]
        listed = await memory.list_memory(user_id, {"page_size": 1000})
        assert [m.id for m in listed] == [m.id for m in left]
        await memory.delete_memory(untouched)
        await memory.add_memory(untouched, left)
        for words_asked in queries:
            for filters in (None, {"top_k": 1}, {"top_k": 5}):
                got = await memory.search_memory(user_id, query(words_asked), filters)
                expected = await memory.search_memory(untouched, query(words_asked), filters)
                assert [m.id for m in got] == [m.id for m in expected], (words_asked, filters)
    assert await memory.search_memory(user_id, query("rare")) == []


async def test_default_session_is_deletable_by_name(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(user_id, [msg("no session given")])
    await memory.add_memory(user_id, [msg("in s1")], session_id="s1")
    await memory.delete_memory(user_id, "default")
    assert texts(await memory.list_memory(user_id)) == ["in s1"]


async def test_delete_all_of_a_user(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(user_id, [msg("alpha")], session_id="s1")
    await memory.add_memory(user_id, [msg("beta")])
    await memory.delete_memory(user_id)
    assert await memory.list_memory(user_id) == []
    assert await memory.search_memory(user_id, query("alpha beta")) == []


async def test_memory_can_be_added_again_after_delete(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(user_id, [msg("old words")])
    await memory.delete_memory(user_id)
    await memory.add_memory(user_id, [msg("new words")])
    assert texts(await memory.search_memory(user_id, query("words"))) == ["new words"]


async def test_delete_missing_memory_is_not_an_error(memory: MemoryService, user_id: str) -> None:
    await memory.delete_memory(user_id)
    await memory.delete_memory(user_id, "missing-session")


async def test_delete_with_a_blank_session_is_refused(memory: MemoryService, user_id: str) -> None:
    await memory.add_memory(user_id, [msg("precious")])
    with pytest.raises(InvalidInputError):
        await memory.delete_memory(user_id, "   ")
    assert texts(await memory.list_memory(user_id)) == ["precious"]


# --- lifecycle ------------------------------------------------------------------------


async def test_calls_before_start_raise_a_clear_runtime_error(
    memory_factory: Callable[[], MemoryService], user_id: str
) -> None:
    service = memory_factory()
    calls = [
        service.add_memory(user_id, [msg("x")]),
        service.search_memory(user_id, query("x")),
        service.list_memory(user_id),
        service.delete_memory(user_id),
    ]
    for call in calls:
        with pytest.raises(ServiceNotStartedError, match="not started"):
            await call


async def test_health_follows_the_lifecycle(memory_factory: Callable[[], MemoryService]) -> None:
    service = memory_factory()
    async with service:
        assert await service.health() is True
    assert await service.health() is False


async def test_memory_survives_a_new_service_object(
    memory_factory: Callable[[], MemoryService], user_id: str
) -> None:
    async with memory_factory() as first:
        await first.add_memory(user_id, [msg("durable fact")])
    async with memory_factory() as second:
        assert texts(await second.search_memory(user_id, query("durable"))) == ["durable fact"]


# --- adds retried under an Idempotency-Key -------------------------------------------------


async def keyed_add(memory: MemoryService, seed: str, user_id: str, text: str) -> None:
    """An add made as a request with an Idempotency-Key makes it (in its own context)."""

    async def run() -> None:
        seed_writes(seed)
        await memory.add_memory(user_id, [msg(text)], session_id="s1")

    await asyncio.create_task(run())


async def test_a_keyed_add_run_again_stores_nothing_twice(
    memory: MemoryService, user_id: str
) -> None:
    await keyed_add(memory, f"{user_id}\0key-1", user_id, "green tea")
    # The same request again (its first answer was lost): nothing more is remembered.
    await keyed_add(memory, f"{user_id}\0key-1", user_id, "green tea")
    assert texts(await memory.list_memory(user_id)) == ["green tea"]
    await keyed_add(memory, f"{user_id}\0key-2", user_id, "green tea")
    await memory.add_memory(user_id, [msg("green tea")])  # without a key
    assert texts(await memory.list_memory(user_id)) == ["green tea"] * 3
    hits = await memory.search_memory(user_id, query("tea"))
    assert len(hits) == 3


async def test_a_document_of_many_distinct_words_is_found_by_each_and_stored_once(
    memory: MemoryService, user_id: str
) -> None:
    # Past what one step indexes on Redis (4,000 buckets): indexed in several. Within the
    # characters a memory is indexed by (46,889).
    words = [f"t{i}" for i in range(8_000)]
    document = " ".join(words)
    await keyed_add(memory, f"{user_id}\0doc", user_id, document)
    await keyed_add(memory, f"{user_id}\0doc", user_id, document)  # its answer was lost
    assert texts(await memory.list_memory(user_id)) == [document]
    for word in (words[0], words[3_999], words[-1]):
        assert texts(await memory.search_memory(user_id, query(word))) == [document]
