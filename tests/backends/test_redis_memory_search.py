"""Redis memory search ranks exactly like the in-memory reference, pruning included."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
from redis.asyncio import Redis

from agentscope_serverless.errors import InvalidInputError, StoreUnavailableError
from agentscope_serverless.local_stack import RedisClusterServer, RedisServer
from agentscope_serverless.schemas.agent_schemas import Message, TextContent
from agentscope_serverless.services._once import WRITE_ID_SECONDS, seed_writes
from agentscope_serverless.services._redis import user_key_prefix
from agentscope_serverless.services.memory import InMemoryMemoryService, MemoryService
from agentscope_serverless.services.memory import redis as redis_memory
from agentscope_serverless.services.memory.redis import RedisMemoryService
from agentscope_serverless.services.memory.text import term_frequencies, tokenize

WORDS = [f"w{i}" for i in range(40)]
WEIGHTS = [1 / (rank + 1) for rank in range(len(WORDS))]  # Zipf-like: a few very common words


def msg(text: str) -> Message:
    return Message(role="user", content=[TextContent(text=text)])


def corpus(rng: random.Random, size: int) -> list[tuple[str, Message]]:
    """(session, memory) pairs: short texts, repeated words, and exact duplicates."""
    memories: list[tuple[str, Message]] = []
    for position in range(size):
        if memories and rng.random() < 0.05:
            text = memories[rng.randrange(len(memories))][1].get_text_content() or ""
        else:
            text = " ".join(rng.choices(WORDS, WEIGHTS, k=rng.randint(1, 12)))
        memories.append((f"s{position * 4 // size}", msg(text)))
    return memories


async def fill(service: MemoryService, user_id: str, memories: list[tuple[str, Message]]) -> None:
    for session in sorted({session for session, _ in memories}):
        batch = [message for owner, message in memories if owner == session]
        await service.add_memory(user_id, batch, session_id=session)


async def assert_same_rankings(
    reference: MemoryService,
    redis: MemoryService,
    user_id: str,
    rng: random.Random,
    text: Callable[[random.Random, int], str] | None = None,
) -> None:
    for _ in range(150):
        k = rng.randint(1, 4)
        words = text(rng, k) if text else " ".join(rng.choices(WORDS, WEIGHTS, k=k))
        query = [msg(words)]
        top_k = rng.choice([1, 2, 3, 5, 10, 50, None])
        filters = None if top_k is None else {"top_k": top_k}
        expected = [m.id for m in await reference.search_memory(user_id, query, filters)]
        got = [m.id for m in await redis.search_memory(user_id, query, filters)]
        assert got == expected, (query[0].get_text_content(), top_k)


@pytest.mark.parametrize("topology", ["standalone", "cluster"])
async def test_search_matches_the_reference_ranking_on_a_random_corpus(
    redis_server: RedisServer,
    redis_cluster_server: RedisClusterServer,
    user_id: str,
    topology: str,
) -> None:
    rng = random.Random(f"corpus-{topology}")
    memories = corpus(rng, 600)
    cluster = topology == "cluster"
    url = redis_cluster_server.url if cluster else redis_server.url
    reference = InMemoryMemoryService()
    async with reference, RedisMemoryService(url, cluster=cluster) as redis:
        await fill(reference, user_id, memories)
        await fill(redis, user_id, memories)
        await assert_same_rankings(reference, redis, user_id, rng)

        more = [message for _, message in corpus(rng, 20)]
        for service in (reference, redis):
            await service.delete_memory(user_id, "s1")
            await service.add_memory(user_id, more, session_id="s9")
        await assert_same_rankings(reference, redis, user_id, rng)


# Words with accents, vowel marks, tatweel, format characters, emoji and scripts written
# without spaces: the forms added for them must be indexed and ranked alike.
WORLD_WORDS = [
    "café", "cafe", "nguyễn", "nguyen", "مُحَمَّد", "محمد", "مـحـمـد", "שָׁלוֹם", "שלום",
    "pass\u00adword", "password", "🍕", "👋🏽", "👨\u200d👩\u200d👧", "🇯🇵", "❤️", "小明",
    "明天", "小", "北京", "ㄅㄆ", "𠮷𠮷", "ชื่อ", "กาแฟ", "किताब", "ｶﾌｪ",
]  # fmt: skip


def world_text(rng: random.Random, k: int) -> str:
    """``k`` of :data:`WORLD_WORDS`, some written together (no space between)."""
    return "".join(w + rng.choice([" ", "", "\u200b"]) for w in rng.choices(WORLD_WORDS, k=k))


async def test_search_of_words_in_every_script_matches_the_reference(
    redis_server: RedisServer, user_id: str
) -> None:
    rng = random.Random("world")
    memories = [(f"s{i % 3}", msg(world_text(rng, rng.randint(1, 8)))) for i in range(300)]
    reference = InMemoryMemoryService()
    async with reference, RedisMemoryService(redis_server.url) as redis:
        await fill(reference, user_id, memories)
        await fill(redis, user_id, memories)
        await assert_same_rankings(reference, redis, user_id, rng, world_text)
        for service in (reference, redis):
            await service.delete_memory(user_id, "s1")
        await assert_same_rankings(reference, redis, user_id, rng, world_text)


async def test_memory_indexed_with_a_length_below_a_term_frequency_is_still_ranked_exactly(
    redis_server: RedisServer, user_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Memories added by earlier releases counted a word split by format characters as one
    # ("x\u00adx": length 1, though it holds "x" twice); their entries keep that length.
    def earlier_frequencies(text: str) -> tuple[Counter[str], int]:
        counts, _ = term_frequencies(text)
        return counts, len(text.split())

    monkeypatch.setattr(redis_memory, "term_frequencies", earlier_frequencies)
    rng = random.Random("earlier lengths")
    pieces = ["\u00ad", "\u200b", "\u200c", "\u2060", " "]

    def text(rng: random.Random, k: int) -> str:
        return "".join(w + rng.choice(pieces) for w in rng.choices("xyzw", k=k)).strip()

    memories = [msg("x\u00adx"), msg("x f0 f1 f2"), msg("y g0 g1 g2 g3 g4")]
    memories += [msg(text(rng, rng.randint(1, 8))) for _ in range(200)]
    async with RedisMemoryService(redis_server.url) as redis:
        await redis.add_memory(user_id, memories)
        for words in ["y x", *(text(rng, rng.randint(1, 3)) for _ in range(60))]:
            full = [m.id for m in await redis.search_memory(user_id, [msg(words)])]
            for top_k in (1, 2, 3, 5, 10):
                hits = await redis.search_memory(user_id, [msg(words)], {"top_k": top_k})
                assert [m.id for m in hits] == full[:top_k], (words, top_k)


async def test_search_matches_the_reference_across_batches_pages_and_deletions(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    # Few words, so buckets outgrow their tails into pages; adds larger than one script
    # batch; single adds; a session deleted from the middle.
    rng = random.Random("pages")
    words, weights = WORDS[:4], WEIGHTS[:4]
    memories = [
        (f"s{rng.randrange(5)}", msg(" ".join(rng.choices(words, weights, k=rng.randint(2, 5)))))
        for _ in range(2600)
    ]
    reference = InMemoryMemoryService()
    async with reference, RedisMemoryService(redis_server.url) as redis:
        for service in (reference, redis):
            await service.add_memory(user_id, [m for _, m in memories[:2500]], session_id="bulk")
            for session, message in memories[2500:]:
                await service.add_memory(user_id, message, session_id=session)
        base = user_key_prefix("agentscope", "memory", user_id)
        members = await redis_client.zrange(f"{base}:buckets", 0, -1)
        assert any(member.count("\0") == 2 for member in members)  # pages
        await assert_same_rankings(reference, redis, user_id, rng)
        for service in (reference, redis):
            await service.delete_memory(user_id, "s2")
            await service.delete_memory(user_id, "bulk")
        await assert_same_rankings(reference, redis, user_id, rng)
        for service in (reference, redis):
            await service.delete_memory(user_id, "s0")
            await service.delete_memory(user_id, "s1")
            await service.delete_memory(user_id, "s3")
            await service.delete_memory(user_id, "s4")
        assert await redis.search_memory(user_id, [msg("w0 w1 w2")]) == []
        assert await redis_client.zcard(f"{base}:buckets") == 0
        assert await redis_client.hlen(f"{base}:bucket_ids") == 0
        assert await redis_client.hlen(f"{base}:entries") == 0


async def test_memory_indexed_by_the_earlier_layout_is_refused_until_deleted(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    base = user_key_prefix("agentscope", "memory", user_id)
    await redis_client.hset(f"{base}:info", "1", '[1,{"old":1}]')
    await redis_client.zadd(f"{base}:postings", {"old\0fffffffe000000011": 0})
    async with RedisMemoryService(redis_server.url) as redis:
        for call in (
            redis.search_memory(user_id, [msg("old")]),
            redis.add_memory(user_id, [msg("new")]),
            redis.delete_memory(user_id, "default"),
        ):
            with pytest.raises(StoreUnavailableError):
                await call
        await redis.delete_memory(user_id)
        assert await redis_client.exists(f"{base}:info", f"{base}:postings") == 0
        await redis.add_memory(user_id, [msg("new")])
        assert [m.get_text_content() for m in await redis.search_memory(user_id, [msg("new")])] == [
            "new"
        ]


async def test_a_bulk_add_split_into_many_small_steps_ranks_like_the_reference(
    redis_server: RedisServer, user_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Index steps of at most 7 buckets and 100 ids: a bucket's ids span several steps.
    monkeypatch.setattr(redis_memory, "_INDEX_BUCKETS", 7)
    monkeypatch.setattr(redis_memory, "_INDEX_IDS", 100)
    rng = random.Random("small steps")
    memories = [message for _, message in corpus(rng, 2300)]
    reference = InMemoryMemoryService()
    async with reference, RedisMemoryService(redis_server.url) as redis:
        for service in (reference, redis):
            await service.add_memory(user_id, memories, session_id="bulk")
            await service.add_memory(user_id, memories[:3], session_id="after")
        await assert_same_rankings(reference, redis, user_id, rng)
        assert await listed(redis, user_id) == await listed(reference, user_id)


async def test_a_keyed_bulk_add_cut_off_midway_and_run_again_stores_and_indexes_once(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    rng = random.Random("cut off")
    memories = [message for _, message in corpus(rng, 2500)]
    reference = InMemoryMemoryService()
    async with reference, RedisMemoryService(redis_server.url) as redis:
        await reference.add_memory(user_id, memories, session_id="bulk")
        run = redis._redis.run
        for steps_before_the_cut in (1, 3, 4):  # its ids; its batches; its index steps
            calls = 0

            async def cut_off(*args: Any, steps: int = steps_before_the_cut, **kwargs: Any) -> Any:
                nonlocal calls
                calls += 1
                if calls > steps:
                    raise StoreUnavailableError("redis", "cut off")
                return await run(*args, **kwargs)

            redis._redis.run = cut_off  # type: ignore[method-assign]
            with pytest.raises(StoreUnavailableError):
                await keyed(redis.add_memory(user_id, memories, session_id="bulk"))
        redis._redis.run = run  # type: ignore[method-assign]
        await keyed(redis.add_memory(user_id, memories, session_id="bulk"))
        await keyed(redis.add_memory(user_id, memories, session_id="bulk"))  # all applied

        assert await listed(redis, user_id) == [m.id for m in memories]
        await assert_same_rankings(reference, redis, user_id, rng)
        base = user_key_prefix("agentscope", "memory", user_id)
        # Each memory once in the bucket of each of its terms: none missing, none twice.
        postings = [
            (field.split("\0")[:2], ids[at : at + 8])  # a page's field: "<bucket>\0<id>"
            for field, ids in (await redis_client.hgetall(f"{base}:bucket_ids")).items()
            for at in range(0, len(ids), 8)
        ]
        terms = [len(set(tokenize(m.get_text_content() or ""))) for m in memories]
        assert len(postings) == len({(*bucket, id_) for bucket, id_ in postings}) == sum(terms)


async def test_the_ids_a_bulk_add_reserved_are_forgotten_with_its_write_id(
    redis_server: RedisServer, redis_client: Redis, user_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    memories = [msg(f"note {n}") for n in range(1500)]
    base = user_key_prefix("agentscope", "memory", user_id)
    async with RedisMemoryService(redis_server.url) as redis:
        await keyed(redis.add_memory(user_id, memories))
        assert await redis_client.hlen(f"{base}:reserved") == 1
        later = redis_memory.now_ms() + (WRITE_ID_SECONDS + 1) * 1000
        monkeypatch.setattr(redis_memory, "now_ms", lambda: later)
        await keyed(redis.add_memory(user_id, [msg("one more")]), key="key-2")
        assert await redis_client.hlen(f"{base}:reserved") == 0
        assert await redis_client.zcard(f"{base}:applied") == 1  # the last add's
        assert len(await listed(redis, user_id)) == 1501


@pytest.mark.parametrize("topology", ["standalone", "cluster"])
async def test_concurrent_bulk_adds_of_one_user_rank_like_the_same_adds_in_turn(
    redis_server: RedisServer,
    redis_cluster_server: RedisClusterServer,
    user_id: str,
    topology: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Small index steps, so the two adds' steps interleave on shared buckets; a single
    # add (one script) lands between them.
    monkeypatch.setattr(redis_memory, "_INDEX_BUCKETS", 5)
    monkeypatch.setattr(redis_memory, "_INDEX_IDS", 200)
    rng = random.Random(f"concurrent-{topology}")
    first, second = ([m for _, m in corpus(rng, 1100)] for _ in range(2))
    single = [m for _, m in corpus(rng, 40)]
    cluster = topology == "cluster"
    url = redis_cluster_server.url if cluster else redis_server.url
    reference = InMemoryMemoryService()
    adds = [(first, "a"), (second, "b"), (single, "c")]
    async with reference, RedisMemoryService(url, cluster=cluster) as redis:
        await asyncio.gather(*(redis.add_memory(user_id, m, session_id=s) for m, s in adds))
        # The reference makes the same adds one after the other, in the order Redis took
        # them; each add's memories are one block, in its order (its ids reserved at once).
        stored = await listed(redis, user_id)
        for memories, session in sorted(adds, key=lambda add: stored.index(add[0][0].id)):
            await reference.add_memory(user_id, memories, session_id=session)
        assert stored == await listed(reference, user_id)
        if not cluster:  # the adds' ids were merged in order into the buckets they share
            async with Redis.from_url(url, decode_responses=True) as client:
                await assert_buckets_ascend(client, user_id)
        await assert_same_rankings(reference, redis, user_id, rng)
        for service in (reference, redis):
            await service.delete_memory(user_id, "a")
        await assert_same_rankings(reference, redis, user_id, rng)


async def listed(service: MemoryService, user_id: str) -> list[str]:
    """The ids of all the user's memories, oldest first."""
    ids: list[str] = []
    for page in itertools.count(1):
        batch = await service.list_memory(user_id, {"page_num": page, "page_size": 1000})
        ids += [m.id for m in batch]
        if len(batch) < 1000:
            return ids
    raise AssertionError("unreachable")


