"""Redis memory search ranks exactly like the in-memory reference, pruning included."""

from __future__ import annotations

import random

import pytest
from redis.asyncio import Redis

from agentscope_serverless.errors import StoreUnavailableError
from agentscope_serverless.local_stack import RedisClusterServer, RedisServer
from agentscope_serverless.schemas.agent_schemas import Message, TextContent
from agentscope_serverless.services._redis import user_key_prefix
from agentscope_serverless.services.memory import InMemoryMemoryService, MemoryService
from agentscope_serverless.services.memory.redis import RedisMemoryService

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
    reference: MemoryService, redis: MemoryService, user_id: str, rng: random.Random
) -> None:
    for _ in range(150):
        query = [msg(" ".join(rng.choices(WORDS, WEIGHTS, k=rng.randint(1, 4))))]
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
