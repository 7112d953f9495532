"""A run stored with its turn: when session history and runs share a Redis, a run that ends
within its first write delay is stored, final event included, in the request that appends
the turn's messages; whatever fails there, the run ends stored as it was streamed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from typing import Any

import pytest
from redis.asyncio import Redis

from agentscope_serverless.local_stack import RedisClusterServer, RedisServer
from agentscope_serverless.recorder import RecordedRun, RunRecorder
from agentscope_serverless.runner import Runner
from agentscope_serverless.services._redis import RedisStore, ScriptCall
from agentscope_serverless.services.container import Services
from agentscope_serverless.services.memory.in_memory import InMemoryMemoryService
from agentscope_serverless.services.runs.redis import RedisRunsService
from agentscope_serverless.services.session_history.base import SessionHistoryService
from agentscope_serverless.services.session_history.redis import RedisSessionHistoryService
from agentscope_serverless.settings import load_settings


async def _words(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
    for word in ("one ", "two ", "three"):
        yield word


class _Stack:
    """A runner on Redis session history, with a recorder on Redis runs."""

    def __init__(
        self,
        history: RedisSessionHistoryService,
        runs: RedisRunsService,
        handler: Any = _words,
        memory: InMemoryMemoryService | None = None,
    ) -> None:
        self.history, self.runs, self.memory = history, runs, memory
        services = Services(session_history=history, memory=memory)
        self.runner = Runner(handler, services=services, settings=load_settings())
        self.recorder = RunRecorder(runs)
        self._exit = AsyncExitStack()

    async def __aenter__(self) -> _Stack:
        for service in (self.history, self.runs, self.memory, self.runner):
            if service is not None:
                await self._exit.enter_async_context(service)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._exit.aclose()

    async def start(self, user: str, session: str, text: str = "go") -> RecordedRun:
        request = {"input": [{"role": "user", "content": text}], "session_id": session}
        request["user_id"] = user
        return await self.recorder.start(self.runner.stream_query(request), user_id=user)


async def _streamed(run: RecordedRun) -> list[str]:
    return [data async for _, data in run.items()]


async def _stored(runs: RedisRunsService, user: str, run_id: str) -> list[str]:
    return [data for _, data in await runs.read_events(user, run_id)]


async def _history(history: SessionHistoryService, user: str, session: str) -> list[str]:
    stored = await history.get_session(user, session)
    assert stored is not None
    return [message.get_text_content() or "" for message in stored.messages]  # type: ignore[union-attr]


@pytest.fixture
def second_redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


async def test_a_fast_run_and_its_turn_are_stored_in_one_request(
    own_redis_server: RedisServer,
) -> None:
    url = own_redis_server.url
    stack = _Stack(RedisSessionHistoryService(url), RedisRunsService(url, ttl_seconds=600))
    async with stack, Redis.from_url(url) as client:
        await (await stack.start("bob", "s0")).final()  # Redis has the scripts now
        await client.config_resetstat()
        run = await stack.start("alice", "s1")
        streamed = await _streamed(run)
        calls = {
            name.removeprefix("cmdstat_"): stats["calls"]
            for name, stats in (await client.info("commandstats")).items()
        }
        # Opening the session is one script; the turn's end, one transaction of the
        # history's script and the run's commands. Nothing else was sent.
        assert calls["evalsha"] == 2 and calls["exec"] == calls["multi"] == 1
        assert calls["hset"] == 1 + 2 + 1  # session meta, each message id, the run
        assert json.loads(streamed[-1])["status"] == "completed"
        assert await _stored(stack.runs, "alice", run.run_id) == streamed
        record = await stack.runs.get_run("alice", run.run_id)
        assert record is not None and record.status == "completed"
        assert await _history(stack.history, "alice", "s1") == ["go", "one two three"]
        assert [r.id for r in await stack.runs.list_runs("alice", "s1")] == [run.run_id]
        run_key = stack.runs._run_key("alice", run.run_id)
        assert 0 < await client.ttl(run_key) <= 600


async def test_a_turn_whose_history_cannot_be_appended_ends_failed_in_the_store_too(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    url = redis_server.url
    stack = _Stack(RedisSessionHistoryService(url), RedisRunsService(url))
    async with stack:
        # The session's message-id index is not a hash: its append fails in Redis, after
        # the session was opened (which does not read that key).
        ids_key = next(key for key in stack.history._keys(user_id, "s1") if key.endswith(":ids"))
        await redis_client.set(ids_key, "not a hash")
        run = await stack.start(user_id, "s1")
        streamed = await _streamed(run)
        final = json.loads(streamed[-1])
        assert final["status"] == "failed"
        assert [json.loads(data)["sequence_number"] for data in streamed] == list(
            range(len(streamed))
        )
        # The transaction stored the run as completed; it was stored again as it ended.
        assert await _stored(stack.runs, user_id, run.run_id) == streamed
        record = await stack.runs.get_run(user_id, run.run_id)
        assert record is not None and record.status == "failed"
        assert await redis_client.get(ids_key) == "not a hash"


async def test_scripts_redis_lost_are_loaded_again_and_the_turn_stored_once(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    url = redis_server.url
    stack = _Stack(RedisSessionHistoryService(url), RedisRunsService(url))
    async with stack:
        await (await stack.start(user_id, "s1", "first")).final()
        await redis_client.script_flush()  # as after a restart of Redis
        run = await stack.start(user_id, "s1", "second")
        streamed = await _streamed(run)
        assert json.loads(streamed[-1])["status"] == "completed"
        assert await _stored(stack.runs, user_id, run.run_id) == streamed
        assert await _history(stack.history, user_id, "s1") == [
            "first",
            "one two three",
            "second",
            "one two three",
        ]


async def test_a_transaction_reruns_only_the_scripts_redis_lost(
    redis_server: RedisServer, redis_client: Redis, user_id: str
) -> None:
    store = RedisStore(url=redis_server.url)
    await store.open()
    try:
        counter, log = f"{user_id}:counter", f"{user_id}:log"
        push = ScriptCall("return redis.call('RPUSH', KEYS[1], ARGV[1])", [log], ["pushed"])
        assert await store.transaction([("INCR", counter), push]) == [1, 1]
        await redis_client.script_flush()
        assert await store.transaction([("INCR", counter), push]) == [2, 2]
        # The plain command ran once, the lost script once more after being loaded.
        assert await redis_client.get(counter) == "2"
        assert await redis_client.lrange(log, 0, -1) == ["pushed", "pushed"]
    finally:
        await store.close()


class _SlowMemory(InMemoryMemoryService):
    """Memory whose adds wait for ``gate``: the turn is stored, its final event not sent."""

    def __init__(self) -> None:
        super().__init__()
        self.adding = asyncio.Event()
        self.gate = asyncio.Event()

    async def add_memory(self, *args: Any, **kwargs: Any) -> None:
        self.adding.set()
        await self.gate.wait()
        await super().add_memory(*args, **kwargs)


async def test_a_run_whose_end_is_stored_can_no_longer_be_canceled(
    redis_server: RedisServer, user_id: str
) -> None:
    url = redis_server.url
    memory = _SlowMemory()
    stack = _Stack(RedisSessionHistoryService(url), RedisRunsService(url), memory=memory)
    async with stack:
        run = await stack.start(user_id, "s1")
        streaming = asyncio.ensure_future(_streamed(run))
        await memory.adding.wait()
        # The store already says completed: cancelling now must not stop the turn.
        assert stack.recorder.cancel_local(user_id, run.run_id)
        await asyncio.sleep(0.05)
        memory.gate.set()
        streamed = await streaming
        assert json.loads(streamed[-1])["status"] == "completed"
        remembered = await memory.list_memory(user_id)
        assert [m.get_text_content() for m in remembered] == ["go", "one two three"]
        assert await _stored(stack.runs, user_id, run.run_id) == streamed
        record = await stack.runs.get_run(user_id, run.run_id)
        assert record is not None and record.status == "completed"


async def test_runs_on_another_redis_are_stored_apart_from_the_history(
    redis_server: RedisServer, second_redis_server: RedisServer, user_id: str
) -> None:
    history = RedisSessionHistoryService(redis_server.url)
    stack = _Stack(history, RedisRunsService(second_redis_server.url))
    async with stack, Redis.from_url(second_redis_server.url) as runs_client:
        await runs_client.config_resetstat()
        run = await stack.start(user_id, "s1")
        streamed = await _streamed(run)
        assert json.loads(streamed[-1])["status"] == "completed"
        assert await _stored(stack.runs, user_id, run.run_id) == streamed
        assert await _history(history, user_id, "s1") == ["go", "one two three"]
        stats = await runs_client.info("commandstats")
        assert "cmdstat_rpush" not in stats  # no message reached the runs' Redis


async def test_an_agent_running_another_runner_keeps_its_own_turn_end(
    redis_server: RedisServer, user_id: str
) -> None:
    url = redis_server.url
    # The inner runner's history is on the same Redis: had it taken the outer run's turn
    # end, its own turn would be stored as the outer run's end.
    inner_history = RedisSessionHistoryService(url)
    inner = Runner(_words, services=Services(session_history=inner_history))

    async def outer(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        reply = await inner.query(
            {"input": [{"role": "user", "content": "inner"}], "session_id": "inner"},
            user_id=user_id,
        )
        yield f"inner said {reply.output[-1].get_text_content()}"  # type: ignore[index]

    stack = _Stack(RedisSessionHistoryService(url), RedisRunsService(url), handler=outer)
    # Stored whole as it ends (a slow machine may take longer than the first write's delay,
    # which would store the run before its end, apart from the turn).
    stack.recorder.first_write_delay = 60
    async with stack, inner_history, inner, Redis.from_url(url) as client:
        await client.config_resetstat()
        run = await stack.start(user_id, "outer")
        streamed = await _streamed(run)
        # One transaction: the outer turn's. The inner turn's messages went on their own.
        assert (await client.info("commandstats"))["cmdstat_exec"]["calls"] == 1
        final = json.loads(streamed[-1])
        assert final["status"] == "completed" and final["id"] == run.run_id
        assert await _stored(stack.runs, user_id, run.run_id) == streamed
        assert await _history(stack.history, user_id, "outer") == [
            "go",
            "inner said one two three",
        ]
        assert await _history(inner_history, user_id, "inner") == ["inner", "one two three"]


async def test_a_turn_on_a_cluster_is_stored_with_its_run(
    redis_cluster_server: RedisClusterServer, user_id: str
) -> None:
    url = redis_cluster_server.url
    stack = _Stack(
        RedisSessionHistoryService(url, cluster=True), RedisRunsService(url, cluster=True)
    )
    async with stack:
        for user in (user_id, f"{user_id}-other"):
            run = await stack.start(user, "s1")
            streamed = await _streamed(run)
            assert json.loads(streamed[-1])["status"] == "completed"
            assert await _stored(stack.runs, user, run.run_id) == streamed
            assert await _history(stack.history, user, "s1") == ["go", "one two three"]