async def keyed(add: Coroutine[Any, Any, None], key: str = "key-1") -> None:
    """Runs ``add`` as a request with an Idempotency-Key would (in its own context)."""

    async def run() -> None:
        seed_writes(f"user\0{key}")
        await add

    await asyncio.create_task(run())


def before_call(
    service: RedisMemoryService, number: int, action: Callable[[], Awaitable[Any]]
) -> Callable[[], int]:
    """Run ``action`` just before the ``number``-th script call of ``service`` (a step of
    a bulk add); returns how many calls were made so far."""
    run = service._redis.run
    calls = 0

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == number:
            service._redis.run = run  # type: ignore[method-assign]
            await action()
        return await run(*args, **kwargs)

    service._redis.run = counted  # type: ignore[method-assign]
    return lambda: calls


@pytest.mark.parametrize("deleted", ["its session", "all of the user's memory"])
async def test_memory_deleted_while_a_bulk_add_indexes_it_stays_deleted(
    redis_server: RedisServer, redis_client: Redis, user_id: str, deleted: str
) -> None:
    # 1500 memories: their ids are reserved, they are stored in two batches, then indexed
    # in one step; the delete comes between the batches and the index step.
    memories = [msg(f"note{n} shared") for n in range(1500)]
    session = None if deleted == "all of the user's memory" else "bulk"
    other = msg("kept shared")
    kept = [] if session is None else [other]
    reference = InMemoryMemoryService()
    async with reference, RedisMemoryService(redis_server.url) as redis:
        await redis.add_memory(user_id, [other], session_id="other")
        await reference.add_memory(user_id, kept, session_id="other")
        calls = before_call(redis, 4, lambda: redis.delete_memory(user_id, session))
        await redis.add_memory(user_id, memories, session_id="bulk")
        assert calls() == 4

        assert await listed(redis, user_id) == [m.id for m in kept]
        hits = await redis.search_memory(user_id, [msg("shared note7")])
        assert [m.id for m in hits] == [m.id for m in kept]
        # Nothing of the deleted memories is left in the index to skew later rankings.
        base = user_key_prefix("agentscope", "memory", user_id)
        postings = await redis_client.hgetall(f"{base}:bucket_ids")
        assert sum(len(ids) for ids in postings.values()) // 8 == 2 * len(kept)
        assert int(await redis_client.hget(f"{base}:stats", "docs") or 0) == len(kept)
        for service in (reference, redis):
            await service.add_memory(user_id, [msg("shared words here"), msg("shared")])
        query = [msg("shared")]
        expected = [m.get_text_content() for m in await reference.search_memory(user_id, query)]
        got = [m.get_text_content() for m in await redis.search_memory(user_id, query)]
        assert got == expected


