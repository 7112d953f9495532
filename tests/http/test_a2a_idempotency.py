"""``Idempotency-Key`` on the A2A JSON-RPC route, with the real ``a2a-sdk`` client: a call
that failed (answered with a 200, as JSON-RPC answers errors) frees its key; a retry is the
same call whatever its JSON-RPC id, and its answer carries its own id; a key reused for
another call is a JSON-RPC error the client can read."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import new_text_message
from a2a.types import Role, SendMessageRequest

from agentscope_serverless.app import AgentApp
from agentscope_serverless.http import create_app
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS, RedisServer
from agentscope_serverless.services.session_history.in_memory import InMemorySessionHistoryService
from agentscope_serverless.settings import load_settings
from tests.support.backends import BACKENDS, backend_settings
from tests.support.http import Keys, bearer, running

app = AgentApp(app_name="echo-a2a-keys", app_description="Echoes what it is told.")


@app.query(framework="text")
async def query(self: Any, msgs: Any, session: Any = None, **kwargs: Any) -> AsyncIterator[str]:
    yield msgs[-1].get_text_content() or ""


# The agent of ``held_app`` has begun a reply (its call holds its key), and may end it.
held_began = threading.Event()
held_ends = threading.Event()
held_app = AgentApp(app_name="held-a2a", app_description="Answers once it may.")


@held_app.query(framework="text")
async def held_query(
    self: Any, msgs: Any, session: Any = None, **kwargs: Any
) -> AsyncIterator[str]:
    held_began.set()
    await asyncio.to_thread(held_ends.wait, 30)
    yield "done"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, Keys]]:
    keys = Keys.make()
    with running(create_app(settings=load_settings(), agent_app=app, key_store=keys.store)) as url:
        yield url, keys


@pytest.fixture
def served_on_redis() -> Iterator[tuple[str, Keys, RedisServer]]:
    """A server whose runs (A2A's tasks) are in a Redis of its own, for the test to stop."""
    keys = Keys.make()
    with RedisServer() as redis:
        settings = load_settings(runs_backend="redis", redis_url=redis.url)
        with running(create_app(settings=settings, agent_app=app, key_store=keys.store)) as url:
            yield url, keys, redis


@pytest.fixture(scope="module", params=BACKENDS)
def served_on_backend(request: pytest.FixtureRequest) -> Iterator[tuple[str, Keys]]:
    """A server whose sessions are on the backend ``request.param``."""
    keys = Keys.make()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", LOCAL_AWS_CREDENTIALS["aws_access_key_id"])
        env.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_AWS_CREDENTIALS["aws_secret_access_key"])
        settings = load_settings(**backend_settings(request.param, request))
        with running(create_app(settings=settings, agent_app=app, key_store=keys.store)) as url:
            yield url, keys


def _call(method: str, text: str, call_id: int | str = 1) -> dict[str, Any]:
    if "/" in method:  # A2A 0.3
        message = {"role": "user", "kind": "message", "parts": [{"kind": "text", "text": text}]}
    else:
        message = {"role": "ROLE_USER", "parts": [{"text": text}]}
    message["messageId"] = "m-1"
    return {"jsonrpc": "2.0", "id": call_id, "method": method, "params": {"message": message}}


