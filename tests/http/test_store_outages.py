"""The HTTP API while its stores fail under it: a Redis stopped during a run and started
again, a Redis refusing writes in the middle of a turn, stores that stop answering, a
Redis given the wrong password.

Each test has stores of its own (redis-server, moto's DynamoDB server), stopped, frozen or
restarted while the server runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from redis import Redis

from agentscope_serverless import recorder
from agentscope_serverless.app import AgentApp
from agentscope_serverless.auth import InMemoryKeyStore
from agentscope_serverless.http import create_app
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS, DynamoDBServer, RedisServer
from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.services.manager import HEALTH_TIMEOUT_SECONDS
from agentscope_serverless.settings import load_settings
from tests.support.http import bearer, issue_key, running, user_message


def slow_app() -> AgentApp:
    """Answers ``sleep N`` after N seconds, between two pieces of text; echoes anything else."""
    app = AgentApp(app_name="outages")

    @app.query(framework="text")
    async def query(self: Any, msgs: list[Message], **kwargs: Any) -> AsyncIterator[str]:
        text = msgs[-1].get_text_content() or ""
        if text.startswith("sleep "):
            yield "before "
            await asyncio.sleep(float(text.split()[1]))
            yield "after"
            return
        yield f"echo: {text}"

    return app


@contextmanager
def serving(redis: RedisServer, dynamodb: DynamoDBServer | None = None) -> Iterator[httpx.Client]:
    """A server on ``redis`` (and history, state and runs on ``dynamodb`` when given), and a
    client with a user's key."""
    stores: dict[str, Any] = {
        "session_history_backend": "redis",
        "memory_backend": "redis",
        "state_backend": "redis",
        "redis_url": redis.url,
    }
    with pytest.MonkeyPatch.context() as env:
        if dynamodb is not None:
            env.setenv("AWS_ACCESS_KEY_ID", LOCAL_AWS_CREDENTIALS["aws_access_key_id"])
            env.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_AWS_CREDENTIALS["aws_secret_access_key"])
            stores |= {
                "session_history_backend": "dynamodb",
                "state_backend": "dynamodb",
                "dynamodb_endpoint_url": dynamodb.endpoint_url,
                "aws_region": dynamodb.region,
            }
        keys = InMemoryKeyStore()
        key = issue_key(keys, f"user-{uuid.uuid4().hex[:8]}")
        app = create_app(settings=load_settings(**stores), agent_app=slow_app(), key_store=keys)
        with (
            running(app) as url,
            httpx.Client(base_url=url, headers=bearer(key), timeout=60) as client,
        ):
            yield client


def turn(client: httpx.Client, text: str, session_id: str = "s1") -> httpx.Response:
    body = {"input": [user_message(text)], "session_id": session_id, "stream": False}
    return client.post("/process", json=body)


def history(client: httpx.Client, session_id: str = "s1") -> list[tuple[str, str]]:
    response = client.get(f"/sessions/{session_id}/messages")
    assert response.status_code == 200, response.text
    return [
        (m["role"], "".join(part.get("text") or "" for part in m["content"]))
        for m in response.json()["items"]
    ]


def health(client: httpx.Client) -> tuple[int, dict[str, bool], float]:
    began = time.monotonic()
    response = client.get("/health")
    return response.status_code, response.json()["services"], time.monotonic() - began


@pytest.mark.parametrize("backend", ["redis", "dynamodb"])
def test_health_reads_stores_that_stop_answering_as_down_in_bounded_time(backend: str) -> None:
    # A frozen store still accepts connections: each check waits for an answer that never
    # comes. Checked one after the other, at each client's timeout (5 s for Redis, 10 s for
    # DynamoDB), the probe waited 20 to 30 s; they are checked together, each within a bound.
    with RedisServer() as redis, DynamoDBServer() as dynamodb:
        frozen = redis if backend == "redis" else dynamodb
        with serving(redis, dynamodb if backend == "dynamodb" else None) as client:
            assert turn(client, "hi").status_code == 200
            assert health(client)[0] == 200
            frozen.pause()
            try:
                status, services, took = health(client)
            finally:
                frozen.resume()
            assert status == 503 and took < HEALTH_TIMEOUT_SECONDS + 1.5
            down = {"session_history", "state", "runs"} | (
                {"memory"} if backend == "redis" else set()
            )
            assert {name for name, up in services.items() if not up} == down
            status, services, took = health(client)
            assert status == 200 and all(services.values())
            assert turn(client, "again").status_code == 200


