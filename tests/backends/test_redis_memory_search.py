"""Redis memory search ranks exactly like the in-memory reference, pruning included."""

from __future__ import annotations

import random

import pytest

from agentscope_serverless.local_stack import RedisClusterServer, RedisServer
from agentscope_serverless.schemas.agent_schemas import Message, TextContent
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
