"""The Redis backends on a Redis Cluster that changes under them: a slot moved to another
primary.

Each test has a cluster of its own: it moves slots.
"""

from __future__ import annotations

from redis.crc import key_slot

from agentscope_serverless.local_stack import RedisClusterServer
from agentscope_serverless.schemas.agent_schemas import Message, TextContent
from agentscope_serverless.services._redis import user_key_prefix
from agentscope_serverless.services.runs.base import RunBurst, RunRecord
from agentscope_serverless.services.runs.redis import RedisRunsService
from agentscope_serverless.services.session_history.redis import RedisSessionHistoryService
from tests.support.redis_cluster import move_slot


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
