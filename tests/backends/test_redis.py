"""The Redis backends against a real redis-server: key layout, TTL, failures, injection."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from agentscope_serverless.errors import (
    ConfigurationError,
    InvalidInputError,
    StoreUnavailableError,
)
from agentscope_serverless.local_stack import RedisClusterServer, RedisServer
from agentscope_serverless.log import logger
from agentscope_serverless.recorder import RunRecorder
from agentscope_serverless.runner import Runner
from agentscope_serverless.schemas.agent_schemas import Message, TextContent
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services import _stored
from agentscope_serverless.services._once import seed_writes
from agentscope_serverless.services._redis import escape, user_key_prefix
from agentscope_serverless.services._validation import MAX_TTL_SECONDS
from agentscope_serverless.services.agent_state import redis as state_redis
from agentscope_serverless.services.agent_state.redis import RedisStateService
from agentscope_serverless.services.container import Services
from agentscope_serverless.services.idempotency.base import StoredResponse, now_ms
from agentscope_serverless.services.idempotency.redis import RedisIdempotencyStore
from agentscope_serverless.services.memory.redis import RedisMemoryService
from agentscope_serverless.services.runs.base import RunBurst, RunRecord
from agentscope_serverless.services.runs.redis import RedisRunsService
from agentscope_serverless.services.session_history import InMemorySessionHistoryService
from agentscope_serverless.services.session_history.redis import RedisSessionHistoryService
from agentscope_serverless.settings import load_settings


def msg(text: str) -> Message:
    return Message(role="user", content=[TextContent(text=text)])


async def user_keys(client: Redis, kind: str, user_id: str) -> list[str]:
    pattern = user_key_prefix("agentscope", kind, user_id).replace("{", "\\{").replace("}", "\\}")
    return sorted([key async for key in client.scan_iter(match=f"{pattern}:*")])


async def pttls(client: Redis, keys: list[str]) -> list[int]:
    return [await client.pttl(key) for key in keys]


# --- keys -----------------------------------------------------------------------------


@pytest.mark.parametrize("tricky", ["a:b", "{a}", "a}b{", "*", "a b", "ü%2F"])
def test_escaped_ids_keep_separators_and_hash_tags_out(tricky: str) -> None:
    escaped = escape(tricky)
    assert not set(escaped) & set(":{}*?[] ")
    prefix = user_key_prefix("agentscope", "session", tricky)
    assert prefix == f"agentscope:session:{{{escaped}}}"
    assert key_slot(f"{prefix}:x".encode()) == key_slot(escaped.encode())


async def test_every_key_of_a_user_shares_one_hash_slot(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    owner = f"{user_id}{{x}}:y"
    async with RedisSessionHistoryService(redis_server.url, ttl_seconds=60) as history:
        await history.append_message(Session(id="s{1}", user_id=owner), msg("hello"))
    async with RedisMemoryService(redis_server.url) as memory:
        await memory.add_memory(owner, [msg("fact")], session_id="s{1}")
    async with RedisStateService(redis_server.url) as state:
        await state.save_state(owner, {"v": 1}, session_id="s{1}")
    keys = [
        key
        for kind in ("session", "memory", "state")
        for key in await user_keys(redis_client, kind, owner)
    ]
    assert len(keys) >= 10
    assert len({key_slot(key.encode()) for key in keys}) == 1


async def test_erasing_a_user_leaves_no_key_of_theirs(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    services = [
        RedisSessionHistoryService(redis_server.url),
        RedisMemoryService(redis_server.url),
        RedisStateService(redis_server.url),
        RedisRunsService(redis_url=redis_server.url, ttl_seconds=60),
        RedisIdempotencyStore(redis_url=redis_server.url),
    ]
    history, memory, state, runs, records = services
    for service in services:
        await service.start()
    try:
        for session_id in ("s1", "a:b{c}*"):
            session = await history.create_session(user_id, session_id)
            hello = msg("hello")
            await history.append_message(session, [hello, msg("again"), msg("and again")])
            await history.delete_messages(user_id, session_id, [hello.id])
            await memory.add_memory(user_id, [msg("fact")], session_id=session_id)
            await state.save_state(user_id, {"v": 1}, session_id=session_id)
            record = RunRecord(id=f"run-{session_id}", user_id=user_id, session_id=session_id)
            await runs.record(record, [(0, "{}")], create=True)
            claim = await records.begin(user_id, f"key-{session_id}", "fingerprint")
            await records.complete(claim, StoredResponse(200, {}, b"the answer"))
            # A request that wrote in the session is listed under it too.
            claim = await records.begin(user_id, f"run-in-{session_id}", "fingerprint")
            await records.complete(claim, StoredResponse(200, {}, b"a run"), session_id)
        kinds = ("session", "memory", "state", "run", "idempotency")
        assert all([await user_keys(redis_client, kind, user_id) for kind in kinds])
        await runs.delete_user_runs(user_id)
        await memory.delete_user_memory(user_id)
        await state.delete_user_state(user_id)
        await history.delete_user_sessions(user_id)
        await records.delete_user_records(user_id)
        for kind in kinds:
            assert await user_keys(redis_client, kind, user_id) == [], kind
    finally:
        for service in services:
            await service.stop()


async def test_deleting_a_sessions_idempotency_records_leaves_no_listing_of_them(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    async with RedisIdempotencyStore(redis_url=redis_server.url) as records:
        for key in ("k1", "k2"):
            claim = await records.begin(user_id, key, "fingerprint")
            await records.complete(claim, StoredResponse(200, {}, b"a run"), "s1")
        await records.delete_session_records(user_id, "s1")
    assert await user_keys(redis_client, "idempotency", user_id) == []


async def test_the_index_of_a_users_idempotency_records_drops_expired_ones(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    index = f"{user_key_prefix('agentscope', 'idempotency', user_id)}:index"
    async with RedisIdempotencyStore(
        redis_url=redis_server.url, expiry_seconds=1, lease_seconds=1
    ) as records:
        await records.begin(user_id, "old", "fingerprint")
        await asyncio.sleep(1.1)  # the record expired (its request kept it for its lease)
        claim = await records.begin(user_id, "new", "fingerprint")
        await records.complete(claim, StoredResponse(200, {}, b""))
        assert await redis_client.zcard(index) == 1
        assert 0 < await redis_client.ttl(index) <= 1


# --- TTL ------------------------------------------------------------------------------


async def test_without_ttl_nothing_expires(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    async with RedisSessionHistoryService(redis_server.url) as history:
        await history.append_message(Session(id="s1", user_id=user_id), msg("hello"))
    async with RedisMemoryService(redis_server.url) as memory:
        await memory.add_memory(user_id, [msg("a fact")])
        await memory.search_memory(user_id, [msg("fact")])
    async with RedisStateService(redis_server.url) as state:
        await state.save_state(user_id, {"v": 1})
    for kind in ("session", "memory", "state"):
        keys = await user_keys(redis_client, kind, user_id)
        assert keys
        assert await pttls(redis_client, keys) == [-1] * len(keys)


async def test_session_ttl_slides_on_reads_and_writes(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    async with RedisSessionHistoryService(redis_server.url, ttl_seconds=100) as history:
        session = await history.create_session(user_id, "s1")
        await history.append_message(session, msg("hello"))
        keys = await user_keys(redis_client, "session", user_id)
        # index, expiry, counter and its generation, meta, messages, message ids
        assert len(keys) == 7
        assert all(90_000 < ttl <= 100_000 for ttl in await pttls(redis_client, keys))

        for key in keys:
            await redis_client.pexpire(key, 5_000)
        assert await history.get_session(user_id, "s1") is not None
        assert all(ttl > 90_000 for ttl in await pttls(redis_client, keys))

        for key in keys:
            await redis_client.pexpire(key, 5_000)
        await history.append_message(session, msg("again"))
        assert all(ttl > 90_000 for ttl in await pttls(redis_client, keys))


async def test_listing_sessions_slides_the_expiry_of_those_listed(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    async with RedisSessionHistoryService(redis_server.url, ttl_seconds=100) as history:
        for session_id in ("s1", "s2"):
            session = await history.create_session(user_id, session_id)
            await history.append_message(session, msg("hello"))
        keys = await user_keys(redis_client, "session", user_id)
        # index, expiry, counter and its generation, and meta, messages, ids of each
        assert len(keys) == 10
        (expiry,) = [key for key in keys if key.endswith(":expiry")]

        async def soon() -> None:
            """Every key, and every session's entry in the expiry index, due in 5 s."""
            for key in keys:
                await redis_client.pexpire(key, 5_000)
            due = int(time.time() * 1000) + 5_000
            await redis_client.zadd(expiry, {"s1": due, "s2": due})

        def slid(ttl_ms: float) -> bool:
            return ttl_ms > 90_000

        await soon()
        await history.list_sessions(user_id)
        assert all(slid(ttl) for ttl in await pttls(redis_client, keys))
        scores = await redis_client.zrange(expiry, 0, -1, withscores=True)
        assert all(slid(score - time.time() * 1000) for _, score in scores)

        await soon()
        await history.list_sessions_page(user_id, limit=1)  # s1 alone
        ttls = dict(zip(keys, await pttls(redis_client, keys), strict=True))
        assert [key for key in keys if slid(ttls[key])] == [k for k in keys if ":s:s2:" not in k]
        scores = dict(await redis_client.zrange(expiry, 0, -1, withscores=True))
        assert slid(scores["s1"] - time.time() * 1000)
        assert not slid(scores["s2"] - time.time() * 1000)


