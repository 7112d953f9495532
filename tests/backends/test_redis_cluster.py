"""The Redis backends on a Redis Cluster that changes under them: a slot moved to another
primary, a connection closed under a call, a primary killed; and one given a wrong password.

Each test has a cluster of its own: it moves slots or kills nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest
import uvloop
from redis.asyncio import RedisCluster
from redis.crc import key_slot

from agentscope_serverless.aws_secrets import credential_refusals
from agentscope_serverless.errors import StoreUnavailableError
from agentscope_serverless.local_stack import RedisClusterServer, RedisServer
from agentscope_serverless.log import logger
from agentscope_serverless.schemas.agent_schemas import Message, TextContent
from agentscope_serverless.services._redis import RedisBackedService, user_key_prefix
from agentscope_serverless.services.agent_state.redis import RedisStateService
from agentscope_serverless.services.runs.base import RunBurst, RunRecord
from agentscope_serverless.services.runs.redis import RedisRunsService
from agentscope_serverless.services.session_history.redis import RedisSessionHistoryService
from tests.support.redis_cluster import move_slot, slot_owner


def msg(text: str) -> Message:
    return Message(role="user", content=[TextContent(text=text)])


def slot_of(user_id: str) -> int:
    return key_slot(user_key_prefix("agentscope", "session", user_id).encode())


async def test_a_write_of_two_services_is_made_once_right_after_its_slot_moved(
    user_id: str,
) -> None:
    # A turn's last write: its messages and its run in one MULTI. Answered MOVED, it never
    # ran (Redis refuses a transaction's commands for a slot it no longer serves): it is
    # sent again to the new primary. It used to fail (503): the turn was lost.
    with RedisClusterServer() as cluster:
        history = RedisSessionHistoryService(cluster.url, cluster=True)
        runs = RedisRunsService(redis_url=cluster.url, cluster=True)
        async with history, runs:
            session = await history.create_session(user_id, "s1")
            move_slot(cluster, slot_of(user_id))
            append = history.prepare_append(session, [msg("hello")])
            run = RunRecord(id="r1", user_id=user_id, session_id="s1", status="completed")
            record = runs.prepare_record(RunBurst(run, [(0, '{"n":0}')], True, True))
            assert append is not None and record is not None and append.joins(record)
            await append.apply(record)
            stored = await history.get_session(user_id, "s1")
            assert stored is not None
            assert [m.get_text_content() for m in stored.messages] == ["hello"]  # type: ignore[union-attr]
            assert await runs.read_events(user_id, "r1") == [(0, '{"n":0}')]


async def close_connections_under_redis_py(service: RedisBackedService, user_id: str) -> None:
    """Close the sockets of the idle connections to ``user_id``'s primary, as redis-py's
    disconnect of a node's idle connections does when a call on that node failed: until the
    disconnect ends, they stay in the pool with their socket closed, and a call may take one
    and write on it (with uvloop: a RuntimeError, not a ConnectionError)."""
    client = service._redis._client
    assert isinstance(client, RedisCluster)
    node = client.nodes_manager.get_node_from_slot(slot_of(user_id))
    writers = [connection._writer for connection in node._free]
    assert writers, "no idle connection to the primary"
    for writer in writers:
        assert writer is not None
        writer.close()
        await writer.wait_closed()


def test_a_connection_closed_under_a_call_fails_it_as_a_lost_connection() -> None:
    # A primary killed under traffic: some calls got a 500 (the RuntimeError of a write on
    # a socket uvloop had closed). Now a lost connection as any other: a read is tried again,
    # a write fails as unavailable (503), as do all once the primary is gone.
    user_id = f"user-{uuid.uuid4().hex[:12]}"

    async def calls(cluster: RedisClusterServer) -> None:
        history = RedisSessionHistoryService(cluster.url, cluster=True, socket_timeout=2.0)
        state = RedisStateService(cluster.url, cluster=True, socket_timeout=2.0)
        async with history, state:
            await history.create_session(user_id, "s1")
            assert await state.save_state(user_id, {"v": 1}) == 1

            await close_connections_under_redis_py(history, user_id)
            assert await history.get_session(user_id, "s1") is not None  # MULTI, tried again
            await close_connections_under_redis_py(history, user_id)
            await history.create_session(user_id, "s2")  # a script, tried again

            await close_connections_under_redis_py(state, user_id)
            with pytest.raises(StoreUnavailableError) as raised:
                await state.save_state(user_id, {"v": 2})  # may not be sent twice
            assert str(raised.value) == "redis is unavailable: the connection failed"
            assert await state.export_state(user_id) == {"v": 1}

            slot_owner(cluster, slot_of(user_id)).stop()
            await close_connections_under_redis_py(history, user_id)
            with pytest.raises(StoreUnavailableError):
                await history.get_session(user_id, "s1")
            await close_connections_under_redis_py(state, user_id)
            with pytest.raises(StoreUnavailableError):
                await state.save_state(user_id, {"v": 3})

    with (
        RedisClusterServer() as cluster,
        asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
    ):
        runner.run(calls(cluster))


async def test_a_wrong_cluster_password_says_authentication_failed_never_the_password(
    capfd: pytest.CaptureFixture[str], user_id: str
) -> None:
    # It read "the request failed", and was not counted as a refused password (the count
    # has the secret read again: it may have been rotated).
    level = logger.level
    logger.setLevel("WARNING")  # the tests log nothing below CRITICAL
    with contextlib.ExitStack() as stack:
        stack.callback(logger.setLevel, level)
        node = stack.enter_context(RedisServer(password="Sup3r-Secret-Pa55", cluster=True))
        assert node.cli("CLUSTER", "ADDSLOTSRANGE", "0", "16383") == "OK"
        deadline = time.monotonic() + 30
        while "cluster_state:ok" not in node.cli("CLUSTER", "INFO"):
            assert time.monotonic() < deadline, "the cluster did not come up"
            await asyncio.sleep(0.05)
        wrong = RedisServer(password="Wr0ng-Pa55", port=node.port).url  # only for its URL
        refused = credential_refusals()
        async with RedisSessionHistoryService(wrong, cluster=True) as history:
            with pytest.raises(StoreUnavailableError) as raised:
                await history.create_session(user_id, "s1")
            assert credential_refusals() == refused + 1
            assert not await history.health()
            assert credential_refusals() == refused + 2
    message = str(raised.value)
    assert message == (
        "redis is unavailable: authentication failed: Redis refuses the password of "
        "REDIS_URL (the redis_url of the stack's secret)"
    )
    out, err = capfd.readouterr()
    assert "redis command failed" in out
    assert "Pa55" not in message + out + err


async def test_a_call_failing_mid_reshard_logs_no_key_nor_argument(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # A slot half moved answers a transaction ASK or TRYAGAIN (503, as README says). redis-py
    # puts the failing command, keys and values, in its error, which the "redis command
    # failed" line quoted: user and session ids, and the start of what was stored.
    user_id = f"user-{uuid.uuid4().hex[:12]}"
    level = logger.level
    logger.setLevel("WARNING")  # the tests log nothing below CRITICAL
    with contextlib.ExitStack() as stack:
        stack.callback(logger.setLevel, level)
        cluster = stack.enter_context(RedisClusterServer())
        history = RedisSessionHistoryService(cluster.url, cluster=True)
        runs = RedisRunsService(redis_url=cluster.url, cluster=True)
        async with history, runs:
            session = await history.create_session(user_id, "chat-about-ann")
            await history.append_message(session, [msg("hello")])
            slot = slot_of(user_id)
            ids = {node.port: node.cli("CLUSTER", "MYID") for node in cluster.nodes}
            owner = slot_owner(cluster, slot)
            target = cluster.nodes[(cluster.nodes.index(owner) + 1) % len(cluster.nodes)]
            target.cli("CLUSTER", "SETSLOT", str(slot), "IMPORTING", ids[owner.port])
            owner.cli("CLUSTER", "SETSLOT", str(slot), "MIGRATING", ids[target.port])
            messages = f"{user_key_prefix('agentscope', 'session', user_id)}:s:chat-about-ann"
            assert (
                owner.cli(
                    "MIGRATE",
                    "127.0.0.1",
                    str(target.port),
                    "",
                    "0",
                    "5000",
                    "KEYS",
                    f"{messages}:messages",
                )
                == "OK"
            )
            capfd.readouterr()
            with pytest.raises(StoreUnavailableError):
                await history.get_session(user_id, "chat-about-ann")
            run = RunRecord(
                id="r1", user_id=user_id, session_id="chat-about-ann", status="completed"
            )
            record = runs.prepare_record(RunBurst(run, [(0, '{"said":"Ann"}')], True, True))
            assert record is not None
            with pytest.raises(StoreUnavailableError):
                await record.apply()
    out, err = capfd.readouterr()
    assert out.count("redis command failed") == 2
    assert '"command":"MULTI EXISTS LRANGE EXEC"' in out
    for secret in (user_id, "chat-about-ann", "Ann"):
        assert secret not in out + err


def test_a_service_on_a_cluster_serves_one_event_loop_after_another() -> None:
    # As on a standalone Redis (and DynamoDB), a script's successive asyncio.run calls use
    # one service. The cluster client kept the connections of the first loop: every call
    # after it raised RuntimeError ("Event loop is closed"), and so did stop().
    user_id = f"user-{uuid.uuid4().hex[:12]}"
    with RedisClusterServer() as cluster:
        history = RedisSessionHistoryService(cluster.url, cluster=True)
        state = RedisStateService(cluster.url, cluster=True)

        async def first() -> None:
            await history.start()
            await state.start()
            await history.create_session(user_id, "s1")

        async def turn(n: int) -> tuple[int, int | None, bool]:
            session = await history.get_session(user_id, "s1")
            assert session is not None
            await history.append_message(session, [msg(f"turn {n}")])
            saved = await state.save_state(user_id, {"n": n}, session_id="s1")
            stored = await history.get_session(user_id, "s1")
            assert stored is not None
            return len(stored.messages), saved, await history.health()

        async def last() -> None:
            await history.stop()
            await state.stop()

        asyncio.run(first())
        assert [asyncio.run(turn(n)) for n in range(3)] == [
            (1, 1, True),
            (2, 2, True),
            (3, 3, True),
        ]
        asyncio.run(last())
