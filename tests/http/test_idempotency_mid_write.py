"""A write retried with its ``Idempotency-Key`` is stored once when its store froze while
the *data* write was in flight: the key was claimed, the write timed out (503) but landed
once the store went on, and the retry runs the request again (SIGSTOP on the server the
test started, at the moment the request sends its data write)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from agentscope_serverless.agents.demo import app as demo_app
from agentscope_serverless.auth import InMemoryKeyStore
from agentscope_serverless.http import create_app
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS, DynamoDBServer, RedisServer
from agentscope_serverless.services._dynamodb import DynamoDBStore
from agentscope_serverless.services._redis import RedisStore
from agentscope_serverless.settings import load_settings
from tests.support.http import bearer, issue_key, running


def text_message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


class FreezeAtWrite:
    """Freezes the store when the request it is armed for sends its data write."""

    def __init__(self, pause: Callable[[], None]) -> None:
        self._pause = pause
        self.armed = False

    def __call__(self, is_data_write: bool) -> None:
        if self.armed and is_data_write:
            self.armed = False
            self._pause()


@pytest.fixture
def redis_frozen_at_write(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[RedisServer, FreezeAtWrite]]:
    with RedisServer() as redis:
        hook = FreezeAtWrite(redis.pause)
        original = RedisStore.run

        async def run(
            self: RedisStore, script: str, keys: Any, args: Any, *, idempotent: bool
        ) -> Any:
            # The first call after the key is claimed that is not about the key: the write.
            hook(not any(":idempotency:" in key for key in keys))
            return await original(self, script, keys, args, idempotent=idempotent)

        monkeypatch.setattr(RedisStore, "run", run)
        try:
            yield redis, hook
        finally:
            redis.resume()


@pytest.fixture
def dynamodb_frozen_at_write(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[DynamoDBServer, FreezeAtWrite]]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", LOCAL_AWS_CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_AWS_CREDENTIALS["aws_secret_access_key"])
    with DynamoDBServer() as dynamodb:
        hook = FreezeAtWrite(dynamodb.pause)
        original = DynamoDBStore.run

        async def run(
            self: DynamoDBStore, operation: str, *, idempotent: bool, **kwargs: Any
        ) -> dict[str, Any]:
            # The put of a state round (after the round was allocated and the save keyed).
            sort_key = kwargs.get("Item", {}).get("sk", {}).get("S", "")
            hook(operation == "put_item" and sort_key.startswith("R#"))
            return await original(self, operation, idempotent=idempotent, **kwargs)

        monkeypatch.setattr(DynamoDBStore, "run", run)
        try:
            yield dynamodb, hook
        finally:
            dynamodb.resume()


def keyed(key: str) -> dict[str, str]:
    return {"Idempotency-Key": key}


def eventually(read: Callable[[], Any], expected: Any) -> None:
    """Wait (bounded) until ``read()`` gives ``expected``: the frozen write has landed."""
    for _ in range(240):
        if read() == expected:
            return
        time.sleep(0.25)
    assert read() == expected


def frozen_write_then_retry(
    client: httpx.Client,
    hook: FreezeAtWrite,
    resume: Callable[[], None],
    key: str,
    path: str,
    body: dict[str, Any],
    landed: Callable[[], Any],
    expected: Any,
) -> None:
    hook.armed = True
    try:
        first = client.post(path, json=body, headers=keyed(key))
    finally:
        resume()
    assert not hook.armed, "the store was not frozen at the write"
    assert first.status_code == 503, first.text
    assert first.json()["error"]["code"] == "STORE_UNAVAILABLE"
    # The write that timed out lands once the store goes on ...
    eventually(landed, expected)
    # ... and the client, which only saw the 503, retries with the same key.
    for _ in range(120):
        retried = client.post(path, json=body, headers=keyed(key))
        if retried.status_code not in (409, 503):
            break
        time.sleep(0.5)
    assert retried.is_success, retried.text
    assert landed() == expected
    again = client.post(path, json=body, headers=keyed(key))
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.content == retried.content


def warm_up(url: str, store: InMemoryKeyStore) -> None:
    """Another user writes first: the store has met every write (Redis: its scripts are
    loaded), so what is sent to the frozen store is the write itself."""
    api_key = issue_key(store, f"warm-{uuid.uuid4().hex[:10]}")
    with httpx.Client(base_url=url, headers=bearer(api_key), timeout=120) as client:
        for path, body in [
            ("/state/s1", {"state": {"v": 0}}),
            ("/memory", {"messages": [text_message("warm")], "session_id": "s1"}),
            ("/sessions", {}),
        ]:
            assert client.post(path, json=body).is_success


def state_rounds(client: httpx.Client) -> Callable[[], Any]:
    return lambda: client.get("/state/s1/rounds").json()["rounds"]


@pytest.mark.timeout(300)
def test_writes_frozen_mid_write_on_redis_are_stored_once_when_retried(
    redis_frozen_at_write: tuple[RedisServer, FreezeAtWrite],
) -> None:
    redis, hook = redis_frozen_at_write
    settings = load_settings(
        session_history_backend="redis",
        memory_backend="redis",
        state_backend="redis",
        redis_url=redis.url,
        idempotency_lease_seconds=1.0,
    )
    store = InMemoryKeyStore()
    app = create_app(settings=settings, agent_app=demo_app, key_store=store)
    with running(app) as url:
        warm_up(url, store)
        api_key = issue_key(store, f"user-{uuid.uuid4().hex[:10]}")
        with httpx.Client(base_url=url, headers=bearer(api_key), timeout=120) as client:
            # A state save without a round: one round, whose state is the request's.
            frozen_write_then_retry(
                client,
                hook,
                redis.resume,
                "state",
                "/state/s1",
                {"state": {"v": 1}},
                state_rounds(client),
                [1],
            )
            assert client.get("/state/s1").json()["state"] == {"v": 1}
            # A memory add: remembered once.
            frozen_write_then_retry(
                client,
                hook,
                redis.resume,
                "memory",
                "/memory",
                {"messages": [text_message("green tea")], "session_id": "s1"},
                lambda: [m["content"][0]["text"] for m in client.get("/memory").json()["items"]],
                ["green tea"],
            )
            # A session created without an id: one session.
            frozen_write_then_retry(
                client,
                hook,
                redis.resume,
                "session",
                "/sessions",
                {},
                lambda: len(client.get("/sessions").json()["items"]),
                1,
            )


@pytest.mark.timeout(300)
def test_a_state_save_frozen_mid_write_on_dynamodb_is_stored_once_when_retried(
    dynamodb_frozen_at_write: tuple[DynamoDBServer, FreezeAtWrite],
) -> None:
    dynamodb, hook = dynamodb_frozen_at_write
    settings = load_settings(
        session_history_backend="dynamodb",
        state_backend="dynamodb",
        dynamodb_endpoint_url=dynamodb.endpoint_url,
        aws_region=dynamodb.region,
        idempotency_lease_seconds=1.0,
    )
    store = InMemoryKeyStore()
    app = create_app(settings=settings, agent_app=demo_app, key_store=store)
    with running(app) as url:
        warm_up(url, store)
        api_key = issue_key(store, f"user-{uuid.uuid4().hex[:10]}")
        with httpx.Client(base_url=url, headers=bearer(api_key), timeout=120) as client:
            frozen_write_then_retry(
                client,
                hook,
                dynamodb.resume,
                "state",
                "/state/s1",
                {"state": {"v": 1}},
                state_rounds(client),
                [1],
            )
            assert client.get("/state/s1").json()["state"] == {"v": 1}
