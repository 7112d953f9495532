"""The connection a Redis store's calls share: replies reach their own caller, in any
interleaving, through cancellations, a lost connection and a restarted server."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from agentscope_serverless.errors import StoreUnavailableError
from agentscope_serverless.local_stack import RedisServer
from agentscope_serverless.log import logger
from agentscope_serverless.services._redis import RedisStore
from agentscope_serverless.services._redis_shared import SharedConnection, pack, pack_in_pieces

ECHO = "return ARGV[1]"
SLOW_ECHO = """
local now = redis.call('TIME')
while tonumber(now[1]) * 1000000 + tonumber(now[2]) < tonumber(ARGV[2]) do
  now = redis.call('TIME')
end
return ARGV[1]
"""


@contextlib.asynccontextmanager
async def opened(url: str, **options: Any) -> AsyncIterator[RedisStore]:
    """A store on ``url``, open for the block."""
    store = RedisStore(url=url, **options)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def connected(
    url: str, reply_timeout: float | None = None
) -> AsyncIterator[tuple[Redis, SharedConnection]]:
    """A plain client on ``url`` (to act from outside) and a shared connection of its pool."""
    async with Redis.from_url(url) as client:
        connection = await SharedConnection.open(
            client.connection_pool, reply_timeout=reply_timeout
        )
        try:
            yield client, connection
        finally:
            await connection.close()


async def refuses_calls(connection: SharedConnection) -> None:
    """``connection`` is gone: it says so, and a call through it fails at once."""
    assert not connection.usable
    with pytest.raises(RedisConnectionError):
        await connection.execute([("PING",)])


async def _now_us(client: Redis) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1_000_000 + int(micros)


def test_commands_are_packed_as_resp_and_odd_arguments_refused() -> None:
    assert pack(("SET", "k", b"\x00\xff", 3, 1.5)) == (
        b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n\x00\xff\r\n$1\r\n3\r\n$3\r\n1.5\r\n"
    )
    assert pack(("ECHO", "é")) == b"*2\r\n$4\r\nECHO\r\n$2\r\n\xc3\xa9\r\n"
    for odd in (None, True, ["x"]):
        with pytest.raises(DataError):
            pack(("ECHO", odd))
    with pytest.raises(UnicodeEncodeError):  # a lone surrogate has no UTF-8
        pack(("ECHO", "\udc80"))


def test_every_argument_kind_packs_alike_in_c_and_in_python() -> None:
    class Name(str):
        pass

    class Level(enum.IntEnum):
        HIGH = 7

    command = ["EVAL", Name("script"), Level.HIGH, 2**70, -1, 0.1, 1e20, "", b"", "\u2028\x00"]
    parts = [b"EVAL", b"script", b"7", b"1180591620717411303424", b"-1", b"0.1", b"1e+20"]
    parts += [b"", b"", "\u2028\x00".encode()]
    expected = b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in parts)
    assert pack(command) == pack(tuple(command)) == b"*10\r\n" + expected


async def test_concurrent_calls_each_get_their_own_reply_over_one_connection(
    redis_server: RedisServer,
) -> None:
    async with opened(redis_server.url) as store, Redis.from_url(redis_server.url) as client:
        before = len(await client.client_list())
        values = [f"v{i}-" + "x" * (i * 37 % 5000) for i in range(500)]
        replies = await asyncio.gather(
            *(store.run(ECHO, [], [value], idempotent=True) for value in values)
        )
        assert [reply.decode() for reply in replies] == values
        # One connection more than before: the calls shared it.
        assert len(await client.client_list()) == before + 1
        exists, items = await store.transaction(
            [("EXISTS", "nothing"), ("LRANGE", "nothing", 0, -1)]
        )
        assert (exists, items) == (0, [])


async def test_a_caller_giving_up_does_not_shift_the_replies_of_the_others(
    redis_server: RedisServer,
) -> None:
    async with connected(redis_server.url) as (client, connection):
        until = await _now_us(client) + 200_000
        slow = asyncio.ensure_future(connection.execute([("EVAL", SLOW_ECHO, 0, "slow", until)]))
        behind = asyncio.ensure_future(connection.execute([("ECHO", "behind")]))
        await asyncio.sleep(0.05)
        slow.cancel()  # its reply still comes, first, and must be dropped
        assert await behind == [b"behind"]
        assert await connection.execute([("ECHO", "after")]) == [b"after"]
        with pytest.raises(ResponseError):
            await connection.execute([("ECHO", "ok"), ("NOSUCHCOMMAND",)])
        assert await connection.execute([("ECHO", "still")]) == [b"still"]


async def test_a_call_that_cannot_be_packed_fails_alone_and_takes_no_reply(
    redis_server: RedisServer,
) -> None:
    async with connected(redis_server.url) as (_, connection):
        waiting = asyncio.ensure_future(connection.execute([("ECHO", "first")]))
        with pytest.raises(UnicodeEncodeError):
            await connection.execute([("ECHO", "fine"), ("ECHO", "\udc80")])
        # Had the refused call waited for replies, it would take the next call's.
        assert await waiting == [b"first"]
        assert await connection.execute([("ECHO", "next")]) == [b"next"]
        assert await connection.execute([("ECHO", "a"), ("ECHO", "b")]) == [b"a", b"b"]


async def test_a_lost_connection_fails_the_calls_waiting_on_it(redis_server: RedisServer) -> None:
    async with connected(redis_server.url) as (client, connection):
        (connection_id,) = await connection.execute([("CLIENT", "ID")])
        # WAIT blocks this connection only (there is no replica): the call stays in flight.
        waiting = asyncio.ensure_future(connection.execute([("WAIT", 1, 5000)]))
        behind = asyncio.ensure_future(connection.execute([("ECHO", "behind")]))
        await asyncio.sleep(0.05)
        await client.client_kill_filter(_id=connection_id)
        for call in (waiting, behind):
            with pytest.raises(RedisConnectionError):
                await call
        await refuses_calls(connection)


async def test_a_store_whose_connection_was_killed_connects_again(
    redis_server: RedisServer,
) -> None:
    async with (
        opened(redis_server.url) as store,
        Redis.from_url(redis_server.url, decode_responses=True) as client,
    ):
        assert await store.run(ECHO, [], ["first"], idempotent=False) == b"first"
        shared = [c for c in await client.client_list() if c["cmd"] == "evalsha"]
        assert len(shared) == 1
        await client.client_kill_filter(_id=shared[0]["id"])
        await asyncio.sleep(0.1)  # the connection's reader sees it closed
        assert await store.run(ECHO, [], ["again"], idempotent=False) == b"again"


async def test_a_restarted_server_is_reached_again_and_its_scripts_reloaded(
    own_redis_server: RedisServer,
) -> None:
    async with opened(own_redis_server.url, socket_connect_timeout=1.0) as store:
        assert await store.run(ECHO, [], ["before"], idempotent=True) == b"before"
        own_redis_server.stop()
        with pytest.raises(StoreUnavailableError):
            await store.run(ECHO, [], ["down"], idempotent=True)
        own_redis_server.start()  # a new server: the script is not loaded there
        assert await store.run(ECHO, [], ["after"], idempotent=False) == b"after"


async def test_a_connection_is_not_used_from_another_event_loop(redis_server: RedisServer) -> None:
    async with opened(redis_server.url) as store:
        assert await store.run(ECHO, [], ["here"], idempotent=True) == b"here"

        def elsewhere() -> bytes:
            async def call() -> bytes:
                reply: bytes = await store.run(ECHO, [], ["there"], idempotent=True)
                return reply

            return asyncio.run(call())

        assert await asyncio.to_thread(elsewhere) == b"there"
        assert await store.run(ECHO, [], ["back"], idempotent=True) == b"back"


async def test_threads_each_running_an_event_loop_of_its_own_share_a_store_at_once(
    redis_server: RedisServer,
) -> None:
    # A service shared by threads (a sync endpoint's asyncio.run beside the server's loop)
    # had one connection: each loop that called dropped the other's, failing its calls
    # (a write is never sent twice: 503) or handing it a reply awaited on the wrong loop.
    async with opened(redis_server.url) as store:

        async def calls(name: str) -> list[bytes]:
            replies = []
            for n in range(50):
                replies.append(await store.run(ECHO, [], [f"{name}{n}"], idempotent=False))
            return replies

        def elsewhere(name: str) -> list[bytes]:
            return asyncio.run(calls(name))

        answers = await asyncio.gather(
            calls("main"), *(asyncio.to_thread(elsewhere, f"t{i}") for i in range(3))
        )
        for name, replies in zip(("main", "t0", "t1", "t2"), answers, strict=True):
            assert replies == [f"{name}{n}".encode() for n in range(50)]


async def test_calls_after_close_fail_cleanly(redis_server: RedisServer) -> None:
    async with connected(redis_server.url) as (_, connection):
        await connection.close()
        await refuses_calls(connection)


async def test_large_and_small_commands_of_one_turn_keep_their_order(
    redis_server: RedisServer,
) -> None:
    async with connected(redis_server.url) as (client, connection):
        try:
            big = "b" * 200_000  # written at once, behind the small ones already waiting
            calls = [
                asyncio.ensure_future(connection.execute([("ECHO", value)]))
                for value in ("s1", "s2", big, "s3")
            ]
            assert [reply for (reply,) in await asyncio.gather(*calls)] == [
                b"s1",
                b"s2",
                big.encode(),
                b"s3",
            ]
            await connection.execute([("RPUSH", "order:check", "a"), ("RPUSH", "order:check", big)])
            assert await client.lrange("order:check", 0, -1) == [b"a", big.encode()]
        finally:
            await client.delete("order:check")


async def test_the_calls_of_one_turn_of_the_loop_and_the_next_go_out_in_one_write(
    redis_server: RedisServer,
) -> None:
    async with connected(redis_server.url) as (_, connection):
        writes: list[bytes] = []
        write = connection._writer.write

        def counted(data: bytes) -> None:
            writes.append(data)
            write(data)

        connection._writer.write = counted  # type: ignore[method-assign]

        async def turns_later(turns: int, value: str) -> list[Any]:
            for _ in range(turns):
                await asyncio.sleep(0)
            return await connection.execute([("ECHO", value)])

        replies = await asyncio.gather(
            connection.execute([("ECHO", "now")]), turns_later(1, "next")
        )
        assert replies == [[b"now"], [b"next"]]
        assert len(writes) == 1
        # Two turns later is too late: a write of its own.
        await asyncio.gather(connection.execute([("PING",)]), turns_later(2, "later"))
        assert len(writes) == 3


async def test_a_large_command_lets_other_tasks_run_while_it_is_packed(
    redis_server: RedisServer,
) -> None:
    # A reply of 50 MB packed at once held every other request of the process: a large
    # argument is packed a piece at a time, the event loop turning between pieces.
    value = "é" + "x" * (8 << 20)
    async with connected(redis_server.url) as (client, connection):
        ticks = 0
        ticks_when_written: list[int] = []
        writelines = connection._writer.writelines
        write = connection._writer.write

        def written(data: Any) -> None:
            ticks_when_written.append(ticks)
            (writelines if isinstance(data, list) else write)(data)

        connection._writer.writelines = written  # type: ignore[method-assign]
        connection._writer.write = written  # type: ignore[method-assign]

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0)
                ticks += 1

        ticking = asyncio.create_task(tick())
        try:
            assert await connection.execute([("SET", "large", value), ("STRLEN", "large")]) == [
                b"OK",
                len(value.encode()),
            ]
        finally:
            ticking.cancel()
        assert ticks_when_written[0] >= 8  # a turn for each MiB
        assert await client.get("large") == value.encode()


async def test_a_command_packed_in_pieces_is_packed_as_at_once() -> None:
    command = ("EVALSHA", "sha", 2, "key", b"b" * (3 << 20), "é" * (3 << 20), 1.5)
    assert b"".join(await pack_in_pieces([command, ("PING",)])) == pack(command) + pack(("PING",))


def test_a_store_outlives_an_event_loop_closed_under_its_connection(
    redis_server: RedisServer,
) -> None:
    store = RedisStore(url=redis_server.url)
    first = asyncio.new_event_loop()
    first.run_until_complete(store.open())
    assert first.run_until_complete(store.run(ECHO, [], ["one"], idempotent=True)) == b"one"
    first.close()  # without cancelling the connection's reader: its loop is just gone

    async def later() -> bytes:
        try:
            reply: bytes = await store.run(ECHO, [], ["two"], idempotent=False)
            return reply
        finally:
            await store.close()

    assert asyncio.run(later()) == b"two"


def test_a_store_on_redis_pys_own_path_serves_one_event_loop_after_another(
    redis_server: RedisServer,
) -> None:
    # A RESP3 URL keeps redis-py's own path, whose pool kept the connection of the loop
    # before: the next loop's call raised RuntimeError ("Event loop is closed"), as did close.
    store = RedisStore(url=f"{redis_server.url}?protocol=3")
    asyncio.run(store.open())
    for n in range(3):
        assert asyncio.run(store.run(ECHO, [], [str(n)], idempotent=False)) == str(n).encode()
    asyncio.run(store.close())


async def test_a_reply_late_past_the_timeout_fails_the_calls_and_closes_the_connection(
    redis_server: RedisServer,
) -> None:
    async with connected(redis_server.url, reply_timeout=0.2) as (_, connection):
        assert await connection.execute([("ECHO", "quick")]) == [b"quick"]
        # WAIT holds this connection's replies for a second (there is no replica).
        stuck = asyncio.ensure_future(connection.execute([("WAIT", 1, 1000)]))
        behind = asyncio.ensure_future(connection.execute([("ECHO", "behind")]))
        for call in (stuck, behind):
            with pytest.raises(RedisTimeoutError):
                await call
        assert not connection.usable


async def test_a_store_call_without_an_answer_in_time_is_an_unavailable_store(
    redis_server: RedisServer,
) -> None:
    async with (
        opened(redis_server.url, socket_timeout=0.2) as store,
        Redis.from_url(redis_server.url) as client,
    ):
        until = await _now_us(client) + 600_000
        with pytest.raises(StoreUnavailableError) as raised:
            await store.run(SLOW_ECHO, [], ["late", until], idempotent=False)
        assert "timed out" in str(raised.value)
        assert await client.ping()  # answered once the script has run to its end
        assert await store.run(ECHO, [], ["fresh"], idempotent=False) == b"fresh"


async def test_a_frozen_server_makes_calls_fail_in_time_and_a_thawed_one_answers(
    own_redis_server: RedisServer,
) -> None:
    # A stopped process still accepts connections (the kernel does): the handshake of a new
    # connection and the replies on an open one must both be bounded.
    for warm in (False, True):
        async with opened(own_redis_server.url, socket_timeout=0.3) as store:
            if warm:
                assert await store.run(ECHO, [], ["warm"], idempotent=True) == b"warm"
            own_redis_server.pause()
            try:
                with pytest.raises(StoreUnavailableError) as raised:
                    await store.run(ECHO, [], ["frozen"], idempotent=True)
                assert "timed out" in str(raised.value)
            finally:
                own_redis_server.resume()
            assert await store.run(ECHO, [], ["thawed"], idempotent=False) == b"thawed"


async def test_the_connection_is_made_again_after_an_idle_health_check_interval(
    own_redis_server: RedisServer,
) -> None:
    client = Redis.from_url(own_redis_server.url, decode_responses=True)

    async def shared_connection_id() -> str:
        (shared,) = [c for c in await client.client_list() if c["cmd"] == "evalsha"]
        return str(shared["id"])

    async with client:
        for interval, expected in ((0.05, 2), (0.0, 1)):  # 0: no health checks, no reconnects
            async with opened(own_redis_server.url, health_check_interval=interval) as store:
                ids = set()
                for _ in range(2):
                    await store.run(ECHO, [], ["x"], idempotent=True)
                    ids.add(await shared_connection_id())
                    await asyncio.sleep(0.1)
                assert len(ids) == expected


async def test_a_failed_call_is_logged_naming_its_commands_not_their_arguments(
    own_redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    # The line read "TimeoutError: " alone: which command went unanswered was anyone's guess.
    level = logger.level
    logger.setLevel("WARNING")  # the tests log nothing below CRITICAL
    try:
        await _fail_a_script_and_a_transaction(own_redis_server, capsys)
    finally:
        logger.setLevel(level)


async def _fail_a_script_and_a_transaction(
    own_redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    async with opened(own_redis_server.url, socket_timeout=0.3) as store:
        capsys.readouterr()
        own_redis_server.pause()
        try:
            for call in (
                store.run(ECHO, ["user-key"], ["user-text"], idempotent=False),
                store.transaction([("EXISTS", "user-key"), ("LRANGE", "user-key", 0, -1)]),
            ):
                with pytest.raises(StoreUnavailableError):
                    await call
        finally:
            own_redis_server.resume()
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    failures = [line for line in lines if line["message"] == "redis command failed"]
    assert [line["command"] for line in failures] == [
        f"EVALSHA {hashlib.sha1(ECHO.encode()).hexdigest()}",  # the script, as Redis names it
        "MULTI EXISTS LRANGE EXEC",
    ]
    assert all(line["error"].startswith("TimeoutError") for line in failures)
    assert "user-" not in json.dumps(failures)