async def test_memory_erased_while_a_bulk_add_stores_it_overwrites_no_later_memory(
    redis_server: RedisServer, user_id: str
) -> None:
    # Between the two batches of the bulk add (its ids reserved, the first stored), the
    # user's memory is erased and new memories are added: they are given ids from the
    # first again, which the second batch was to be stored under too.
    memories = [msg(f"note{n} shared") for n in range(1500)]
    later = [msg(f"later{n} shared") for n in range(1100)]
    reference = InMemoryMemoryService()
    async with reference, RedisMemoryService(redis_server.url) as redis:

        async def erase_and_add() -> None:
            await redis.delete_memory(user_id)
            for service in (reference, redis):
                for start in range(0, len(later), 100):
                    await service.add_memory(user_id, later[start : start + 100])

        calls = before_call(redis, 3, erase_and_add)
        await redis.add_memory(user_id, memories, session_id="bulk")
        assert calls() == 3
        assert await listed(redis, user_id) == [m.id for m in later]
        assert await redis.search_memory(user_id, [msg("note5")]) == []
        query = [msg("shared")]
        expected = [m.id for m in await reference.search_memory(user_id, query, {"top_k": 1000})]
        got = [m.id for m in await redis.search_memory(user_id, query, {"top_k": 1000})]
        assert got == expected