async def test_an_expired_session_is_gone_everywhere(
    redis_server: RedisServer, user_id: str
) -> None:
    async with RedisSessionHistoryService(redis_server.url, ttl_seconds=1) as history:
        await history.append_message(Session(id="old", user_id=user_id), msg("bye"))
        await asyncio.sleep(1.2)
        await history.create_session(user_id, "new")
        assert await history.get_session(user_id, "old") is None
        assert [s.id for s in await history.list_sessions(user_id)] == ["new"]
        again = await history.create_session(user_id, "old")
        assert again.messages == []


async def test_a_sessions_cursor_read_before_the_sessions_expired_passes_over_none(
    redis_server: RedisServer, user_id: str
) -> None:
    # The cursor held a creation order, whose counter expired with the user's sessions:
    # the sessions made after got the orders of those expired, and the cursor passed over
    # the first of them.
    async with RedisSessionHistoryService(redis_server.url, ttl_seconds=1) as history:
        for i in range(3):
            await history.create_session(user_id, f"old{i}")
        cursor = (await history.list_sessions_page(user_id, limit=2)).next_cursor
        await asyncio.sleep(1.2)
        for i in range(3):
            await history.create_session(user_id, f"new{i}")
        with pytest.raises(InvalidInputError, match="erased or expired"):
            await history.list_sessions_page(user_id, cursor=cursor)
        assert [s.id for s in await history.list_sessions(user_id)] == ["new0", "new1", "new2"]


