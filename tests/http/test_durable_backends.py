"""The HTTP API on the durable backends: history and state on DynamoDB, memory on Redis.

The stores are the session's real servers (moto's DynamoDB server, redis-server) on loopback.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import boto3
import httpx
import pytest

from agentscope_serverless.agents.demo import app as demo_app
from agentscope_serverless.auth import InMemoryKeyStore
from agentscope_serverless.http import create_app
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS, DynamoDBServer, RedisServer
from agentscope_serverless.services._dynamodb import id_hash
from agentscope_serverless.settings import Settings, load_settings
from tests.support.dynamodb_proxy import FailingDynamoDBProxy
from tests.support.http import bearer, issue_key, running, stream, text_of, user_message


def durable_settings(
    env: pytest.MonkeyPatch,
    redis_server: RedisServer,
    dynamodb_server: DynamoDBServer,
    dynamodb_url: str,
) -> Settings:
    """Settings for history and state on DynamoDB at ``dynamodb_url`` (moto's server, or a
    proxy in front of it) and memory on Redis, with moto's credentials set in ``env``."""
    env.setenv("AWS_ACCESS_KEY_ID", LOCAL_AWS_CREDENTIALS["aws_access_key_id"])
    env.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_AWS_CREDENTIALS["aws_secret_access_key"])
    return load_settings(
        session_history_backend="dynamodb",
        state_backend="dynamodb",
        memory_backend="redis",
        redis_url=redis_server.url,
        dynamodb_endpoint_url=dynamodb_url,
        aws_region=dynamodb_server.region,
    )


@pytest.fixture(scope="module")
def durable(
    redis_server: RedisServer, dynamodb_server: DynamoDBServer
) -> Iterator[tuple[str, str, str]]:
    """A server on the durable backends, and the keys of two fresh users."""
    with pytest.MonkeyPatch.context() as env:
        settings = durable_settings(
            env, redis_server, dynamodb_server, dynamodb_server.endpoint_url
        )
        store = InMemoryKeyStore()
        first = issue_key(store, f"user-{uuid.uuid4().hex[:8]}")
        second = issue_key(store, f"user-{uuid.uuid4().hex[:8]}")
        app = create_app(settings=settings, agent_app=demo_app, key_store=store)
        with running(app) as url:
            yield url, first, second


def test_a_conversation_is_remembered_across_turns_and_sessions(
    durable: tuple[str, str, str],
) -> None:
    url, key, _ = durable
    with httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client:
        assert client.get("/health").json()["status"] == "healthy"
        told = {"input": [user_message("My name is Alice")], "session_id": "durable"}
        stream(client, "/process", json=told)
        asked = {"input": [user_message("What is my name?")], "session_id": "durable"}
        _, sse = stream(client, "/process", json=asked)
        assert text_of(sse.data) == "Your name is Alice."
        elsewhere = {"input": [user_message("What is my name?")], "session_id": "other"}
        _, recalled = stream(client, "/process", json=elsewhere)
        assert "earlier conversation" in text_of(recalled.data)
        history = client.get("/sessions/durable/messages", params={"limit": 3}).json()
        assert len(history["items"]) == 3 and history["next_cursor"]
        assert client.post("/state/durable", json={"state": {"turns": 2}}).json()["round_id"] == 1
        assert client.get("/state/durable").json()["state"] == {"turns": 2}


def test_users_stay_apart_on_the_durable_backends(durable: tuple[str, str, str]) -> None:
    url, first, second = durable
    with httpx.Client(base_url=url, timeout=30) as client:
        body = {"input": [user_message("My name is Zed")], "session_id": "mine", "stream": False}
        assert client.post("/process", json=body, headers=bearer(first)).status_code == 200
        other = bearer(second)
        assert client.get("/sessions/mine", headers=other).status_code == 404
        hits = client.post("/memory/search", json={"query": "Zed"}, headers=other).json()
        assert hits["items"] == []


def test_erasing_a_users_data_on_the_durable_backends(durable: tuple[str, str, str]) -> None:
    url, first, second = durable
    with httpx.Client(base_url=url, timeout=30) as client:
        runs = []
        for key in (first, second):
            body = {"input": [user_message("My name is Zed")], "session_id": "mine"}
            reply = client.post("/process", json={**body, "stream": False}, headers=bearer(key))
            runs.append(reply.headers["X-Run-Id"])
            client.post("/state/mine", json={"state": {"a": 1}}, headers=bearer(key))
        mine, theirs = bearer(first), bearer(second)
        # The stored run holds the conversation: its events quote the user's input.
        assert "Zed" in client.get(f"/runs/{runs[0]}/events", headers=mine).text
        assert client.delete("/users/me/data", headers=mine).status_code == 204
        assert client.get("/sessions", headers=mine).json()["items"] == []
        assert client.get("/memory", headers=mine).json()["items"] == []
        assert client.get("/state/mine", headers=mine).status_code == 404
        assert client.get(f"/runs/{runs[0]}", headers=mine).status_code == 404
        assert client.get(f"/runs/{runs[0]}/events", headers=mine).status_code == 404
        assert len(client.get("/sessions", headers=theirs).json()["items"]) == 1
        assert client.get("/memory", headers=theirs).json()["items"] != []
        assert client.get("/state/mine", headers=theirs).status_code == 200
        assert client.get(f"/runs/{runs[1]}", headers=theirs).json()["status"] == "completed"


