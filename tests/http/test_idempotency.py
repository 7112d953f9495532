"""``Idempotency-Key``: a retried write is answered once and stored once, on every backend,
including when the store froze in the middle (SIGSTOP on the server the test started)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from agentscope_serverless.agents.demo import app as demo_app
from agentscope_serverless.app import AgentApp
from agentscope_serverless.auth import InMemoryKeyStore
from agentscope_serverless.errors import SandboxCapacityError
from agentscope_serverless.http import create_app
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS, DynamoDBServer, RedisServer
from agentscope_serverless.services.factory import create_runs_service
from agentscope_serverless.services.runs import InMemoryRunsService, RunsService
from agentscope_serverless.services.runs.base import LOST_AFTER_SECONDS
from agentscope_serverless.settings import load_settings
from tests.support.backends import BACKENDS, backend_settings
from tests.support.http import (
    bearer,
    issue_key,
    parse_sse,
    posted_at_once,
    running,
    stream,
    text_of,
)

# Long enough for a test's requests to replay before it, on a loaded machine.
EXPIRY_SECONDS = 5
# For the tests that wait for keys to expire: they replay nothing before.
SHORT_EXPIRY_SECONDS = 1


def text_message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


@contextlib.contextmanager
def serving(
    request: pytest.FixtureRequest, expiry_seconds: int
) -> Iterator[tuple[str, InMemoryKeyStore]]:
    """The demo app on the backend ``request.param``, keeping keys ``expiry_seconds``."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", LOCAL_AWS_CREDENTIALS["aws_access_key_id"])
        env.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_AWS_CREDENTIALS["aws_secret_access_key"])
        settings = load_settings(
            **backend_settings(request.param, request),
            idempotency_expiry_seconds=expiry_seconds,
        )
        store = InMemoryKeyStore()
        with running(create_app(settings=settings, agent_app=demo_app, key_store=store)) as url:
            yield url, store


@contextlib.contextmanager
def user_client(server: tuple[str, InMemoryKeyStore]) -> Iterator[httpx.Client]:
    """A client of ``server`` with the key of a new user."""
    url, store = server
    key = issue_key(store, f"user-{uuid.uuid4().hex[:10]}")
    with httpx.Client(base_url=url, headers=bearer(key), timeout=60) as http:
        yield http


@pytest.fixture(scope="module", params=BACKENDS)
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, InMemoryKeyStore]]:
    with serving(request, EXPIRY_SECONDS) as served:
        yield served


@pytest.fixture(scope="module", params=BACKENDS)
def expiring_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, InMemoryKeyStore]]:
    with serving(request, SHORT_EXPIRY_SECONDS) as served:
        yield served


@pytest.fixture
def client(server: tuple[str, InMemoryKeyStore]) -> Iterator[httpx.Client]:
    with user_client(server) as http:
        yield http


@pytest.fixture
def expiring_client(expiring_server: tuple[str, InMemoryKeyStore]) -> Iterator[httpx.Client]:
    with user_client(expiring_server) as http:
        yield http


def keyed(key: str) -> dict[str, str]:
    return {"Idempotency-Key": key}


def message_texts(client: httpx.Client, session_id: str) -> list[str]:
    items = client.get(f"/sessions/{session_id}/messages").json()["items"]
    return [m["content"][0]["text"] for m in items]


def test_a_retry_gets_the_first_answer_and_writes_nothing(client: httpx.Client) -> None:
    body = {"messages": [text_message("hello")]}
    first = client.post("/sessions/s1/messages", json=body, headers=keyed("k-append"))
    again = client.post("/sessions/s1/messages", json=body, headers=keyed("k-append"))
    assert first.status_code == again.status_code == 201
    assert again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert message_texts(client, "s1") == ["hello"]

    saved = client.post("/state/s1", json={"state": {"v": 1}}, headers=keyed("k-state"))
    resaved = client.post("/state/s1", json={"state": {"v": 1}}, headers=keyed("k-state"))
    assert saved.json() == resaved.json() == {"session_id": "s1", "round_id": 1}
    assert client.get("/state/s1/rounds").json()["rounds"] == [1]

    run = {"input": [text_message("hi")], "session_id": "s2", "stream": False}
    ran = client.post("/process", json=run, headers=keyed("k-run"))
    rerun = client.post("/process", json=run, headers=keyed("k-run"))
    assert ran.status_code == 200 and rerun.content == ran.content
    assert len(message_texts(client, "s2")) == 2  # the question and the one answer


def test_a_search_with_a_key_used_before_reads_anew(client: httpx.Client) -> None:
    # A search is a read: its answer was kept, and a later search with its key was told
    # what was remembered then, not what had been remembered since.
    search = {"query": "tea"}
    first = client.post("/memory/search", json=search, headers=keyed("k-search"))
    assert first.status_code == 200 and first.json()["items"] == []
    remembered = {"messages": [text_message("I like green tea")]}
    assert client.post("/memory", json=remembered).status_code == 201
    again = client.post("/memory/search", json=search, headers=keyed("k-search"))
    assert again.status_code == 200
    assert "Idempotent-Replayed" not in again.headers
    assert [m["content"][0]["text"] for m in again.json()["items"]] == ["I like green tea"]
    # Nor is the key claimed: a write may take it.
    saved = client.post("/state/s1", json={"state": {"v": 1}}, headers=keyed("k-search"))
    assert saved.status_code == 201