def _answers(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON-RPC answers of a response: its body, or each event of a stream."""
    if response.headers["content-type"].startswith("text/event-stream"):
        lines = response.text.splitlines()
        return [json.loads(line[5:]) for line in lines if line.startswith("data:")]
    return [response.json()]


@pytest.mark.parametrize(
    ("method", "version"),
    [("SendMessage", "1.0"), ("SendStreamingMessage", "1.0"), ("message/stream", "0.3")],
)
def test_a_call_that_failed_while_its_store_was_down_runs_when_retried_with_its_key(
    served_on_redis: tuple[str, Keys, RedisServer], method: str, version: str
) -> None:
    # The JSON-RPC error (a 200) was kept as the key's answer: the retry, once the store was
    # back, got it again (Idempotent-Replayed) until the key expired, and nothing ran.
    url, keys, redis = served_on_redis
    headers = {**bearer(keys.alice), "A2A-Version": version, "Idempotency-Key": uuid.uuid4().hex}
    call = _call(method, "hello there")
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        redis.stop()
        failed = client.post("/a2a", json=call)
        redis.start()
        assert failed.status_code == 200
        assert "error" in _answers(failed)[0], failed.text
        retried = client.post("/a2a", json=call)
        again = client.post("/a2a", json=call)
    assert "idempotent-replayed" not in retried.headers
    assert all("error" not in answer for answer in _answers(retried)), retried.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == retried.content


async def test_the_sdk_client_retrying_with_the_same_key_gets_the_first_answer(
    served: tuple[str, Keys],
) -> None:
    # The SDK gives every call a new JSON-RPC id, which made its retry another request:
    # answered 409 IDEMPOTENCY_KEY_REUSED, in a body no JSON-RPC client reads.
    url, keys = served
    headers = {**bearer(keys.alice), "Idempotency-Key": uuid.uuid4().hex}
    context_id = f"ctx-{uuid.uuid4().hex[:8]}"
    message = new_text_message("book the flight", context_id=context_id, role=Role.ROLE_USER)
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        config = ClientConfig(httpx_client=http, streaming=False)
        client = await ClientFactory(config).create_from_url(url)
        first = [e async for e in client.send_message(SendMessageRequest(message=message))]
        again = [e async for e in client.send_message(SendMessageRequest(message=message))]
    call = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"contextId": context_id}}
    async with httpx.AsyncClient(headers=bearer(keys.alice), timeout=30) as http:
        tasks = await http.post(f"{url}/a2a", headers={"A2A-Version": "1.0"}, json=call)
    assert again[0].task.id == first[0].task.id
    listed = [task["id"] for task in tasks.json()["result"]["tasks"]]
    assert listed == [first[0].task.id]


@pytest.mark.parametrize("method", ["SendMessage", "SendStreamingMessage", "message/send"])
def test_a_replayed_answer_carries_the_id_of_the_retry(
    served: tuple[str, Keys], method: str
) -> None:
    url, keys = served
    headers = {**bearer(keys.alice), "Idempotency-Key": uuid.uuid4().hex}
    if "/" not in method:
        headers["A2A-Version"] = "1.0"
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        first = client.post("/a2a", json=_call(method, "say it once", call_id=1))
        again = client.post("/a2a", json=_call(method, "say it once", call_id="retry-2"))
    assert again.headers["idempotent-replayed"] == "true"
    assert [answer["id"] for answer in _answers(first)] == [1] * len(_answers(first))
    assert [answer["id"] for answer in _answers(again)] == ["retry-2"] * len(_answers(first))
    assert [{**a, "id": 1} for a in _answers(again)] == _answers(first)


def test_a_key_reused_for_another_call_is_a_json_rpc_error_saying_so(
    served: tuple[str, Keys],
) -> None:
    # It was an HTTP 409 whose body was no JSON-RPC answer: the SDK's client read neither.
    url, keys = served
    headers = {**bearer(keys.alice), "A2A-Version": "1.0", "Idempotency-Key": uuid.uuid4().hex}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        client.post("/a2a", json=_call("SendMessage", "one thing", call_id=1))
        other = client.post("/a2a", json=_call("SendMessage", "another thing", call_id=7))
    assert other.status_code == 200
    answer = other.json()
    assert (answer["jsonrpc"], answer["id"], answer["error"]["code"]) == ("2.0", 7, -32600)
    data = answer["error"]["data"]
    assert (data["status"], data["code"]) == (409, "IDEMPOTENCY_KEY_REUSED")
    assert data["message"] == answer["error"]["message"]


def test_a_retry_is_the_same_call_however_its_json_is_spaced_or_ordered(
    served: tuple[str, Keys],
) -> None:
    url, keys = served
    headers = {**bearer(keys.alice), "A2A-Version": "1.0", "Idempotency-Key": uuid.uuid4().hex}
    call = _call("SendMessage", "in any order", call_id=3)
    reordered = json.dumps(dict(reversed(list(call.items()))), indent=2)
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        first = client.post("/a2a", json=call)
        again = client.post("/a2a", content=reordered, headers={"Content-Type": "application/json"})
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/a2a", "SendMessage"),
        ("/a2a", "SendStreamingMessage"),
        ("/a2a", "message/send"),
        ("/a2a/message:send", None),
        ("/a2a/message:stream", None),
    ],
)
def test_deleting_the_session_of_a_keyed_message_forgets_its_key(
    served_on_backend: tuple[str, Keys], path: str, method: str | None
) -> None:
    # The message's run wrote in its context's session, but its key's record was not listed
    # under it: deleting the session left the answer quoting it, replayed to the retry.
    url, keys = served_on_backend
    context_id = f"ctx-{uuid.uuid4().hex[:8]}"
    if method is None:
        message = {"role": "ROLE_USER", "messageId": "m-1", "parts": [{"text": "remember me"}]}
        body: dict[str, Any] = {"message": {**message, "contextId": context_id}}
    else:
        body = _call(method, "remember me")
        body["params"]["message"]["contextId"] = context_id
    headers = {**bearer(keys.alice), "Idempotency-Key": uuid.uuid4().hex}
    if method is None or "/" not in method:
        headers["A2A-Version"] = "1.0"
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        first = client.post(path, json=body, headers=headers)
        assert first.is_success and "error" not in _answers(first)[0], first.text
        assert client.delete(f"/sessions/{context_id}").status_code == 204
        retried = client.post(path, json=body, headers=headers)
        messages = client.get(f"/sessions/{context_id}/messages")
    assert retried.is_success and "idempotent-replayed" not in retried.headers
    assert len(messages.json()["items"]) == 2  # the message and its reply, anew


def test_a_call_retried_while_the_first_still_runs_is_a_json_rpc_error_saying_so() -> None:
    # It was an HTTP 409 whose body was no JSON-RPC answer (no jsonrpc, no id): the SDK's
    # client raised a bare HTTP error.
    keys = Keys.make()
    held_began.clear()
    held_ends.clear()
    headers = {**bearer(keys.alice), "A2A-Version": "1.0", "Idempotency-Key": uuid.uuid4().hex}
    with (
        running(
            create_app(settings=load_settings(), agent_app=held_app, key_store=keys.store)
        ) as url,
        httpx.Client(base_url=url, headers=headers, timeout=30) as client,
    ):
        answered: list[httpx.Response] = []
        call = _call("SendMessage", "take your time", call_id=1)
        first = threading.Thread(target=lambda: answered.append(client.post("/a2a", json=call)))
        first.start()
        try:
            assert held_began.wait(30)
            retried = client.post("/a2a", json={**call, "id": "retry-2"})
        finally:
            held_ends.set()
            first.join(30)
    assert retried.status_code == 200
    answer = retried.json()
    assert (answer["jsonrpc"], answer["id"], answer["error"]["code"]) == ("2.0", "retry-2", -32600)
    data = answer["error"]["data"]
    assert (data["status"], data["code"]) == (409, "REQUEST_IN_PROGRESS")
    assert data["retry_after"] >= 1
    assert retried.headers["retry-after"] == str(data["retry_after"])
    [done] = answered
    assert "error" not in done.json(), done.text


@pytest.fixture
def keys_on_redis() -> Iterator[tuple[str, Keys, RedisServer]]:
    """A server whose sessions, and so its keys' records, are in a Redis of its own, for the
    test to stop."""
    keys = Keys.make()
    with RedisServer() as redis:
        settings = load_settings(session_history_backend="redis", redis_url=redis.url)
        with running(create_app(settings=settings, agent_app=app, key_store=keys.store)) as url:
            yield url, keys, redis


def test_a_call_whose_key_cannot_be_claimed_with_its_store_down_is_a_json_rpc_error(
    keys_on_redis: tuple[str, Keys, RedisServer],
) -> None:
    # It was an HTTP 503 whose body was no JSON-RPC answer.
    url, keys, redis = keys_on_redis
    headers = {**bearer(keys.alice), "A2A-Version": "1.0", "Idempotency-Key": uuid.uuid4().hex}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        redis.stop()
        try:
            failed = client.post("/a2a", json=_call("SendMessage", "hello", call_id=5))
        finally:
            redis.start()
    assert failed.status_code == 200
    answer = failed.json()
    assert (answer["jsonrpc"], answer["id"], answer["error"]["code"]) == ("2.0", 5, -32603)
    assert (answer["error"]["data"]["status"], answer["error"]["data"]["code"]) == (
        503,
        "STORE_UNAVAILABLE",
    )


class _RunsHeldBeforeTheirSession(InMemorySessionHistoryService):
    """Sessions in memory; while ``hold`` is set, a run stops before it opens its session
    (the runner checks the ids of its input first), until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = threading.Event()
        self.holding = threading.Event()
        self.release = threading.Event()

    async def refuse_changed_messages(
        self, user_id: str, session_id: str, messages: list[Any], **options: Any
    ) -> set[str]:
        if self.hold.is_set():
            self.holding.set()
            await asyncio.to_thread(self.release.wait, 30)
        return await super().refuse_changed_messages(user_id, session_id, messages, **options)


@pytest.mark.parametrize(
    ("path", "method"),
    [("/a2a", "message/send"), ("/a2a", "SendMessage"), ("/a2a/message:send", None)],
)
def test_a_message_not_waited_for_retried_before_its_run_began_is_replayed(
    path: str, method: str | None
) -> None:
    # The answer (and its key's record, naming the context's session) was made before the
    # run created the session: a retry then found no session, took the key's record for
    # one of an expired session, and ran the message again, a second task.
    history = _RunsHeldBeforeTheirSession()
    held = AgentApp(app_name="echo-a2a-held", session_history_service=history)
    held.query(framework="text")(query)
    keys = Keys.make()
    context_id = f"ctx-{uuid.uuid4().hex[:8]}"
    if method == "message/send":
        body = _call(method, "do it later")
        body["params"]["configuration"] = {"blocking": False}
    else:
        message = {"role": "ROLE_USER", "messageId": "m-1", "parts": [{"text": "do it later"}]}
        params: dict[str, Any] = {"message": message, "configuration": {"returnImmediately": True}}
        body = params if method is None else {**_call("SendMessage", ""), "params": params}
    body_message = body["params"]["message"] if "params" in body else body["message"]
    body_message["contextId"] = context_id
    headers = {**bearer(keys.alice), "Idempotency-Key": uuid.uuid4().hex}
    if method != "message/send":
        headers["A2A-Version"] = "1.0"
    history.hold.set()
    with (
        running(create_app(settings=load_settings(), agent_app=held, key_store=keys.store)) as url,
        httpx.Client(base_url=url, headers=headers, timeout=30) as client,
    ):
        try:
            first = client.post(path, json=body)
            assert history.holding.wait(30)
            retried = client.post(path, json=body)
        finally:
            history.release.set()
    assert first.is_success and "error" not in first.text, first.text
    assert retried.headers.get("idempotent-replayed") == "true", retried.text
    assert retried.json() == first.json()