def texts(memories: list[Message]) -> list[str]:
    return [m.get_text_content() or "" for m in memories]


async def test_max_messages_per_session_keeps_the_newest_memories_of_each_session(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    # AgentScope Runtime's option was refused: memory grew without bound.
    async with RedisMemoryService(redis_server.url, max_messages_per_session=3) as redis:
        for word in ("apple", "banana", "cherry", "date", "elder"):
            await redis.add_memory(user_id, [msg(f"{word} fruit")], session_id="a")
        await redis.add_memory(user_id, [msg("fig fruit"), msg("grape fruit")], session_id="b")
        await redis.add_memory(
            user_id, [msg(f"{word} tree") for word in ("oak", "elm", "ash", "yew")]
        )
        everything = await redis.list_memory(user_id, {"page_size": 100})
        assert texts(everything) == [
            "cherry fruit",
            "date fruit",
            "elder fruit",
            "fig fruit",
            "grape fruit",
            "elm tree",
            "ash tree",
            "yew tree",
        ]
        assert await redis.search_memory(user_id, [msg("apple banana oak")]) == []
        found = await redis.search_memory(user_id, [msg("fruit")], {"top_k": 10})
        assert sorted(texts(found)) == sorted(texts(everything[:5]))

        # The search statistics and index hold only what is kept: it ranks as the same
        # memories added to an uncapped service.
        reference = InMemoryMemoryService()
        async with reference:
            for session, kept in (("a", everything[:3]), ("b", everything[3:5])):
                await reference.add_memory(user_id, kept, session_id=session)
            await reference.add_memory(user_id, everything[5:])
            await assert_same_rankings(reference, redis, user_id, random.Random("capped"))

        for session in ("a", "b", "default"):
            await redis.delete_memory(user_id, session)
        base = user_key_prefix("agentscope", "memory", user_id)
        assert await redis_client.zcard(f"{base}:buckets") == 0
        assert await redis_client.hlen(f"{base}:entries") == 0
        assert await redis_client.hmget(f"{base}:stats", ["docs", "length"]) == ["0", "0"]


@pytest.mark.parametrize("topology", ["standalone", "cluster"])
async def test_concurrent_adds_to_a_capped_session_keep_exactly_the_newest(
    redis_server: RedisServer,
    redis_cluster_server: RedisClusterServer,
    user_id: str,
    topology: str,
) -> None:
    cluster = topology == "cluster"
    url = redis_cluster_server.url if cluster else redis_server.url
    async with RedisMemoryService(url, cluster=cluster, max_messages_per_session=5) as redis:
        await asyncio.gather(
            *(redis.add_memory(user_id, [msg(f"note {i}")], session_id="s") for i in range(20))
        )
        kept = await redis.list_memory(user_id, {"page_size": 100})
        assert len(kept) == 5
        found = await redis.search_memory(user_id, [msg("note")], {"top_k": 100})
        assert sorted(texts(found)) == sorted(texts(kept))


async def test_a_bulk_add_to_a_capped_session_keeps_its_newest_memories(
    redis_server: RedisServer, user_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_memory, "_ADD_BATCH", 4)
    monkeypatch.setattr(redis_memory, "_DELETE_BATCH", 3)
    async with RedisMemoryService(redis_server.url, max_messages_per_session=10) as redis:
        await redis.add_memory(user_id, [msg(f"old {i}") for i in range(5)], session_id="s")
        await redis.add_memory(user_id, [msg(f"new {i}") for i in range(30)], session_id="s")
        kept = await redis.list_memory(user_id, {"page_size": 100})
        assert texts(kept) == [f"new {i}" for i in range(20, 30)]
        assert await redis.search_memory(user_id, [msg("old")]) == []
        found = await redis.search_memory(user_id, [msg("new")], {"top_k": 100})
        assert sorted(texts(found)) == sorted(texts(kept))


@pytest.mark.parametrize("refused", [0, -1, "5"])
def test_max_messages_per_session_must_be_a_whole_number_of_one_or_more(refused: Any) -> None:
    with pytest.raises(InvalidInputError, match="max_messages_per_session"):
        RedisMemoryService(max_messages_per_session=refused)


async def bucket_reads(
    redis_server: RedisServer, user_id: str, action: Callable[[], Awaitable[Any]]
) -> tuple[int, int]:
    """How many tails and pages of ``user_id``'s buckets, and how many memories' entries,
    the scripts run by ``action`` read (Redis shows the commands a script runs to MONITOR;
    the Redis is the test's own, so nothing else runs meanwhile)."""
    base = user_key_prefix("agentscope", "memory", user_id)
    fields = {f"{base}:bucket_ids": 0, f"{base}:entries": 0}
    async with (
        Redis.from_url(redis_server.url, decode_responses=True) as client,
        client.monitor() as monitor,
    ):
        await action()
        await client.echo("done")
        while (command := (await monitor.next_command())["command"]) != "ECHO done":
            name, *args = command.split(" ")
            if name in ("HGET", "HMGET") and args[0] in fields:
                fields[args[0]] += len(args) - 1
    return fields[f"{base}:bucket_ids"], fields[f"{base}:entries"]


async def assert_buckets_ascend(client: Redis, user_id: str) -> None:
    """Each bucket's ids ascend through its pages, each named after its first id, then its
    tail; each memory is in a bucket once."""
    base = user_key_prefix("agentscope", "memory", user_id)
    texts = await client.hgetall(f"{base}:bucket_ids")
    members = await client.zrange(f"{base}:buckets", 0, -1)
    assert sorted(members) == sorted(texts)
    pages: defaultdict[str, list[str]] = defaultdict(list)
    for member in sorted(members):  # a bucket, then its pages by first id
        bucket = "\0".join(member.split("\0")[:2])
        ids = [texts[member][at : at + 8] for at in range(0, len(texts[member]), 8)]
        if member != bucket:
            assert ids and ids[0] >= member.split("\0")[2], member
        pages[bucket] += ids if member != bucket else []
    for bucket, ids in pages.items():
        ids += [texts[bucket][at : at + 8] for at in range(0, len(texts[bucket]), 8)]
        assert ids == sorted(set(ids)), bucket


async def test_a_search_for_a_word_every_memory_holds_reads_only_the_newest(
    own_redis_server: RedisServer, user_id: str
) -> None:
    # 3,000 memories of the same length holding "common": they tie, and ties go to the
    # newest, so the top 10 are the 10 newest and no older one needs reading. The search
    # read every page of the word's bucket and scored all 3,000.
    memories = [msg(f"common note{n}") for n in range(3000)]
    reference = InMemoryMemoryService()
    async with reference, RedisMemoryService(own_redis_server.url) as redis:
        for service in (reference, redis):
            await service.add_memory(user_id, memories[:2000], session_id="bulk")
            for start in range(2000, 3000, 500):
                await service.add_memory(user_id, memories[start : start + 500])
        query = [msg("common")]
        found: list[Message] = []

        async def search() -> None:
            found.extend(await redis.search_memory(user_id, query, {"top_k": 10}))

        pages, entries = await bucket_reads(own_redis_server, user_id, search)
        assert [m.id for m in found] == [m.id for m in memories[:-11:-1]]
        assert [m.id for m in await reference.search_memory(user_id, query, {"top_k": 10})] == [
            m.id for m in found
        ]
        assert pages == 1  # its tail: the newest
        assert entries == 10


async def test_deleting_a_session_reads_only_the_pages_holding_its_memories(
    own_redis_server: RedisServer, user_id: str
) -> None:
    # 10 sessions of 256 memories sharing two words: each word's bucket has 10 pages. A
    # delete read (and rewrote) every page of every bucket it touched, for every batch.
    sessions = [[msg(f"common shared s{s} n{n % 3}") for n in range(256)] for s in range(10)]
    reference = InMemoryMemoryService()
    async with reference, RedisMemoryService(own_redis_server.url) as redis:
        for service in (reference, redis):
            for session, batch in enumerate(sessions):
                await service.add_memory(user_id, batch, session_id=f"s{session}")

        async def delete() -> None:
            await redis.delete_memory(user_id, "s4")

        pages, _ = await bucket_reads(own_redis_server, user_id, delete)
        await reference.delete_memory(user_id, "s4")
        # "common", "shared", "s4": each one's tail and the page of the session; the
        # "n<k>" words: their tails and the pages of the session.
        assert pages <= 3 * 2 + 3 * 3
        async with Redis.from_url(own_redis_server.url, decode_responses=True) as client:
            await assert_buckets_ascend(client, user_id)
        assert await listed(redis, user_id) == await listed(reference, user_id)
        rng = random.Random("delete")
        words = ["common", "shared", "n0", "n1", "n2", *(f"s{n}" for n in range(10))]
        await assert_same_rankings(
            reference, redis, user_id, rng, lambda rng, k: " ".join(rng.choices(words, k=k))
        )


async def test_memory_indexed_out_of_order_before_is_searched_and_deleted_exactly(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    # Earlier releases appended a bulk add's ids after those of adds made meanwhile: such
    # buckets do not ascend, and the user's statistics do not say they all do.
    sessions = [[msg(f"common shared s{s} n{n % 3}") for n in range(300)] for s in range(6)]
    reference = InMemoryMemoryService()
    base = user_key_prefix("agentscope", "memory", user_id)
    async with reference, RedisMemoryService(redis_server.url) as redis:
        for service in (reference, redis):
            for session, batch in enumerate(sessions):
                await service.add_memory(user_id, batch, session_id=f"s{session}")
        assert await redis_client.hdel(f"{base}:stats", "sorted") == 1
        members = await redis_client.zrange(f"{base}:buckets", 0, -1)
        texts = await redis_client.hgetall(f"{base}:bucket_ids")
        for bucket in [member for member in members if member.count("\0") == 1]:
            pages = sorted(member for member in members if member.startswith(f"{bucket}\0"))
            ids = "".join(texts[page] for page in [*pages, bucket])
            ids = ids[800:] + ids[:800]  # its oldest 100 ids after the others
            if pages:
                await redis_client.hdel(f"{base}:bucket_ids", *pages)
                await redis_client.zrem(f"{base}:buckets", *pages)
            cut = len(ids) - len(ids) % 2048
            for at in range(0, cut, 2048):
                page = f"{bucket}\0{ids[at : at + 8]}"
                await redis_client.hset(f"{base}:bucket_ids", page, ids[at : at + 2048])
                await redis_client.zadd(f"{base}:buckets", {page: 0})
            await redis_client.hset(f"{base}:bucket_ids", bucket, ids[cut:])
        rng = random.Random("out of order")
        words = ["common", "shared", "n0", "n1", "n2", *(f"s{n}" for n in range(6))]
        text = lambda rng, k: " ".join(rng.choices(words, k=k))  # noqa: E731
        await assert_same_rankings(reference, redis, user_id, rng, text)
        for service in (reference, redis):
            await service.delete_memory(user_id, "s0")
            await service.delete_memory(user_id, "s4")
        assert await listed(redis, user_id) == await listed(reference, user_id)
        await assert_same_rankings(reference, redis, user_id, rng, text)
        postings = sum(
            len(ids) for ids in (await redis_client.hgetall(f"{base}:bucket_ids")).values()
        )
        assert postings // 8 == 4 * 300 * 4