def test_a_redis_stopped_during_a_run_fails_it_and_serves_again_once_restarted() -> None:
    with RedisServer() as redis, serving(redis) as client:
        assert turn(client, "hi").status_code == 200
        body = {"input": [user_message("sleep 0.5")], "session_id": "s1"}
        with client.stream("POST", "/process", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            redis.stop()
            last = [line for line in lines if line.startswith("data:")][-1]
        assert '"status":"failed"' in last and '"code":"STORE_UNAVAILABLE"' in last
        assert str(redis.port) not in last and "127.0.0.1" not in last
        assert health(client)[0] == 503
        routes = [
            client.get("/sessions"),
            client.get("/sessions/s1/messages"),
            client.post("/memory/search", json={"query": "hi"}),
            client.post("/state/s1", json={"state": {"step": 1}}),
            turn(client, "down"),
            client.post(
                "/compatible-mode/v1/chat/completions",
                json={"model": "m", "messages": [user_message("down")]},
            ),
        ]
        for response in routes:
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "STORE_UNAVAILABLE"
            assert str(redis.port) not in response.text
        # Started again (empty: it keeps nothing on disk), the same process serves at once:
        # no connection of before the stop is used again, none is left broken.
        redis.start()
        status, services, _ = health(client)
        assert status == 200 and all(services.values())
        assert turn(client, "back").status_code == 200
        assert history(client) == [("user", "back"), ("assistant", "echo: back")]
        assert client.post("/state/s1", json={"state": {"step": 1}}).status_code == 201


def test_a_turn_redis_refuses_to_store_is_not_stored_in_part() -> None:
    with RedisServer() as redis, serving(redis) as client:
        assert turn(client, "hi").status_code == 200
        body = {"input": [user_message("sleep 0.5")], "session_id": "s1"}
        with client.stream("POST", "/process", json=body) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            refuse_writes(redis, True)  # out of memory: reads are answered, writes refused
            try:
                last = [line for line in lines if line.startswith("data:")][-1]
            finally:
                refuse_writes(redis, False)
        assert '"status":"failed"' in last and '"code":"STORE_UNAVAILABLE"' in last
        # Neither the input nor the reply of the failed turn: the turn is stored whole or not.
        assert history(client) == [("user", "hi"), ("assistant", "echo: hi")]
        assert turn(client, "again").status_code == 200
        assert history(client)[2:] == [("user", "again"), ("assistant", "echo: again")]
        memory = client.post("/memory/search", json={"query": "sleep"}).json()["items"]
        assert memory == []


def test_a_keyed_stream_its_store_failed_frees_its_key_and_the_retry_stores_the_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Streamed, the failure is the last event of a 200: that answer was kept for the key,
    # and "retry with the same key" replayed the failure for a day, the turn never stored.
    # The run's last write is tried until the store takes writes again (at 1.5 s).
    monkeypatch.setattr(recorder, "LAST_WRITE_ATTEMPTS", 40)
    with RedisServer() as redis, serving(redis) as client:
        assert turn(client, "hi").status_code == 200
        body = {"input": [user_message("sleep 0.5")], "session_id": "s1"}
        keyed = {"Idempotency-Key": f"k-{uuid.uuid4().hex}"}
        with client.stream("POST", "/process", json=body, headers=keyed) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            refuse_writes(redis, True)  # the turn's write is refused; the run's last is not
            threading.Timer(1.5, refuse_writes, (redis, False)).start()
            last = [line for line in lines if line.startswith("data:")][-1]
        assert '"status":"failed"' in last and '"code":"STORE_UNAVAILABLE"' in last
        assert history(client) == [("user", "hi"), ("assistant", "echo: hi")]
        retried = client.post("/process", json=body, headers=keyed)
        assert retried.status_code == 200, retried.text
        assert "idempotent-replayed" not in retried.headers
        last = [line for line in retried.text.splitlines() if line.startswith("data:")][-1]
        assert '"status":"completed"' in last
        once = [("user", "sleep 0.5"), ("assistant", "before after")]
        assert history(client)[2:] == once
        # Its answer is kept now: the key replays it, and nothing is stored again.
        replayed = client.post("/process", json=body, headers=keyed)
        assert replayed.headers["idempotent-replayed"] == "true"
        assert replayed.text == retried.text
        assert history(client)[2:] == once


CHAT = "/compatible-mode/v1/chat/completions"
RESPONSES = "/compatible-mode/v1/responses"


def refused_while_running(redis: RedisServer, post: Any, text: str = "sleep 0.5") -> httpx.Response:
    """The answer of ``post()``, a run of ``text``, whose turn Redis refuses to store (its
    writes refused from 0.25 s to 1.5 s after the request began; the run's last write is
    tried until they are taken again)."""
    answers: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answers.append(post()))
    thread.start()
    time.sleep(0.25)
    refuse_writes(redis, True)
    threading.Timer(1.25, refuse_writes, (redis, False)).start()
    thread.join()
    return answers[0]