async def test_a_sessions_cursor_of_a_counter_stored_without_a_generation_works(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    # A counter started before counters kept a generation lists as before, its cursors
    # (which name none) too, until the user's data is erased.
    async with RedisSessionHistoryService(redis_server.url) as history:
        for i in range(3):
            await history.create_session(user_id, f"s{i}")
        generation = f"{user_key_prefix('agentscope', 'session', user_id)}:generation"
        assert await redis_client.delete(generation) == 1
        cursor = (await history.list_sessions_page(user_id, limit=2)).next_cursor
        await history.create_session(user_id, "s3")
        page = await history.list_sessions_page(user_id, cursor=cursor)
        assert [s.id for s in page.items] == ["s2", "s3"]
        await history.delete_user_sessions(user_id)
        for i in range(3):
            await history.create_session(user_id, f"new{i}")
        with pytest.raises(InvalidInputError, match="erased or expired"):
            await history.list_sessions_page(user_id, cursor=cursor)


async def test_a_messages_cursor_of_an_expired_session_pages_no_later_one_of_its_id(
    redis_server: RedisServer, user_id: str
) -> None:
    # The cursor named its session by its creation order, whose counter expired with the
    # user's sessions: the session made again got the same order, and the cursor paged it.
    async with RedisSessionHistoryService(redis_server.url, ttl_seconds=1) as history:
        old = [Message(id=f"m{i}", role="user", content=f"old{i}") for i in range(6)]
        await history.append_message(Session(id="s", user_id=user_id), old)
        cursor = (await history.list_messages(user_id, "s", limit=3)).next_cursor
        await asyncio.sleep(1.2)
        new = [Message(id=f"m{i}", role="user", content=f"new{i}") for i in range(6)]
        await history.append_message(Session(id="s", user_id=user_id), new)
        with pytest.raises(InvalidInputError, match="an earlier session of this id"):
            await history.list_messages(user_id, "s", cursor=cursor)


async def test_a_messages_cursor_of_a_session_stored_without_a_generation_works(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    # Sessions stored before sessions kept a generation are named by their creation order.
    async with RedisSessionHistoryService(redis_server.url) as history:
        messages = [Message(id=f"m{i}", role="user", content=f"m{i}") for i in range(6)]
        await history.append_message(Session(id="s", user_id=user_id), messages)
        meta = f"{user_key_prefix('agentscope', 'session', user_id)}:s:s:meta"
        assert await redis_client.hdel(meta, "generation") == 1
        cursor = (await history.list_messages(user_id, "s", limit=3)).next_cursor
        page = await history.list_messages(user_id, "s", cursor=cursor)
        assert [m.id for m in page.items] == ["m3", "m4", "m5"]
        await history.delete_session(user_id, "s")
        await history.append_message(Session(id="s", user_id=user_id), messages)
        with pytest.raises(InvalidInputError, match="an earlier session of this id"):
            await history.list_messages(user_id, "s", cursor=cursor)


async def test_memory_ttl_is_opt_in_and_slides(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    async with RedisMemoryService(redis_server.url, ttl_seconds=100) as memory:
        await memory.add_memory(user_id, [msg("green tea")])
        keys = await user_keys(redis_client, "memory", user_id)
        assert len(keys) == 7
        for key in keys:
            await redis_client.pexpire(key, 5_000)
        assert len(await memory.search_memory(user_id, [msg("tea")])) == 1
        assert all(ttl > 90_000 for ttl in await pttls(redis_client, keys))


async def test_state_ttl_slides_on_reads(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    async with RedisStateService(redis_server.url, ttl_seconds=100) as state:
        await state.save_state(user_id, {"v": 1})
        keys = await user_keys(redis_client, "state", user_id)
        assert len(keys) == 3  # rounds, states and the user's index
        for key in keys:
            await redis_client.pexpire(key, 5_000)
        assert await state.export_state(user_id) == {"v": 1}
        assert all(ttl > 90_000 for ttl in await pttls(redis_client, keys))


async def test_a_round_stored_corrupt_reads_as_none_and_is_logged_without_its_data(
    redis_server: RedisServer,
    redis_client: Redis,
    user_id: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # As AgentScope Runtime's RedisStateService: corrupt data gives None (it raised
    # json.JSONDecodeError).
    async with RedisStateService(redis_server.url) as state:
        await state.save_state(user_id, {"v": 1}, session_id="c")
        await state.save_state(user_id, {"v": 2}, session_id="c")
        (rounds,) = [k for k in await user_keys(redis_client, "state", user_id) if "states" in k]
        await redis_client.hset(rounds, "2", '{"secret-data": ')
        level = logger.level
        logger.setLevel("WARNING")  # the tests log nothing below CRITICAL
        try:
            capsys.readouterr()
            assert await state.export_state(user_id, session_id="c") is None
            assert await state.export_state(user_id, session_id="c", round_id=2) is None
            assert await state.export_latest_state(user_id, session_id="c") is None
        finally:
            logger.setLevel(level)
        assert await state.export_state(user_id, session_id="c", round_id=1) == {"v": 1}
    logged = capsys.readouterr().out
    assert "not a JSON object" in logged and "secret-data" not in logged


@pytest.mark.parametrize("ttl_seconds", [None, 100])
async def test_keyed_state_saves_forget_their_write_ids_once_past(
    redis_server: RedisServer,
    redis_client: Redis,
    user_id: str,
    monkeypatch: pytest.MonkeyPatch,
    ttl_seconds: int | None,
) -> None:
    # Every keyed save added a write id to the session's `applied` hash, which nothing
    # removed and which had no expiry (or that of the state): it grew with every save.
    days = {"passed": 0}
    day_ms = 24 * 3600 * 1000
    monkeypatch.setattr(state_redis, "now_ms", lambda: now_ms() + days["passed"] * day_ms)
    base = f"{user_key_prefix('agentscope', 'state', user_id)}:s:daily"
    applied, until = f"{base}:applied", f"{base}:applied_until"
    async with RedisStateService(redis_server.url, ttl_seconds=ttl_seconds) as state:
        for day in range(0, 8, 2):
            days["passed"] = day
            seed_writes(f"{user_id}\0save on day {day}")
            assert await state.save_state(user_id, {"day": day}, session_id="daily") == day // 2 + 1
            # Only the last save's id is remembered (the others were remembered a day).
            assert len(await redis_client.hgetall(applied)) == 1
            assert await redis_client.zcard(until) == 1
        # A save run again within its day gets its round back, as before.
        seed_writes(f"{user_id}\0save on day 6")
        assert await state.save_state(user_id, {"day": 6}, session_id="daily") == 4
        # Both keys expire with the last id remembered, whatever the state's TTL: reading
        # the state does not shorten it.
        days["passed"] = 0
        seed_writes(f"{user_id}\0save now")
        await state.save_state(user_id, {"now": True}, session_id="daily")
        assert await state.export_state(user_id, session_id="daily") == {"now": True}
        for key in (applied, until):
            assert 6 * day_ms < await redis_client.pttl(key) <= 7 * day_ms
        await state.delete_state(user_id, "daily")
    assert await user_keys(redis_client, "state", user_id) == []


async def test_the_longest_ttl_works_and_a_longer_one_is_refused_at_once(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    # A "never" of 10**16 seconds was taken, then every call failed as if Redis were down.
    url = redis_server.url
    history = RedisSessionHistoryService(url, ttl_seconds=MAX_TTL_SECONDS)
    state = RedisStateService(url, ttl_seconds=MAX_TTL_SECONDS)
    memory = RedisMemoryService(url, ttl_seconds=MAX_TTL_SECONDS)
    runs = RedisRunsService(url, ttl_seconds=MAX_TTL_SECONDS)
    async with history, state, memory, runs:
        session = await history.create_session(user_id, "s1")
        await history.append_message(session, msg("green tea"))
        stored = await history.get_session(user_id, "s1")
        assert stored is not None and len(stored.messages) == 1
        await state.save_state(user_id, {"v": 1})
        assert await state.export_state(user_id) == {"v": 1}
        await memory.add_memory(user_id, [msg("green tea")])
        assert len(await memory.search_memory(user_id, [msg("tea")])) == 1
        await runs.create_run(RunRecord(id="r1", user_id=user_id, session_id="s1"))
        assert await runs.get_run(user_id, "r1") is not None
    keys = await user_keys(redis_client, "session", user_id)
    assert all(ttl > (MAX_TTL_SECONDS - 60) * 1000 for ttl in await pttls(redis_client, keys))
    for service in (RedisSessionHistoryService, RedisStateService, RedisMemoryService):
        with pytest.raises(InvalidInputError, match="ttl_seconds must be at most"):
            service(url, ttl_seconds=MAX_TTL_SECONDS + 1)
    with pytest.raises(InvalidInputError, match="ttl_seconds must be at most"):
        RedisRunsService(url, ttl_seconds=10**16)


# --- limits and layout ----------------------------------------------------------------


async def test_a_user_with_thousands_of_sessions_and_states_is_erased(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    # Their keys went to DEL in one Lua unpack, which takes about 8,000 values: the erase
    # failed as if Redis were down, for good (in memory and on DynamoDB it went through).
    async with (
        RedisSessionHistoryService(redis_server.url) as history,
        RedisStateService(redis_server.url) as state,
    ):
        await asyncio.gather(*(history.create_session(user_id, f"s{i}") for i in range(2100)))
        await asyncio.gather(
            *(state.save_state(user_id, {"i": i}, session_id=f"s{i}") for i in range(2700))
        )
        await history.delete_user_sessions(user_id)
        await state.delete_user_state(user_id)
        assert await history.list_sessions(user_id) == []
        assert await state.export_state(user_id, session_id="s2699") is None
    assert await user_keys(redis_client, "session", user_id) == []
    assert await user_keys(redis_client, "state", user_id) == []


async def test_max_messages_keeps_the_newest_and_pages_stay_consistent(
    redis_server: RedisServer, user_id: str
) -> None:
    async with RedisSessionHistoryService(redis_server.url, max_messages_per_session=3) as history:
        session = await history.create_session(user_id, "s1")
        first_page = await history.list_messages(user_id, "s1", limit=2)
        await history.append_message(session, [msg(f"m{i}") for i in range(5)])
        stored = await history.get_session(user_id, "s1")
        assert stored is not None
        assert [m.get_text_content() for m in stored.messages] == ["m2", "m3", "m4"]  # type: ignore[union-attr]
        page = await history.list_messages(user_id, "s1", limit=2)
        assert [m.get_text_content() for m in page.items] == ["m2", "m3"]
        assert page.next_cursor is not None
        rest = await history.list_messages(user_id, "s1", limit=2, cursor=page.next_cursor)
        assert [m.get_text_content() for m in rest.items] == ["m4"]
        assert rest.next_cursor is None
        assert first_page.items == []


async def test_a_session_kept_to_n_messages_keeps_n_message_ids(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    ids = f"{user_key_prefix('agentscope', 'session', user_id)}:s:s1:ids"

    def numbered(first: int, count: int) -> list[Message]:
        return [
            Message(id=f"m{i}", role="user", content=f"m{i}") for i in range(first, first + count)
        ]

    async with RedisSessionHistoryService(redis_server.url) as unlimited:
        session = await unlimited.create_session(user_id, "s1")
        await unlimited.append_message(session, numbered(0, 4))  # before the limit was set
    async with RedisSessionHistoryService(redis_server.url, max_messages_per_session=3) as history:
        for first in range(4, 50, 5):
            await history.append_message(session, numbered(first, 5))
        # A retry of recent messages stores nothing twice.
        await history.append_message(session, numbered(51, 3))
        stored = await history.get_session(user_id, "s1")
        assert stored is not None
        assert [m.id for m in stored.messages] == ["m51", "m52", "m53"]
        assert sorted(await redis_client.hkeys(ids)) == [
            "m0",
            "m1",
            "m2",
            "m3",
            "m51",
            "m52",
            "m53",
        ]
        assert await redis_client.lrange(f"{ids}:order", 0, -1) == ["m51", "m52", "m53"]
        await history.delete_session(user_id, "s1")
        assert await redis_client.exists(ids, f"{ids}:order") == 0


async def test_appending_is_one_push_not_a_rewrite(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    async with RedisSessionHistoryService(redis_server.url) as history:
        session = await history.create_session(user_id, "s1")
        await history.append_message(session, [msg(f"m{i}") for i in range(3)])
    base = user_key_prefix("agentscope", "session", user_id)
    stored = await redis_client.lrange(f"{base}:s:s1:messages", 0, -1)
    assert [Message.model_validate_json(m).get_text_content() for m in stored] == ["m0", "m1", "m2"]
    assert await redis_client.zrange(f"{base}:sessions", 0, -1) == ["s1"]


async def test_a_prepared_append_adds_to_the_session_object_what_it_does_not_hold(
    redis_server: RedisServer, user_id: str
) -> None:
    # As append_message: a retry of it (a turn stored with its run) added its messages to
    # the object again.
    async with RedisSessionHistoryService(redis_server.url) as history:
        session = await history.create_session(user_id, "s1")
        hello = msg("hello")
        for _ in range(2):
            prepared = history.prepare_append(session, [hello, hello])
            assert prepared is not None
            await prepared.apply()
        assert [m.id for m in session.messages] == [hello.id]  # type: ignore[union-attr]
        stored = await history.get_session(user_id, "s1")
        assert stored is not None
        assert [m.id for m in stored.messages] == [hello.id]  # type: ignore[union-attr]


@pytest.mark.parametrize("ttl_seconds", [None, 60])
async def test_reading_a_session_decodes_its_messages_only_when_they_are_used(
    redis_server: RedisServer,
    user_id: str,
    monkeypatch: pytest.MonkeyPatch,
    ttl_seconds: int | None,
) -> None:
    decoded: list[int] = []
    decode = _stored.decode_messages

    def counting(raws: list[bytes], **options: Any) -> list[Message]:
        decoded.append(len(raws))
        return decode(raws, **options)

    monkeypatch.setattr(_stored, "decode_messages", counting)
    async with RedisSessionHistoryService(redis_server.url, ttl_seconds=ttl_seconds) as history:
        session = await history.create_session(user_id, "s1")
        await history.append_message(session, [msg(f"m{i}") for i in range(3)])
        decoded.clear()
        read = await history.get_session(user_id, "s1")
        opened = await history.open_session(user_id, "s1", recent=2)
        assert read is not None
        assert decoded == []
        assert [m.get_text_content() for m in read.messages] == ["m0", "m1", "m2"]  # type: ignore[union-attr]
        assert [m.get_text_content() for m in opened.messages] == ["m1", "m2"]  # type: ignore[union-attr]
        assert decoded == [3, 2]
        assert await history.get_session(user_id, "missing") is None


async def test_deleting_memory_updates_the_index_and_its_statistics(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    base = user_key_prefix("agentscope", "memory", user_id)
    async with RedisMemoryService(redis_server.url) as memory:
        await memory.add_memory(user_id, [msg("alpha beta"), msg("beta")], session_id="s1")
        await memory.add_memory(user_id, [msg("gamma gamma delta")], session_id="s2")
        assert await redis_client.hgetall(f"{base}:stats") == {
            "seq": "3",
            "docs": "3",
            "length": "6",
            "sorted": "1",  # every bucket's ids ascend (search may cut ties)
        }
        await memory.delete_memory(user_id, "s1")
        assert await redis_client.hmget(f"{base}:stats", "docs", "length") == ["1", "3"]
        buckets = await redis_client.zrange(f"{base}:buckets", 0, -1)
        assert sorted(b.split("\0")[0] for b in buckets) == ["delta", "gamma"]
        assert await redis_client.hlen(f"{base}:bucket_ids") == 2
        assert await redis_client.hlen(f"{base}:entries") == 1
        await memory.delete_memory(user_id)
    assert await user_keys(redis_client, "memory", user_id) == []


# --- connections ----------------------------------------------------------------------


async def test_an_injected_client_is_used_and_left_open(
    redis_server: RedisServer, user_id: str
) -> None:
    client = Redis.from_url(redis_server.url)
    service = RedisSessionHistoryService(redis_client=client)
    async with service:
        await service.create_session(user_id, "s1")
    assert await client.ping() is True
    assert await client.exists(f"{user_key_prefix('agentscope', 'session', user_id)}:s:s1:meta")
    await client.aclose()


async def test_a_stopped_redis_makes_calls_fail_and_a_restarted_one_works_again(
    own_redis_server: RedisServer, user_id: str
) -> None:
    history = RedisSessionHistoryService(own_redis_server.url, socket_connect_timeout=1.0)
    memory = RedisMemoryService(own_redis_server.url, socket_connect_timeout=1.0)
    state = RedisStateService(own_redis_server.url, socket_connect_timeout=1.0)
    async with history, memory, state:
        await history.create_session(user_id, "s1")
        own_redis_server.stop()
        assert await history.health() is False
        assert await memory.health() is False
        assert await state.health() is False
        calls = [
            history.get_session(user_id, "s1"),
            history.append_message(Session(id="s1", user_id=user_id), msg("x")),
            history.list_sessions(user_id),
            memory.add_memory(user_id, [msg("x")]),
            memory.search_memory(user_id, [msg("x")]),
            state.save_state(user_id, {"v": 1}),
            state.export_state(user_id),
        ]
        for call in calls:
            with pytest.raises(StoreUnavailableError) as raised:
                await call
            assert raised.value.store == "redis"

        own_redis_server.start()
        assert await history.health() is True
        session = await history.create_session(user_id, "s2")
        await history.append_message(session, msg("back"))
        assert len((await history.get_session(user_id, "s2")).messages) == 1  # type: ignore[union-attr]
        await memory.add_memory(user_id, [msg("back again")])
        assert len(await memory.search_memory(user_id, [msg("again")])) == 1
        assert await state.save_state(user_id, {"v": 2}) == 1


async def test_a_restarted_redis_reads_as_healthy_at_once(
    own_redis_server: RedisServer, user_id: str
) -> None:
    # No call between the stop and the restart: the health check is the first to find the
    # connection lost, and makes it again as a call would (it read the store as down once).
    history = RedisSessionHistoryService(own_redis_server.url, socket_connect_timeout=1.0)
    async with history:
        await history.create_session(user_id, "s1")
        assert await history.health() is True
        own_redis_server.stop()
        own_redis_server.start()
        assert await history.health() is True
        await history.create_session(user_id, "s2")


async def test_a_cluster_with_a_primary_down_fails_only_its_users_and_reads_as_unhealthy(
    user_id: str,
) -> None:
    # A third of the users' keys are on each primary. With one down, only its users' calls
    # may fail: the others' reads in a transaction failed too, with "Event loop is closed"
    # (a 500), and a PING that reached another node alone read the cluster as healthy.
    with RedisClusterServer() as cluster:
        history = RedisSessionHistoryService(
            cluster.url, cluster=True, socket_connect_timeout=1.0, socket_timeout=2.0
        )
        async with history:
            users = [f"{user_id}-{index}" for index in range(12)]
            for user in users:
                await history.create_session(user, "s1")
            assert await history.health() is True
            down = cluster.nodes[1]
            down.stop()
            assert await history.health() is False

            async def failing(call: Any) -> set[str]:
                failed = set()
                for user in users:
                    try:
                        await call(user)
                    except StoreUnavailableError:
                        failed.add(user)
                return failed

            writes = await failing(lambda user: history.create_session(user, "s2"))  # scripts
            reads = await failing(lambda user: history.get_session(user, "s1"))  # MULTI
            assert writes == reads and 0 < len(reads) < len(users)
            down.start()  # its cluster configuration kept: it serves its slots again
            deadline = time.monotonic() + 30
            while "cluster_state:ok" not in down.cli("CLUSTER", "INFO"):
                assert time.monotonic() < deadline, "the cluster did not recover"
                await asyncio.sleep(0.1)
            assert await history.health() is True
            for user in users:
                await history.create_session(user, "s3")
                assert await history.get_session(user, "s3") is not None


@pytest.fixture
def unix_socket_redis(tmp_path: Path) -> Iterator[Path]:
    """A redis-server listening on a Unix socket only; yields the socket's path."""
    socket = tmp_path / "redis.sock"
    server = subprocess.Popen(
        ["redis-server", "--port", "0", "--unixsocket", str(socket), "--save", ""],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not socket.exists():
            assert server.poll() is None and time.monotonic() < deadline, "redis did not start"
            time.sleep(0.05)
        yield socket
    finally:
        server.terminate()
        server.wait(timeout=10)


async def test_a_redis_on_a_unix_socket_is_reached(unix_socket_redis: Path, user_id: str) -> None:
    async with RedisSessionHistoryService(f"unix://{unix_socket_redis}?db=0") as history:
        assert await history.health() is True
        session = await history.create_session(user_id, "s1")
        await history.append_message(session, msg("over a unix socket"))
        assert len((await history.get_session(user_id, "s1")).messages) == 1  # type: ignore[union-attr]


async def test_a_redis_url_that_is_not_a_url_is_refused_without_showing_it() -> None:
    with pytest.raises(ConfigurationError) as raised:
        RedisSessionHistoryService("redis://:Wq7z-Pa55@[::1:6379/0")
    assert "REDIS_URL" in str(raised.value) and "Pa55" not in str(raised.value)


async def test_errors_never_carry_the_password(user_id: str) -> None:
    with RedisServer(password="s3cret-Pa55") as server:
        wrong = server.url.replace("s3cret-Pa55", "wr0ng-Pa55")
        for service in (
            RedisSessionHistoryService(wrong),
            RedisSessionHistoryService(server.url.replace(":s3cret-Pa55@", ""), password="x9-Pa55"),
        ):
            async with service:
                assert await service.health() is False
                with pytest.raises(StoreUnavailableError) as raised:
                    await service.create_session(user_id, "s1")
                assert "Pa55" not in str(raised.value)

        async with RedisSessionHistoryService(server.url) as history:
            await history.create_session(user_id, "s1")
            server.stop()
            with pytest.raises(StoreUnavailableError) as raised:
                await history.get_session(user_id, "s1")
            assert "s3cret" not in str(raised.value) and "s3cret" not in repr(raised.value)


async def test_a_rediss_url_talks_tls(user_id: str) -> None:
    with RedisServer(tls=True, password="tls-secret") as server:
        assert server.url.startswith("rediss://")
        async with RedisSessionHistoryService(server.url) as history:
            assert await history.health() is True
            session = await history.create_session(user_id, "s1")
            await history.append_message(session, msg("over tls"))
            assert len((await history.get_session(user_id, "s1")).messages) == 1  # type: ignore[union-attr]
        plain = server.url.replace("rediss://", "redis://").partition("?")[0]
        async with RedisSessionHistoryService(plain, socket_timeout=1.0) as history:
            assert await history.health() is False


async def test_a_password_given_apart_from_the_url_authenticates(user_id: str) -> None:
    with RedisServer(password="apart-secret") as server:
        url = server.url.replace(":apart-secret@", "")
        async with RedisStateService(url, password="apart-secret") as state:
            assert await state.health() is True
            assert await state.save_state(user_id, {"v": 1}) == 1


async def test_bursts_of_several_runs_are_written_after_redis_lost_its_scripts(
    redis_server: RedisServer,
) -> None:
    def burst(run_id: str) -> RunBurst:
        record = RunRecord(id=run_id, user_id="alice", status="completed")
        return RunBurst(record, [(0, '{"sequence_number":0}')], create=True, finish=True)

    async with RedisRunsService(redis_url=redis_server.url) as runs:
        assert await runs.record_many([burst("r1"), burst("r2")]) == [False, False]
        client = Redis.from_url(redis_server.url)
        try:
            await client.script_flush()  # as after a restart: the loaded script is gone
        finally:
            await client.aclose()
        assert await runs.record_many([burst("r3"), burst("r4")]) == [False, False]
        for run_id in ("r1", "r2", "r3", "r4"):
            stored = await runs.get_run("alice", run_id)
            assert stored is not None and stored.status == "completed"
            assert await runs.read_events("alice", run_id) == [(0, '{"sequence_number":0}')]


async def test_run_events_written_one_entry_each_by_an_earlier_release_are_read(
    redis_server: RedisServer, redis_client: Redis
) -> None:
    async with RedisRunsService(redis_url=redis_server.url) as runs:
        await runs.create_run(RunRecord(id="old", user_id="alice"))
        events_key = f"{user_key_prefix('agentscope', 'run', 'alice')}:r:old:events"
        for sequence in range(3):  # the earlier layout: entry 0-<seq + 1>, field d
            await redis_client.xadd(
                events_key, {"d": f'{{"n":{sequence}}}'}, id=f"0-{sequence + 1}"
            )
        await runs.append_events("alice", "old", [(2, '{"n":2}'), (3, '{"n":3}')])
        assert await runs.read_events("alice", "old", after=0) == [
            (1, '{"n":1}'),
            (2, '{"n":2}'),
            (3, '{"n":3}'),
        ]
        assert await redis_client.xlen(events_key) == 4  # the new write is one entry


async def test_a_run_stored_in_one_write_keeps_its_events_in_its_hash(
    redis_server: RedisServer, redis_client: Redis
) -> None:
    # Our JSON never holds "\n", but may hold other line breaks as they are.
    events = [(0, '{"n":0}'), (1, '{"text":"a\u2028b\x85c\x1cd\rr"}'), (2, '{"n":2}')]
    foreign = [(0, '{\n"n": 0\n}'), (1, '{"n":1}')]  # JSON with line breaks, from elsewhere
    base = user_key_prefix("agentscope", "run", "alice")
    async with RedisRunsService(redis_url=redis_server.url) as runs:
        whole = RunRecord(id="whole", user_id="alice", session_id="s", status="completed")
        other = RunRecord(id="other", user_id="alice", session_id="s", status="completed")
        bursts = [RunBurst(whole, events, True, True), RunBurst(other, foreign, True, True)]
        assert await runs.record_many(bursts) == [False, False]
        assert await redis_client.exists(f"{base}:r:whole:events") == 0
        assert await runs.read_events("alice", "whole") == events
        assert await runs.read_events("alice", "whole", after=0, limit=1) == events[1:2]
        assert [event async for event in runs.follow("alice", "whole", after=1)] == events[2:]
        assert await redis_client.exists(f"{base}:r:other:events") == 1
        assert await runs.read_events("alice", "other") == foreign
        assert [run.id for run in await runs.list_runs("alice", "s")] == ["whole", "other"]


async def test_the_index_of_a_users_runs_drops_runs_long_expired(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    index = f"{user_key_prefix('agentscope', 'run', user_id)}:all"
    long_ago = time.time() - 100  # more than twice the expiry: the run is gone
    async with RedisRunsService(redis_url=redis_server.url, ttl_seconds=30) as runs:
        # Created long ago, and written since: a run still going is kept.
        going = RunRecord(id="going", user_id=user_id, created_at=long_ago)
        await runs.create_run(going)
        await runs.create_run(RunRecord(id="old", user_id=user_id))
        await redis_client.zadd(index, {"old": long_ago})  # last written long ago
        await runs.create_run(RunRecord(id="new", user_id=user_id))
        assert await redis_client.zrange(index, 0, -1) == ["going", "new"]
        old = RunRecord(id="old-whole", user_id=user_id, status="completed")
        await runs.record(old, [(0, "{}")], create=True, finish=True)
        await redis_client.zadd(index, {"old-whole": long_ago})
        whole = RunRecord(id="whole", user_id=user_id, status="completed")
        await runs.record(whole, [(0, "{}")], create=True, finish=True)
        assert await redis_client.zrange(index, 0, -1) == ["going", "new", "whole"]
        assert 0 < await redis_client.ttl(index) <= 30
        await runs.delete_user_runs(user_id)
        assert await redis_client.exists(index) == 0
        assert await runs.get_run(user_id, "new") is None
        assert await runs.get_run(user_id, "whole") is None


@pytest.mark.parametrize(
    "url",
    [
        "redis://:Wq7z/Pa55-tail@127.0.0.1:6379/0",
        "redis://default:Wq7z#Pa55-tail@127.0.0.1:6379/0",
        "redis://default:Wq7z?Pa55-tail@127.0.0.1:6379/0",
        "redis://Wq7z/Pa55-tail@127.0.0.1:6379/0",
    ],
)
async def test_a_password_that_ends_the_address_early_is_refused_without_showing_it(
    url: str,
) -> None:
    # An unencoded '/', '#' or '?' ends the URL's address: what precedes it is read as a
    # host or a port, and a parser or connection error would quote it.
    with pytest.raises(ConfigurationError) as raised:
        async with RedisSessionHistoryService(url) as history:
            await history.create_session("alice", "s1")
    message = str(raised.value)
    assert "REDIS_URL" in message and "percent-encode" in message
    assert "Wq7z" not in message and "Pa55" not in message


async def _refusing_writes(url: str, refuse: bool) -> None:
    """Make ``url``'s Redis refuse every write (out of memory), or accept them again."""
    client = Redis.from_url(url)
    try:
        await client.config_set("maxmemory", 1 if refuse else 0)
    finally:
        await client.aclose()


async def _refused_writes(url: str) -> int:
    client = Redis.from_url(url)
    try:
        return int((await client.info("errorstats")).get("errorstat_OOM", {}).get("count", 0))
    finally:
        await client.aclose()


async def test_a_redis_out_of_memory_says_so_and_reads_as_down_while_it_refuses_writes(
    own_redis_server: RedisServer, user_id: str
) -> None:
    # It answered PING, so /health said all was well while every write was a 503 saying
    # only "the command failed".
    async with RedisSessionHistoryService(own_redis_server.url) as history:
        await history.create_session(user_id, "s1")
        assert await history.health()
        await _refusing_writes(own_redis_server.url, True)
        try:
            with pytest.raises(StoreUnavailableError) as raised:
                await history.create_session(user_id, "s2")
            assert not await history.health()
        finally:
            await _refusing_writes(own_redis_server.url, False)
        assert str(raised.value) == (
            "redis is unavailable: it is out of memory (maxmemory reached, with no "
            "eviction): it refuses writes"
        )
        assert await history.health()
        await history.create_session(user_id, "s2")


async def test_a_wrong_redis_password_says_authentication_failed_never_the_password(
    capfd: pytest.CaptureFixture[str], user_id: str
) -> None:
    level = logger.level
    logger.setLevel("WARNING")  # the tests log nothing below CRITICAL
    with contextlib.ExitStack() as stack:
        stack.callback(logger.setLevel, level)
        redis = stack.enter_context(RedisServer(password="Sup3r-Secret-Pa55"))
        wrong = RedisServer(password="Wr0ng-Pa55", port=redis.port).url  # only for its URL
        async with RedisSessionHistoryService(wrong) as history:
            with pytest.raises(StoreUnavailableError) as raised:
                await history.create_session(user_id, "s1")
            assert not await history.health()
    message = str(raised.value)
    assert message == (
        "redis is unavailable: authentication failed: Redis refuses the password of "
        "REDIS_URL (the redis_url of the stack's secret)"
    )
    out, err = capfd.readouterr()
    assert "redis command failed" in out
    assert "Pa55" not in message + out + err


async def test_a_database_redis_does_not_have_is_named_as_redis_urls(
    redis_server: RedisServer, user_id: str
) -> None:
    # It said only "the command failed": nothing pointed at the /99 of REDIS_URL.
    url = redis_server.url.rsplit("/", 1)[0] + "/99"
    async with RedisSessionHistoryService(url) as history:
        with pytest.raises(StoreUnavailableError) as raised:
            await history.create_session(user_id, "s1")
    assert str(raised.value) == (
        "redis is unavailable: REDIS_URL names a database Redis does not have (the number "
        "after the host's /: 0 to 15 on a Redis as it comes)"
    )


async def test_run_events_redis_refuses_fail_the_write_instead_of_being_dropped(
    own_redis_server: RedisServer, user_id: str
) -> None:
    events = [(sequence, f'{{"n":{sequence}}}') for sequence in range(4)]
    async with RedisRunsService(redis_url=own_redis_server.url) as runs:
        record = RunRecord(id="r1", user_id=user_id)
        await runs.record(record, events[:2], create=True)
        await _refusing_writes(own_redis_server.url, True)
        try:
            with pytest.raises(StoreUnavailableError):
                await runs.append_events(user_id, "r1", events[2:])
            with pytest.raises(StoreUnavailableError):
                await runs.record(record, events[2:])
        finally:
            await _refusing_writes(own_redis_server.url, False)
        assert await runs.read_events(user_id, "r1") == events[:2]
        await runs.record(record, events[2:])
        assert await runs.read_events(user_id, "r1") == events


async def test_a_run_write_redis_refuses_is_made_again_with_the_next_one(
    own_redis_server: RedisServer, user_id: str
) -> None:
    go_on = asyncio.Event()

    async def handler(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        yield "one "
        await go_on.wait()
        for word in ("two ", "three ", "four"):
            yield word

    runs = RedisRunsService(redis_url=own_redis_server.url)
    history = InMemorySessionHistoryService()
    runner = Runner(handler, services=Services(session_history=history), settings=load_settings())
    async with runs, history, runner:
        recorder = RunRecorder(runs)
        request = {"input": [{"role": "user", "content": "go"}]}
        run = await recorder.start(runner.stream_query(request), user_id=user_id)
        for _ in range(500):  # until its first write is made
            if await runs.get_run(user_id, run.run_id) is not None:
                break
            await asyncio.sleep(0.01)
        await _refusing_writes(own_redis_server.url, True)
        try:
            go_on.set()
            for _ in range(500):  # until a write of its next events is refused
                if await _refused_writes(own_redis_server.url):
                    break
                await asyncio.sleep(0.01)
            assert await _refused_writes(own_redis_server.url)
        finally:
            await _refusing_writes(own_redis_server.url, False)
        final = await run.final()
        assert final.status == "completed"
        stored = await runs.get_run(user_id, run.run_id)
        assert stored is not None and stored.status == "completed"
        events = await runs.read_events(user_id, run.run_id)
        assert [sequence for sequence, _ in events] == list(range(final.sequence_number + 1))


async def test_starting_a_started_service_keeps_its_client(
    redis_server: RedisServer, user_id: str
) -> None:
    async with RedisSessionHistoryService(redis_server.url) as history:
        session = await history.create_session(user_id, "s1")
        client = history._redis._client
        appending = asyncio.ensure_future(history.append_message(session, msg("under way")))
        await asyncio.sleep(0)
        async with history:  # a nested `async with`: started again, then stopped
            assert history._redis._client is client
            await appending
            stored = await history.get_session(user_id, "s1")
            assert stored is not None
            assert [m.get_text_content() for m in stored.messages] == ["under way"]
        assert await history.health() is False