def test_deleting_a_session_deletes_its_stored_runs(durable: tuple[str, str, str]) -> None:
    url, key, _ = durable
    with httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client:
        runs = {}
        for session in ("forget-me", "keep-me"):
            body = {"input": [user_message("My name is Zed")], "session_id": session}
            reply = client.post("/process", json={**body, "stream": False})
            runs[session] = reply.headers["X-Run-Id"]
        assert client.delete("/sessions/forget-me").status_code == 204
        assert client.get(f"/runs/{runs['forget-me']}").status_code == 404
        assert client.get("/runs", params={"session_id": "forget-me"}).json()["items"] == []
        assert client.get(f"/runs/{runs['keep-me']}").json()["status"] == "completed"


# --- deletes cut short by a store failure ---------------------------------------------


@pytest.fixture
def proxied(
    redis_server: RedisServer, dynamodb_server: DynamoDBServer
) -> Iterator[tuple[str, str, str, FailingDynamoDBProxy]]:
    """A server whose DynamoDB requests pass through a proxy that can make them fail; its
    URL, a fresh user's id and key, and the proxy."""
    with (
        FailingDynamoDBProxy(dynamodb_server.endpoint_url) as proxy,
        pytest.MonkeyPatch.context() as env,
    ):
        settings = durable_settings(env, redis_server, dynamodb_server, proxy.url)
        store = InMemoryKeyStore()
        user = f"user-{uuid.uuid4().hex[:8]}"
        key = issue_key(store, user)
        app = create_app(settings=settings, agent_app=demo_app, key_store=store)
        with running(app) as url:
            yield url, user, key, proxy


def stored_of_user(server: DynamoDBServer, table: str, user: str) -> list[str]:
    """The sort keys of every item of ``table`` whose key holds the user's hash (a Scan, as
    an audit would read the table)."""
    client = boto3.client(
        "dynamodb",
        endpoint_url=server.endpoint_url,
        region_name=server.region,
        **LOCAL_AWS_CREDENTIALS,
    )
    found = []
    for page in client.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
        found += [item["sk"]["S"] for item in page["Items"] if id_hash(user) in item["pk"]["S"]]
    return found


def test_a_session_delete_cut_short_by_a_failure_deletes_everything_when_retried(
    proxied: tuple[str, str, str, FailingDynamoDBProxy], dynamodb_server: DynamoDBServer
) -> None:
    # The retried delete answered 204 and the session read 404, but its messages stayed in
    # the table for good: the session item, the only way to them, had gone first.
    url, user, key, proxy = proxied
    secrets = [{"role": "user", "content": f"secret {i}"} for i in range(30)]
    with httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client:
        added = client.post("/sessions/s1/messages", json={"messages": secrets})
        assert added.status_code == 201
        proxy.fail("BatchWriteItem", marker=f"SESSION#{id_hash(user)}#")
        failed = client.delete("/sessions/s1")
        assert failed.status_code == 503
        assert failed.json()["error"]["code"] == "STORE_UNAVAILABLE"
        assert client.get("/sessions/s1").status_code == 404
        proxy.fail(None)
        assert client.delete("/sessions/s1").status_code == 204
        assert client.get("/sessions/s1").status_code == 404
    assert proxy.refused > 0
    # The user's creation counter (a number) is all that stays.
    assert stored_of_user(dynamodb_server, dynamodb_server.sessions_table, user) == ["COUNTER"]


def test_a_users_erase_cut_short_by_a_failure_deletes_everything_when_retried(
    proxied: tuple[str, str, str, FailingDynamoDBProxy], dynamodb_server: DynamoDBServer
) -> None:
    url, user, key, proxy = proxied
    with httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client:
        for sid in ("s1", "s2", "s3"):
            secrets = [{"role": "user", "content": f"secret {sid} {i}"} for i in range(30)]
            added = client.post(f"/sessions/{sid}/messages", json={"messages": secrets})
            assert added.status_code == 201
            assert client.post(f"/state/{sid}", json={"state": {"secret": sid}}).is_success
        proxy.fail("BatchWriteItem", marker=f"SESSION#{id_hash(user)}#")
        assert client.delete("/users/me/data").status_code == 503
        proxy.fail(None)
        assert client.delete("/users/me/data").status_code == 204
        assert client.get("/sessions").json()["items"] == []
    assert proxy.refused > 0
    assert stored_of_user(dynamodb_server, dynamodb_server.sessions_table, user) == []
    assert stored_of_user(dynamodb_server, dynamodb_server.state_table, user) == []


def test_a_users_erase_whose_state_store_fails_erases_every_other_store(
    proxied: tuple[str, str, str, FailingDynamoDBProxy], dynamodb_server: DynamoDBServer
) -> None:
    url, user, key, proxy = proxied
    with httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client:
        secrets = {"messages": [user_message("my secret is 1234")]}
        assert client.post("/sessions/s1/messages", json=secrets).status_code == 201
        assert client.post("/state/s1", json={"state": {"secret": 1234}}).is_success
        proxy.fail("Query", marker=f"STATE_USER#{id_hash(user)}")
        failed = client.delete("/users/me/data")
        assert failed.status_code == 503
        assert failed.json()["error"]["message"].startswith(
            "could not erase the caller's agent state (the rest of their data is erased): "
        )
        assert stored_of_user(dynamodb_server, dynamodb_server.sessions_table, user) == []
        assert client.get("/state/s1").json()["state"] == {"secret": 1234}
        proxy.fail(None)
        assert client.delete("/users/me/data").status_code == 204
    assert proxy.refused > 0
    assert stored_of_user(dynamodb_server, dynamodb_server.state_table, user) == []