def test_a_keyed_openai_response_its_store_failed_frees_its_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A failed run is a 200 with a failed response, as OpenAI's: that answer was kept for the
    # key, and its retry replayed the failure, the turn never stored.
    monkeypatch.setattr(recorder, "LAST_WRITE_ATTEMPTS", 40)
    with RedisServer() as redis, serving(redis) as client:
        body = {"model": "m", "input": "sleep 0.5"}
        headers = {"X-Session-Id": "s1", "Idempotency-Key": f"k-{uuid.uuid4().hex}"}
        failed = refused_while_running(
            redis, lambda: client.post(RESPONSES, json=body, headers=headers)
        )
        assert failed.status_code == 200, failed.text
        assert failed.json()["status"] == "failed"
        assert history(client) == []
        retried = client.post(RESPONSES, json=body, headers=headers)
        assert "idempotent-replayed" not in retried.headers
        assert retried.json()["status"] == "completed"
        assert history(client) == [("user", "sleep 0.5"), ("assistant", "before after")]


def test_an_sdk_retry_after_its_store_failed_runs_again_and_stores_the_turn_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The 503 told the SDK not to retry; and a retry joined the failed run and got the 503
    # again, the turn never stored.
    monkeypatch.setattr(recorder, "LAST_WRITE_ATTEMPTS", 40)
    with RedisServer() as redis, serving(redis) as client:
        body = {"model": "m", "messages": [{"role": "user", "content": "sleep 0.5"}]}
        tried = {"X-Session-Id": "s1", "X-Stainless-Read-Timeout": "600"}
        failed = refused_while_running(
            redis,
            lambda: client.post(CHAT, json=body, headers={**tried, "X-Stainless-Retry-Count": "0"}),
        )
        assert failed.status_code == 503, failed.text
        assert "X-Should-Retry" not in failed.headers  # the SDK's retry is welcome
        retried = client.post(CHAT, json=body, headers={**tried, "X-Stainless-Retry-Count": "1"})
        assert retried.status_code == 200, retried.text
        assert retried.headers["X-Run-Id"] != failed.headers["X-Run-Id"]
        assert retried.json()["choices"][0]["message"]["content"] == "before after"
        assert history(client) == [("user", "sleep 0.5"), ("assistant", "before after")]


def refuse_writes(redis: RedisServer, refuse: bool) -> None:
    with Redis.from_url(redis.url) as client:
        client.config_set("maxmemory", 1 if refuse else 0)


def test_a_redis_refusing_the_password_given_is_a_503_naming_no_secret() -> None:
    with RedisServer(password="Sup3r-Secret-Pa55") as redis:
        wrong = RedisServer(password="Wr0ng-Pa55", port=redis.port)  # only for its URL
        with serving(wrong) as client:
            status, services, _ = health(client)
            assert status == 503 and not services["session_history"]
            responses = [
                turn(client, "hi"),
                client.get("/sessions"),
                client.post("/memory", json={"messages": [user_message("hi")]}),
                client.get("/state/s1"),
            ]
            for response in responses:
                assert response.status_code == 503, response.text
                assert response.json()["error"]["code"] == "STORE_UNAVAILABLE"
                assert "Pa55" not in response.text


def test_a_memory_store_down_leaves_runs_without_memories_not_users_without_answers() -> None:
    # Memory on Redis, the history (and runs) on DynamoDB: a Redis outage failed every run
    # with a 503 before it began, as the memories handed to the agent could not be searched.
    with RedisServer() as redis, DynamoDBServer() as dynamodb, serving(redis, dynamodb) as client:
        assert turn(client, "hi").status_code == 200
        redis.stop()
        try:
            answer = turn(client, "still there?")
            assert answer.status_code == 200, answer.text
            assert answer.json()["status"] == "completed"
            memory = client.post("/memory/search", json={"query": "there"})
            assert memory.status_code == 503
        finally:
            redis.start()
        assert history(client)[2:] == [
            ("user", "still there?"),
            ("assistant", "echo: still there?"),
        ]