def test_the_same_key_with_another_request_is_a_conflict(client: httpx.Client) -> None:
    assert client.post("/state/s1", json={"state": {"v": 1}}, headers=keyed("k")).is_success
    other = client.post("/state/s1", json={"state": {"v": 2}}, headers=keyed("k"))
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    elsewhere = client.post("/state/s2", json={"state": {"v": 1}}, headers=keyed("k"))
    assert elsewhere.status_code == 409
    assert client.get("/state/s1").json()["state"] == {"v": 1}


def test_a_conflict_no_retry_can_mend_tells_clients_not_to_retry(client: httpx.Client) -> None:
    # OpenAI's SDKs retry a 409 unless told not to: these 409s answer every retry the same.
    assert client.post("/state/s1", json={"state": {"v": 1}}, headers=keyed("k-1")).is_success
    other = client.post("/state/s1", json={"state": {"v": 2}}, headers=keyed("k-1"))
    assert (other.status_code, other.headers.get("X-Should-Retry")) == (409, "false")
    # An answer too large to keep (300 KB of messages appended back) is not repeated.
    body = {"messages": [text_message("x" * 300_000)]}
    appended = client.post("/sessions/big/messages", json=body, headers=keyed("k-2"))
    assert appended.is_success
    again = client.post("/sessions/big/messages", json=body, headers=keyed("k-2"))
    assert again.json()["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert (again.status_code, again.headers.get("X-Should-Retry")) == (409, "false")


def test_the_same_key_and_body_with_another_session_header_is_a_conflict(
    client: httpx.Client,
) -> None:
    url = "/compatible-mode/v1/chat/completions"
    body = {"model": "demo", "messages": [text_message("My name is Alice")]}
    first = client.post(url, json=body, headers={**keyed("k-s"), "X-Session-Id": "one"})
    assert first.status_code == 200 and first.headers["X-Session-Id"] == "one"
    other = client.post(url, json=body, headers={**keyed("k-s"), "X-Session-Id": "two"})
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert client.get("/sessions/two").status_code == 404  # nothing ran


def test_erasing_a_users_data_forgets_their_keys(server: tuple[str, InMemoryKeyStore]) -> None:
    url, store = server
    run = {"input": [text_message("My name is Alice")], "session_id": "s", "stream": False}
    clients = [
        httpx.Client(base_url=url, headers=bearer(issue_key(store, f"u-{uuid.uuid4().hex[:8]}")))
        for _ in range(2)
    ]
    with clients[0] as mine, clients[1] as theirs:
        for client in (mine, theirs):
            assert "Alice" in client.post("/process", json=run, headers=keyed("k")).text
        assert mine.delete("/users/me/data").status_code == 204
        replayed = theirs.post("/process", json=run, headers=keyed("k"))
        assert replayed.headers["Idempotent-Replayed"] == "true"
        # The stored answer (which quotes the conversation) is gone: the request runs anew.
        again = mine.post("/process", json=run, headers=keyed("k"))
        assert again.status_code == 200 and "Idempotent-Replayed" not in again.headers
        assert len(message_texts(mine, "s")) == 2


def test_deleting_a_session_forgets_the_keys_of_its_requests(client: httpx.Client) -> None:
    run = {"input": [text_message("My name is Alice")], "session_id": "s", "stream": False}
    append = {"messages": [text_message("hello")]}
    kept = {**run, "session_id": "kept"}
    assert client.post("/process", json=run, headers=keyed("k-run")).is_success
    assert client.post("/sessions/t/messages", json=append, headers=keyed("k-add")).is_success
    assert client.post("/sessions", json={"session_id": "u"}, headers=keyed("k-new")).is_success
    assert client.post("/process", json=kept, headers=keyed("k-kept")).is_success
    for session_id in ("s", "t", "u"):
        assert client.delete(f"/sessions/{session_id}").status_code == 204
    # Their stored answers (quoting what was deleted) are gone: the requests run anew.
    again = client.post("/process", json=run, headers=keyed("k-run"))
    assert again.status_code == 200 and "Idempotent-Replayed" not in again.headers
    assert len(message_texts(client, "s")) == 2
    added = client.post("/sessions/t/messages", json=append, headers=keyed("k-add"))
    assert added.status_code == 201 and "Idempotent-Replayed" not in added.headers
    assert message_texts(client, "t") == ["hello"]
    created = client.post("/sessions", json={"session_id": "u"}, headers=keyed("k-new"))
    assert created.status_code == 201 and "Idempotent-Replayed" not in created.headers
    assert client.get("/sessions/u").status_code == 200
    replayed = client.post("/process", json=kept, headers=keyed("k-kept"))
    assert replayed.headers["Idempotent-Replayed"] == "true"


def test_a_keyed_state_save_goes_with_its_session(client: httpx.Client) -> None:
    # A session holding only state (no history): a retry is replayed while its state lives.
    save = {"state": {"step": 1}}
    first = client.post("/state/s", json=save, headers=keyed("k-save"))
    again = client.post("/state/s", json=save, headers=keyed("k-save"))
    assert first.status_code == again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true" and again.content == first.content
    assert client.get("/state/s/rounds").json()["rounds"] == [1]
    # The session deleted (its state with it), the retry runs anew and is stored.
    assert client.delete("/sessions/s").status_code == 204
    anew = client.post("/state/s", json=save, headers=keyed("k-save"))
    assert anew.status_code == 201 and "Idempotent-Replayed" not in anew.headers
    assert client.get("/state/s").json() == {
        "session_id": "s",
        "round_id": 1,
        "state": save["state"],
    }
    replayed = client.post("/state/s", json=save, headers=keyed("k-save"))
    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert client.get("/state/s/rounds").json()["rounds"] == [1]


def test_a_keyed_state_save_goes_with_the_state_deleted(client: httpx.Client) -> None:
    # The session itself stays (it has history): only its state is deleted.
    assert client.post("/sessions", json={"session_id": "s"}).status_code == 201
    save = {"state": {"step": 1}}
    assert client.post("/state/s", json=save, headers=keyed("k-save")).status_code == 201
    assert client.delete("/state/s").status_code == 204
    anew = client.post("/state/s", json=save, headers=keyed("k-save"))
    assert anew.status_code == 201 and "Idempotent-Replayed" not in anew.headers
    assert client.get("/state/s").json()["state"] == save["state"]


def test_keys_belong_to_their_user(server: tuple[str, InMemoryKeyStore]) -> None:
    url, store = server
    for name in ("first", "second"):
        key = issue_key(store, f"{name}-{uuid.uuid4().hex[:8]}")
        with httpx.Client(base_url=url, headers=bearer(key), timeout=30) as http:
            saved = http.post("/state/s", json={"state": {"who": name}}, headers=keyed("shared"))
            assert saved.status_code == 201 and "Idempotent-Replayed" not in saved.headers


def test_keys_expire(expiring_client: httpx.Client) -> None:
    first = expiring_client.post("/state/s1", json={"state": {"v": 1}}, headers=keyed("k"))
    assert first.is_success
    time.sleep(SHORT_EXPIRY_SECONDS + 1.5)
    later = expiring_client.post("/state/s1", json={"state": {"v": 2}}, headers=keyed("k"))
    assert later.status_code == 201 and later.json()["round_id"] == 2


def test_a_keyed_save_sent_again_after_its_key_expired_is_the_latest_round(
    expiring_client: httpx.Client,
) -> None:
    # It was answered round 1 again, overwriting round 1 (its write id was remembered for a
    # day), and the state read back stayed the save made after it.
    save = {"state": {"step": 1}}
    first = expiring_client.post("/state/s1", json=save, headers=keyed("k"))
    assert first.json()["round_id"] == 1
    assert expiring_client.post("/state/s1", json={"state": {"step": 2}}).json()["round_id"] == 2
    time.sleep(SHORT_EXPIRY_SECONDS + 1.5)
    again = expiring_client.post("/state/s1", json=save, headers=keyed("k"))
    assert again.status_code == 201 and "Idempotent-Replayed" not in again.headers
    assert again.json()["round_id"] == 3
    latest = expiring_client.get("/state/s1").json()
    assert (latest["round_id"], latest["state"]) == (3, {"step": 1})
    assert expiring_client.get("/state/s1", params={"round_id": 1}).json()["state"] == {"step": 1}


def test_a_request_run_again_after_its_key_expired_appends_nothing_twice(
    expiring_client: httpx.Client,
) -> None:
    append = {"messages": [text_message("once")]}
    run = {"input": [text_message("hi")], "session_id": "s2", "stream": False}
    assert expiring_client.post("/sessions/s1/messages", json=append, headers=keyed("a")).is_success
    assert expiring_client.post("/process", json=run, headers=keyed("r")).is_success
    time.sleep(SHORT_EXPIRY_SECONDS + 1.5)  # as if the first answers were lost and the keys freed
    again = expiring_client.post("/sessions/s1/messages", json=append, headers=keyed("a"))
    assert again.status_code == 201 and "Idempotent-Replayed" not in again.headers
    assert expiring_client.post("/process", json=run, headers=keyed("r")).is_success
    assert message_texts(expiring_client, "s1") == ["once"]
    assert len(message_texts(expiring_client, "s2")) == 2


def test_a_failed_request_frees_its_key(client: httpx.Client) -> None:
    refused = client.post("/state/s1", json={"state": "not a dict"}, headers=keyed("k"))
    assert refused.status_code == 422
    assert client.post("/state/s1", json={"state": {"v": 1}}, headers=keyed("k")).is_success


def test_a_bad_key_is_refused(client: httpx.Client) -> None:
    for key in ("", "has space", "x" * 256):
        response = client.post("/state/s1", json={"state": {}}, headers=keyed(key))
        assert response.status_code == 422, key
    assert client.get("/state/s1/rounds").json()["rounds"] == []


@pytest.mark.parametrize("path", ["/process", "/state/s1"])
def test_a_bad_key_is_refused_saying_why_once(client: httpx.Client, path: str) -> None:
    # /process said each problem twice ("...at most 255 characters; ...at most 255...").
    body = {"input": [{"role": "user", "content": "hi"}], "stream": False, "state": {}}
    response = client.post(path, json=body, headers=keyed("x" * 256))
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert message.count("at most 255 characters") == 1, message


def saved_at_once(client: httpx.Client, save: dict[str, Any], key: str) -> list[httpx.Response]:
    """Eight retries of the keyed state save ``save``, sent at the same moment: each is
    answered 201 (the save, or its replay) or 409 (still in progress, with a Retry-After)."""
    answers = posted_at_once(client, "/state/s1", [save] * 8, headers=keyed(key))
    assert {a.status_code for a in answers} <= {201, 409}
    assert any(a.status_code == 201 for a in answers)
    for answer in answers:
        if answer.status_code == 409:
            assert answer.json()["error"]["code"] == "REQUEST_IN_PROGRESS"
            assert int(answer.headers["Retry-After"]) >= 1
    return answers


def test_concurrent_retries_with_one_key_write_once(client: httpx.Client) -> None:
    saved_at_once(client, {"state": {"v": 1}}, "burst")
    assert client.get("/state/s1/rounds").json()["rounds"] == [1]


def test_concurrent_retries_of_a_key_that_expired_write_one_new_round(
    expiring_client: httpx.Client,
) -> None:
    save = {"state": {"v": 1}}
    assert expiring_client.post("/state/s1", json=save, headers=keyed("k")).is_success
    time.sleep(SHORT_EXPIRY_SECONDS + 1.5)
    answers = saved_at_once(expiring_client, save, "k")
    assert {a.json()["round_id"] for a in answers if a.status_code == 201} == {2}
    assert expiring_client.get("/state/s1/rounds").json()["rounds"] == [1, 2]


# --- a request that runs longer than its lease --------------------------------------------

LEASE_SECONDS = 0.5


def gated_app(entered: threading.Event, gate: threading.Event) -> AgentApp:
    """An agent that says when it is called, then answers once ``gate`` opens."""
    app = AgentApp(app_name="gated")

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        entered.set()
        await asyncio.to_thread(gate.wait, 30)
        yield "answered"

    return app


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_retry_while_a_run_outlasts_its_lease_does_not_run_it_again(
    backend: str, aws_env: None, user_id: str, request: pytest.FixtureRequest
) -> None:
    entered, gate = threading.Event(), threading.Event()
    settings = load_settings(
        **backend_settings(backend, request), idempotency_lease_seconds=LEASE_SECONDS
    )
    store = InMemoryKeyStore()
    app = create_app(settings=settings, agent_app=gated_app(entered, gate), key_store=store)
    run = {"input": [text_message("hi")], "session_id": "s", "stream": False}
    with (
        running(app) as url,
        httpx.Client(base_url=url, headers=bearer(issue_key(store, user_id)), timeout=60) as client,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        try:
            first = pool.submit(client.post, "/process", json=run, headers=keyed("long"))
            assert entered.wait(30)
            entered.clear()
            # The first request's lease has run out three times over by the clock: a lease
            # is time itself.
            time.sleep(3 * LEASE_SECONDS)
            retried = client.post("/process", json=run, headers=keyed("long"))
            assert retried.status_code == 409, retried.text
            assert retried.json()["error"]["code"] == "REQUEST_IN_PROGRESS"
            assert not entered.is_set()  # the agent was not called again
        finally:
            gate.set()
        answered = first.result()
        assert answered.status_code == 200
        replayed = client.post("/process", json=run, headers=keyed("long"))
        assert replayed.headers["Idempotent-Replayed"] == "true"
        assert replayed.content == answered.content
        assert len(client.get("/runs", params={"session_id": "s"}).json()["items"]) == 1
        assert len(message_texts(client, "s")) == 2


def halting_app(gate: threading.Event) -> AgentApp:
    """An agent that says part of its reply, then the rest once ``gate`` opens."""
    app = AgentApp(app_name="halting")

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        yield "part one. "
        await asyncio.to_thread(gate.wait, 30)
        yield "part two."

    return app


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_retry_after_a_run_canceled_on_disconnect_stores_its_whole_reply(
    backend: str, aws_env: None, user_id: str, request: pytest.FixtureRequest
) -> None:
    gate = threading.Event()
    settings = load_settings(**backend_settings(backend, request))
    store = InMemoryKeyStore()
    app = create_app(settings=settings, agent_app=halting_app(gate), key_store=store)
    run = {"input": [text_message("hi")], "session_id": "s", "cancel_on_disconnect": True}
    with (
        running(app) as url,
        httpx.Client(base_url=url, headers=bearer(issue_key(store, user_id)), timeout=60) as client,
    ):
        try:
            with client.stream("POST", "/process", json=run, headers=keyed("cut")) as cut:
                first_run = cut.headers["X-Run-Id"]
                next(line for line in cut.iter_lines() if "part one" in line)
            # The client left: its run is canceled, keeping the part said, and the key freed.
            while client.get(f"/runs/{first_run}").json()["status"] == "in_progress":
                time.sleep(0.05)
        finally:
            gate.set()
        retried, events = stream(client, "/process", json=run, headers=keyed("cut"))
        assert retried.status_code == 200
        assert retried.headers["X-Run-Id"] != first_run
        assert text_of(events.data) == "part one. part two."
        # The input once, the canceled run's part, then the retry's whole reply.
        assert message_texts(client, "s") == ["hi", "part one. ", "part one. part two."]
        assert client.get(f"/runs/{first_run}").json()["status"] == "canceled"
        assert [r["status"] for r in client.get("/runs?session_id=s").json()["items"]] == [
            "canceled",
            "completed",
        ]


def failing_once_app() -> AgentApp:
    """An agent that fails after its first words the first time, and answers after."""
    app = AgentApp(app_name="failing-once")
    calls: list[int] = []

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        calls.append(1)
        yield "first words. "
        if len(calls) == 1:
            raise RuntimeError("failed this time")
        yield "the rest."

    return app


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_retry_after_a_failed_run_is_a_run_of_its_own(
    backend: str, aws_env: None, user_id: str, request: pytest.FixtureRequest
) -> None:
    # The retry ran under the failed run's id: the stored run read failed, then completed,
    # with events of both.
    settings = load_settings(**backend_settings(backend, request))
    store = InMemoryKeyStore()
    app = create_app(settings=settings, agent_app=failing_once_app(), key_store=store)
    app.state.context.recorder.first_write_delay = 0  # each run stored as it goes
    run = {"input": [text_message("hi")], "session_id": "s", "stream": False}
    with (
        running(app) as url,
        httpx.Client(base_url=url, headers=bearer(issue_key(store, user_id)), timeout=60) as client,
    ):
        failed = client.post("/process", json=run, headers=keyed("flaky"))
        assert failed.status_code == 500 and failed.json()["status"] == "failed"
        retried = client.post("/process", json=run, headers=keyed("flaky"))
        assert retried.status_code == 200 and retried.json()["status"] == "completed"
        assert retried.headers["X-Run-Id"] != failed.headers["X-Run-Id"]
        for answer, status in ((failed, "failed"), (retried, "completed")):
            run_id = answer.headers["X-Run-Id"]
            assert client.get(f"/runs/{run_id}").json()["status"] == status
            events = parse_sse(client.get(f"/runs/{run_id}/events").text.splitlines()).data
            assert [e["status"] for e in events if e["object"] == "response"][-1] == status
        assert message_texts(client, "s") == ["hi", "first words. the rest."]
        # Memory too holds the input once (remembered by the failed run).
        remembered = [m["content"][0]["text"] for m in client.get("/memory").json()["items"]]
        assert remembered == ["hi", "first words. the rest."]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_key_reused_for_another_request_after_a_failed_run_stores_its_input(
    backend: str, aws_env: None, user_id: str, request: pytest.FixtureRequest
) -> None:
    # The other request's input took the failed one's message id, and was skipped as stored:
    # the history paired the first question with the answer to the second.
    settings = load_settings(**backend_settings(backend, request))
    store = InMemoryKeyStore()
    app = create_app(settings=settings, agent_app=failing_once_app(), key_store=store)
    first = {"input": [text_message("hi")], "session_id": "s", "stream": False}
    other = {"input": [text_message("something else")], "session_id": "s", "stream": False}
    with (
        running(app) as url,
        httpx.Client(base_url=url, headers=bearer(issue_key(store, user_id)), timeout=60) as client,
    ):
        assert client.post("/process", json=first, headers=keyed("reused")).status_code == 500
        answered = client.post("/process", json=other, headers=keyed("reused"))
        assert answered.status_code == 200 and answered.json()["status"] == "completed"
        assert message_texts(client, "s") == ["hi", "something else", "first words. the rest."]


def changing_app() -> AgentApp:
    """An agent that, as a model does, answers otherwise when asked again: thirty pieces of
    text the first time, one after."""
    app = AgentApp(app_name="changing")
    calls: list[int] = []

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        calls.append(1)
        for piece in range(30 if len(calls) == 1 else 1):
            yield f"piece{piece} "

    return app


def leave_lost(runs: RunsService, user_id: str, run_id: str) -> None:
    """Leave the run as a process stopped in its middle (killed) leaves it: in progress, its
    last heartbeat older than ``LOST_AFTER_SECONDS``, its events stored but for its end."""

    async def lose() -> None:
        record = await runs.get_run(user_id, run_id)
        events = await runs.read_events(user_id, run_id)
        assert record is not None and len(events) > 30
        await runs.delete_run(user_id, run_id)
        stale = time.time() - LOST_AFTER_SECONDS - 5
        kept = {"status": "in_progress", "updated_at": stale, "error": None}
        await runs.create_run(record.model_copy(update=kept))
        await runs.append_events(user_id, run_id, events[:-1])

    async def on_the_store() -> None:
        async with runs:
            await lose()

    asyncio.run(lose() if isinstance(runs, InMemoryRunsService) else on_the_store())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_retry_after_a_lost_run_is_read_back_alone(
    backend: str, aws_env: None, user_id: str, request: pytest.FixtureRequest
) -> None:
    # The retry ran under the lost run's id (it derives from the key) over its events: they
    # were read back mixed (on DynamoDB the retry's, then the lost run's after the retry's
    # end, the run listed twice; on Redis the lost run's alone, without an end), and a client
    # resuming past the retry's end got the lost run's deltas for ever.
    settings = load_settings(
        **backend_settings(backend, request), idempotency_expiry_seconds=SHORT_EXPIRY_SECONDS
    )
    store = InMemoryKeyStore()
    app = create_app(settings=settings, agent_app=changing_app(), key_store=store)
    app.state.context.recorder.first_write_delay = 0  # each run stored as it goes
    run = {"input": [text_message("hi")], "session_id": "s", "stream": True}
    with (
        running(app) as url,
        httpx.Client(base_url=url, headers=bearer(issue_key(store, user_id)), timeout=60) as client,
    ):
        first, _ = stream(client, "/process", json=run, headers=keyed("lost"))
        run_id = first.headers["X-Run-Id"]
        runs = app.state.context.recorder.runs
        if backend != "in_memory":
            runs = create_runs_service(settings)
        leave_lost(runs, user_id, run_id)
        assert client.get(f"/runs/{run_id}").json()["error"]["code"] == "RUN_LOST"
        # The key is free again, as after its request's process stopped.
        time.sleep(SHORT_EXPIRY_SECONDS + 1.5)
        retried, events = stream(client, "/process", json=run, headers=keyed("lost"))
        assert retried.status_code == 200 and "Idempotent-Replayed" not in retried.headers
        assert retried.headers["X-Run-Id"] == run_id
        assert text_of(events.data) == "piece0 "
        assert events.data[-1]["status"] == "completed"
        # The run read back is the retry's, whole and alone, from its start or past its end.
        stored = parse_sse(client.get(f"/runs/{run_id}/events").text.splitlines()).data
        assert stored == events.data
        last = events.data[-1]["sequence_number"]
        resumed = client.get(f"/runs/{run_id}/events", headers={"Last-Event-ID": str(last)})
        assert parse_sse(resumed.text.splitlines()).data == []
        assert client.get(f"/runs/{run_id}").json()["status"] == "completed"
        listed = client.get("/runs", params={"session_id": "s"}).json()["items"]
        assert [(r["id"], r["status"]) for r in listed] == [(run_id, "completed")]
        # The input is stored once.
        assert message_texts(client, "s")[0] == "hi"
        assert len(message_texts(client, "s")) == 2


# --- a store that freezes ---------------------------------------------------------------

WRITES: list[tuple[str, str, dict[str, Any]]] = [
    ("append", "/sessions/s1/messages", {"messages": [text_message("once")]}),
    ("state", "/state/s1", {"state": {"v": 1}}),
    ("memory", "/memory", {"messages": [text_message("green tea")], "session_id": "s1"}),
    ("session", "/sessions", {}),
    ("run", "/process", {"input": [text_message("hi")], "session_id": "s2", "stream": False}),
]


def retry_until_answered(client: httpx.Client, path: str, body: Any, key: str) -> httpx.Response:
    """What a client does after a 503: retry with the same key (409 means "still running")."""
    for _ in range(120):
        response = client.post(path, json=body, headers=keyed(key))
        if response.status_code not in (409, 503):
            return response
        time.sleep(0.5)
    raise AssertionError(f"{path} was never answered: {response.status_code} {response.text}")


def frozen_then_retried(
    url: str,
    store: InMemoryKeyStore,
    pause: Callable[[], None],
    resume: Callable[[], None],
    secrets: list[str],
) -> httpx.Client:
    key = issue_key(store, f"user-{uuid.uuid4().hex[:10]}")
    client = httpx.Client(base_url=url, headers=bearer(key), timeout=120)
    pause()
    try:
        with concurrent.futures.ThreadPoolExecutor(len(WRITES)) as pool:
            answers = list(
                pool.map(lambda w: client.post(w[1], json=w[2], headers=keyed(w[0])), WRITES)
            )
    finally:
        resume()
    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "STORE_UNAVAILABLE"
        assert not any(secret in answer.text for secret in secrets), answer.text
        assert "<" not in answer.text  # no HTML page
    for name, path, body in WRITES:
        retried = retry_until_answered(client, path, body, name)
        assert retried.is_success, retried.text
        again = client.post(path, json=body, headers=keyed(name))
        assert again.headers.get("Idempotent-Replayed") == "true"
        assert again.content == retried.content
    return client


def assert_stored_once(client: httpx.Client) -> None:
    assert message_texts(client, "s1") == ["once"]
    assert client.get("/state/s1/rounds").json()["rounds"] == [1]
    remembered = [m["content"][0]["text"] for m in client.get("/memory").json()["items"]]
    # The run remembers its turn too: each once.
    assert remembered.count("green tea") == 1 and remembered.count("hi") == 1
    sessions = {s["id"] for s in client.get("/sessions").json()["items"]}
    assert len(sessions) == 3 and {"s1", "s2"} <= sessions  # and the one made by POST /sessions
    assert len(message_texts(client, "s2")) == 2


@pytest.mark.timeout(300)
def test_writes_that_timed_out_on_a_frozen_redis_are_stored_once_when_retried() -> None:
    with RedisServer() as redis:
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
            secrets = ["127.0.0.1", str(redis.port), "script"]
            client = frozen_then_retried(url, store, redis.pause, redis.resume, secrets)
            try:
                assert_stored_once(client)
            finally:
                client.close()


@pytest.mark.timeout(300)
def test_writes_that_timed_out_on_a_stopped_dynamodb_are_stored_once_when_retried(
    aws_env: None, redis_server: RedisServer
) -> None:
    with DynamoDBServer() as dynamodb:
        settings = load_settings(
            session_history_backend="dynamodb",
            state_backend="dynamodb",
            memory_backend="redis",
            redis_url=redis_server.url,
            dynamodb_endpoint_url=dynamodb.endpoint_url,
            aws_region=dynamodb.region,
            idempotency_lease_seconds=1.0,
        )
        store = InMemoryKeyStore()
        app = create_app(settings=settings, agent_app=demo_app, key_store=store)
        with running(app) as url:
            secrets = ["127.0.0.1", str(dynamodb.port), "html"]
            client = frozen_then_retried(url, store, dynamodb.pause, dynamodb.resume, secrets)
            try:
                assert_stored_once(client)
            finally:
                client.close()


# --- a run failing with "retry later" ---------------------------------------------------


def at_capacity_once_app(calls: list[str]) -> AgentApp:
    """An agent whose first run finds the sandbox server at capacity (a 429 saying to retry
    in a second), and that answers after; ``calls`` gets the input of each run."""
    app = AgentApp(app_name="at-capacity-once")

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        calls.append(str(msgs))
        yield "let me run that. "
        if len(calls) == 1:
            raise SandboxCapacityError("the sandbox server is at capacity", retry_after=1)
        yield "done."

    return app


@contextlib.contextmanager
def at_capacity_once(user_id: str) -> Iterator[tuple[httpx.Client, list[str]]]:
    calls: list[str] = []
    store = InMemoryKeyStore()
    app = create_app(
        settings=load_settings(), agent_app=at_capacity_once_app(calls), key_store=store
    )
    with (
        running(app) as url,
        httpx.Client(base_url=url, headers=bearer(issue_key(store, user_id)), timeout=60) as client,
    ):
        yield client, calls


STREAMED_RUNS: list[tuple[str, dict[str, Any]]] = [
    ("/process", {"input": [text_message("run it")], "session_id": "s", "stream": True}),
    (
        "/compatible-mode/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "run it"}], "stream": True},
    ),
    ("/compatible-mode/v1/responses", {"model": "m", "input": "run it", "stream": True}),
]


@pytest.mark.parametrize(("path", "body"), STREAMED_RUNS, ids=["process", "chat", "responses"])
def test_a_streamed_run_failing_with_retry_later_frees_its_key(
    path: str, body: dict[str, Any], user_id: str
) -> None:
    # The stream's 200 was kept: the retry the 429 asks for replayed the failure for a day.
    headers = {**keyed("at-capacity"), "X-Session-Id": "s"}
    with at_capacity_once(user_id) as (client, calls):
        failed = client.post(path, json=body, headers=headers)
        assert failed.status_code == 200 and "server is at capacity" in failed.text
        retried = client.post(path, json=body, headers=headers)
        assert "Idempotent-Replayed" not in retried.headers
        assert "at capacity" not in retried.text and "done." in retried.text
        assert len(calls) == 2
        again = client.post(path, json=body, headers=headers)
        assert again.headers["Idempotent-Replayed"] == "true" and len(calls) == 2
        # The input once, as after the same runs not streamed, then the answer.
        texts = [
            m["content"][0]["text"] for m in client.get("/sessions/s/messages").json()["items"]
        ]
        assert texts == ["run it", "let me run that. done."]


def test_a_streamed_run_failing_with_retry_later_says_when_in_its_failed_event(
    user_id: str,
) -> None:
    run = {"input": [text_message("run it")], "session_id": "s", "stream": True}
    with at_capacity_once(user_id) as (client, _):
        _, sse = stream(client, "/process", json=run)
    assert sse.data[-1]["error"] == {
        "code": "SANDBOX_CAPACITY",
        "message": "the sandbox server is at capacity",
        "retry_after": 1,
    }


def test_a_run_failing_with_retry_later_answers_retry_after(user_id: str) -> None:
    # The 429 came without Retry-After: clients retried at once, or not at all.
    run = {"input": [text_message("run it")], "session_id": "s", "stream": False}
    with at_capacity_once(user_id) as (client, calls):
        failed = client.post("/process", json=run, headers=keyed("k"))
        assert failed.status_code == 429 and failed.headers["Retry-After"] == "1"
        assert failed.json()["error"]["code"] == "SANDBOX_CAPACITY"
        retried = client.post("/process", json=run, headers=keyed("k"))
        assert retried.status_code == 200 and len(calls) == 2
    chat = {"model": "m", "messages": [{"role": "user", "content": "run it"}]}
    with at_capacity_once(user_id) as (client, _):
        failed = client.post("/compatible-mode/v1/chat/completions", json=chat)
        assert failed.status_code == 429 and failed.headers["Retry-After"] == "1"


# --- the same JSON, written another way -----------------------------------------------


def test_the_same_json_body_written_another_way_is_the_same_request(client: httpx.Client) -> None:
    # The retry was refused as another request (409, X-Should-Retry: false): a client that
    # serialises its body anew for each attempt could not retry at all.
    json_type = {"Content-Type": "application/json"}
    run = {"input": [text_message("hi")], "session_id": "s-json", "stream": False}
    chat = {"model": "demo", "messages": [{"role": "user", "content": "héllo"}]}
    for path, body, other in [
        ("/process", run, {**run, "input": [text_message("bye")]}),
        ("/state/s-json", {"state": {"a": 1, "b": [1, {"c": 2, "d": 3}]}}, {"state": {"a": 1}}),
        ("/compatible-mode/v1/chat/completions", chat, {**chat, "model": "other"}),
    ]:
        key = {**keyed(f"json-{path}"), **json_type}
        first = client.post(path, content=json.dumps(body), headers=key)
        assert first.is_success, first.text
        reordered = dict(reversed(list(body.items())))
        for again in (
            json.dumps(reordered, indent=2, ensure_ascii=True),
            json.dumps(body, separators=(",", ":"), ensure_ascii=False),
        ):
            retried = client.post(path, content=again, headers=key)
            assert retried.headers.get("Idempotent-Replayed") == "true", (path, retried.text)
            assert retried.content == first.content
        refused = client.post(path, content=json.dumps(other), headers=key)
        assert refused.status_code == 409, (path, refused.text)
        assert refused.json()["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert len(message_texts(client, "s-json")) == 2  # the question and the one answer
    assert client.get("/state/s-json/rounds").json()["rounds"] == [1]


# --- a request whose session is gone -------------------------------------------------------

SESSION_TTL_SECONDS = 2


def written_in_sessions(client: httpx.Client) -> list[httpx.Response]:
    """Keyed writes in three sessions: one created, one appended to, one run in."""
    return [
        client.post("/sessions", json={"session_id": "made"}, headers=keyed("k-new")),
        client.post(
            "/sessions/added/messages",
            json={"messages": [text_message("hello")]},
            headers=keyed("k-add"),
        ),
        client.post(
            "/process",
            json={"input": [text_message("My name is Ada")], "session_id": "ran", "stream": False},
            headers=keyed("k-run"),
        ),
    ]


def assert_written_anew(client: httpx.Client) -> None:
    """The writes of :func:`written_in_sessions`, sent again, run as first requests: their
    sessions hold what they wrote, once."""
    for answer in written_in_sessions(client):
        assert answer.is_success, answer.text
        assert "Idempotent-Replayed" not in answer.headers
    assert client.get("/sessions/made").status_code == 200
    assert message_texts(client, "added") == ["hello"]
    assert len(message_texts(client, "ran")) == 2


@pytest.mark.parametrize("backend", ["redis", "dynamodb"])
def test_a_request_whose_session_expired_runs_anew(
    backend: str, request: pytest.FixtureRequest
) -> None:
    # Its kept answer was replayed for a session that no longer existed: the client took
    # what it wrote for stored.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", LOCAL_AWS_CREDENTIALS["aws_access_key_id"])
        env.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_AWS_CREDENTIALS["aws_secret_access_key"])
        settings = load_settings(
            **backend_settings(backend, request), session_ttl_seconds=SESSION_TTL_SECONDS
        )
        store = InMemoryKeyStore()
        app = create_app(settings=settings, agent_app=demo_app, key_store=store)
        with running(app) as url, user_client((url, store)) as client:
            assert all(answer.is_success for answer in written_in_sessions(client))
            time.sleep(SESSION_TTL_SECONDS + 1.5)  # whole seconds on both stores
            assert client.get("/sessions/ran").status_code == 404
            assert_written_anew(client)


def test_a_request_whose_session_is_gone_runs_anew_in_memory() -> None:
    # The in-memory store has no expiry: the sessions go by their history service alone,
    # their requests' records kept, as an expiry leaves them on the other stores.
    store = InMemoryKeyStore()
    app = create_app(settings=load_settings(), agent_app=demo_app, key_store=store)
    user_id = f"user-{uuid.uuid4().hex[:10]}"
    with running(app) as url:
        key = issue_key(store, user_id)
        with httpx.Client(base_url=url, headers=bearer(key), timeout=60) as client:
            assert all(answer.is_success for answer in written_in_sessions(client))
            history = app.state.context.session_history
            for session_id in ("made", "added", "ran"):
                asyncio.run(history.delete_session(user_id, session_id))
            assert_written_anew(client)
