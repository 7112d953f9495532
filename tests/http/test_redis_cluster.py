"""The HTTP API on a Redis Cluster whose slots move between primaries (a reshard, a
scale-out), every node up."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from redis.crc import key_slot

from agentscope_serverless.agents.demo import app as demo_app
from agentscope_serverless.auth import InMemoryKeyStore
from agentscope_serverless.http import create_app
from agentscope_serverless.local_stack import RedisClusterServer
from agentscope_serverless.services._redis import user_key_prefix
from agentscope_serverless.settings import load_settings
from tests.support.http import bearer, issue_key, running, user_message
from tests.support.redis_cluster import move_slot


@contextmanager
def serving(cluster: RedisClusterServer, user_id: str) -> Iterator[httpx.Client]:
    """A server with every store on ``cluster``, and a client with ``user_id``'s key."""
    settings = load_settings(
        session_history_backend="redis",
        memory_backend="redis",
        state_backend="redis",
        runs_backend="redis",
        redis_url=cluster.url,
        redis_cluster=True,
    )
    keys = InMemoryKeyStore()
    key = issue_key(keys, user_id)
    app = create_app(settings=settings, agent_app=demo_app, key_store=keys)
    with (
        running(app) as url,
        httpx.Client(base_url=url, headers=bearer(key), timeout=60) as client,
    ):
        yield client


def test_a_session_and_a_turn_work_right_after_their_slot_moved() -> None:
    # A MULTI answered MOVED never ran: it is sent again to the slot's new primary. It used
    # to fail with 503 (a whole session's read, a turn's last write: the turn was lost).
    user_id = f"user-{uuid.uuid4().hex[:12]}"
    slot = key_slot(user_key_prefix("agentscope", "session", user_id).encode())
    with RedisClusterServer() as cluster, serving(cluster, user_id) as client:
        turn = {"input": [user_message("My name is Ann")], "session_id": "s1", "stream": False}
        assert client.post("/process", json=turn).status_code == 200
        before = client.get("/sessions/s1")
        assert before.status_code == 200
        assert len(before.json()["messages"]) == 2

        move_slot(cluster, slot)
        after = client.get("/sessions/s1")
        assert after.status_code == 200, after.text
        assert after.json() == before.json()

        move_slot(cluster, slot)
        again = client.post("/process", json={**turn, "input": [user_message("Who am I?")]})
        assert again.status_code == 200, again.text
        move_slot(cluster, slot)
        session = client.get("/sessions/s1")
        assert session.status_code == 200, session.text
        messages = session.json()["messages"]
        assert messages[:2] == before.json()["messages"]
        assert len(messages) == 4
