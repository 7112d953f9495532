"""The REST routes of the services (sessions, memory, state), OpenAPI docs, over real HTTP."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from agentscope_serverless.app import AgentApp
from agentscope_serverless.http import create_app
from agentscope_serverless.settings import load_settings
from tests.support.backends import BACKENDS, backend_settings
from tests.support.http import (
    Keys,
    assert_docs_run_only_their_pinned_scripts,
    bearer,
    posted_at_once,
    running,
    the_one_taken,
    user_message,
)
from tests.support.ported_state import DictStateService


@pytest.fixture
def alice(client_for: Callable[..., httpx.Client], keys: Keys) -> httpx.Client:
    """Alice's client, as a user with no data yet (a service key acting for a fresh user)."""
    return client_for(keys.service, **{"X-User-Id": f"user-{uuid.uuid4().hex[:8]}"})


def test_create_session_with_and_without_id(alice: httpx.Client) -> None:
    given = alice.post("/sessions", json={"session_id": "  trip  "})
    assert given.status_code == 201
    assert given.json()["id"] == "trip"
    generated = alice.post("/sessions", json={})
    assert uuid.UUID(generated.json()["id"])
    again = alice.post("/sessions", json={"session_id": "trip"})
    assert again.json() == given.json()


def test_sessions_are_listed_a_page_at_a_time(alice: httpx.Client) -> None:
    for name in ("one", "two", "three"):
        alice.post("/sessions", json={"session_id": name})
    first = alice.get("/sessions", params={"limit": 2}).json()
    assert [s["id"] for s in first["items"]] == ["one", "two"]
    second = alice.get("/sessions", params={"limit": 2, "cursor": first["next_cursor"]}).json()
    assert [s["id"] for s in second["items"]] == ["three"]
    assert second["next_cursor"] is None


def test_an_append_of_more_than_1000_messages_is_refused_and_stores_nothing(
    alice: httpx.Client,
) -> None:
    # 1 MiB of one-word messages came back as 10 MB: past what a Lambda function returns,
    # so the append landed and its client got a 500.
    many = {"messages": [{"role": "user", "content": "x"} for _ in range(1001)]}
    refused = alice.post("/sessions/many/messages", json=many)
    assert refused.status_code == 422
    assert "at most 1000 items" in refused.text and "messages" in refused.text
    assert alice.get("/sessions/many").status_code == 404
    many["messages"].pop()
    assert alice.post("/sessions/many/messages", json=many).status_code == 201


@pytest.mark.parametrize(
    ("message_id", "why"), [("", "must not be empty"), ("m" * 10_000, "is longer than 512")]
)
def test_an_appended_message_id_empty_or_longer_than_512_characters_is_refused(
    alice: httpx.Client, message_id: str, why: str
) -> None:
    bad = {**user_message("hi"), "id": message_id}
    refused = alice.post("/sessions/ids/messages", json={"messages": [user_message("x"), bad]})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["param"] == "message[1].id"
    assert error["message"].startswith(f"message[1].id {why}")
    assert alice.get("/sessions/ids").status_code == 404


@pytest.mark.parametrize(
    ("message_id", "why"),
    [
        ("a\x00b", "must not contain control characters"),
        ("\x7f", "must not contain control characters"),
        (" ", "must not be blank"),
    ],
)
def test_an_appended_message_id_holding_a_control_character_or_blank_is_refused(
    alice: httpx.Client, message_id: str, why: str
) -> None:
    bad = {**user_message("hi"), "id": message_id}
    refused = alice.post("/sessions/ids/messages", json={"messages": [user_message("x"), bad]})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["param"] == "message[1].id"
    assert error["message"].startswith(f"message[1].id {why}")
    assert alice.get("/sessions/ids").status_code == 404


def test_an_appended_message_whose_id_is_stored_saying_else_is_refused_and_nothing_stored(
    alice: httpx.Client,
) -> None:
    # It answered 201 echoing the stored message, and stored nothing.
    first = {**user_message("first"), "id": "1"}
    assert alice.post("/sessions/ids/messages", json={"messages": [first]}).status_code == 201
    changed = {**user_message("changed"), "id": "1"}
    for batch in ([user_message("new"), changed], [{**first, "id": "2"}, {**changed, "id": "2"}]):
        refused = alice.post("/sessions/ids/messages", json={"messages": batch})
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "MESSAGE_ID_CONFLICT"
        assert error["message"].startswith("message[1].id names a message already in the session")
    again = alice.post("/sessions/ids/messages", json={"messages": [first]})
    assert again.status_code == 201
    assert [m["content"][0]["text"] for m in again.json()["messages"]] == ["first"]
    stored = alice.get("/sessions/ids/messages").json()["items"]
    assert [(m["id"], m["content"][0]["text"]) for m in stored] == [("1", "first")]


def test_messages_are_appended_and_read_with_a_cursor(alice: httpx.Client) -> None:
    appended = alice.post(
        "/sessions/chat/messages",
        json={"messages": [user_message(f"message {i}") for i in range(5)]},
    )
    assert appended.status_code == 201
    assert [m["content"][0]["text"] for m in appended.json()["messages"]][-1] == "message 4"
    texts: list[str] = []
    cursor = None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = alice.get("/sessions/chat/messages", params=params).json()
        texts += [m["content"][0]["text"] for m in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert texts == [f"message {i}" for i in range(5)]
    session = alice.get("/sessions/chat").json()
    assert len(session["messages"]) == 5


def test_deleting_a_session_removes_it(alice: httpx.Client) -> None:
    alice.post("/sessions", json={"session_id": "gone"})
    assert alice.delete("/sessions/gone").status_code == 204
    assert alice.get("/sessions/gone").status_code == 404
    assert alice.delete("/sessions/gone").status_code == 204


def test_memory_add_search_list_and_delete(alice: httpx.Client) -> None:
    added = alice.post(
        "/memory",
        json={"messages": [user_message("I love green tea"), user_message("I live in Lyon")]},
    )
    assert added.status_code == 201 and added.json() == {"added": 2}
    alice.post("/memory", json={"messages": [user_message("tea tea tea")], "session_id": "s2"})
    hits = alice.post("/memory/search", json={"query": "tea"}).json()["items"]
    assert [h["content"][0]["text"] for h in hits] == ["tea tea tea", "I love green tea"]
    top = alice.post("/memory/search", json={"query": "tea", "top_k": 1}).json()["items"]
    assert len(top) == 1
    page = alice.get("/memory", params={"page_num": 2, "page_size": 2}).json()["items"]
    assert [m["content"][0]["text"] for m in page] == ["tea tea tea"]
    assert alice.delete("/memory/s2").status_code == 204
    assert len(alice.get("/memory").json()["items"]) == 2
    assert alice.delete("/memory").status_code == 204
    assert alice.get("/memory").json()["items"] == []


def test_a_search_keeps_the_top_k_its_filters_name_as_search_memory_does(
    alice: httpx.Client,
) -> None:
    # filters.top_k, as AgentScope's search_memory takes it, was ignored: all 3 came back.
    alice.post("/memory", json={"messages": [user_message(f"kiwi {i}") for i in range(3)]})
    search = {"query": "kiwi", "filters": {"top_k": 1}}
    assert len(alice.post("/memory/search", json=search).json()["items"]) == 1
    both = {"query": "kiwi", "top_k": 2, "filters": {"top_k": 2}}
    assert len(alice.post("/memory/search", json=both).json()["items"]) == 2
    assert len(alice.post("/memory/search", json={**search, "filters": None}).json()["items"]) == 3


@pytest.mark.parametrize(
    ("search", "field"),
    [
        ({"filters": {"top_k": 0}}, "filters.top_k"),
        ({"filters": {"top_k": -5}}, "filters.top_k"),
        ({"filters": {"top_k": "abc"}}, "filters.top_k"),
        ({"filters": {"top_k": True}}, "filters.top_k"),
        ({"filters": {"top_k": 1001}}, "filters.top_k"),
        ({"filters": {"limit": 1}}, "filters.limit"),
        ({"filters": "x"}, "filters"),
        ({"top_k": 1, "filters": {"top_k": 2}}, "filters.top_k"),
        ({"top_k": 0}, "top_k"),
        ({"limit": 1}, "limit"),
    ],
)
def test_a_search_with_an_invalid_limit_or_filter_is_refused_naming_it(
    alice: httpx.Client, search: dict[str, object], field: str
) -> None:
    alice.post("/memory", json={"messages": [user_message("kiwi")]})
    refused = alice.post("/memory/search", json={"query": "kiwi", **search})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["param"] == field


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/sessions", {"session_id": "s1", "id": "s2"}, "id"),
        ("/sessions/s1/messages", {"messages": [user_message("hi")], "session": "s2"}, "session"),
        ("/memory", {"messages": [user_message("tea")], "session": "s2"}, "session"),
        ("/state/s1", {"state": {"level": 1}, "round": 3}, "round"),
    ],
)
def test_a_field_a_route_does_not_take_is_refused_naming_it_and_nothing_is_stored(
    alice: httpx.Client, path: str, body: dict[str, object], field: str
) -> None:
    # It was ignored: the request was done as if it had not been asked.
    refused = alice.post(path, json=body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["param"] == field
    assert f"body.{field}: Extra inputs are not permitted" in refused.json()["error"]["message"]
    assert alice.get("/sessions").json()["items"] == []
    assert alice.get("/memory").json()["items"] == []
    assert alice.get("/state/s1").status_code == 404


def test_a_body_naming_the_callers_own_user_is_still_taken(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    user = f"user-{uuid.uuid4().hex[:8]}"
    client = client_for(keys.service, **{"X-User-Id": user})
    for name in ("user_id", "user"):
        for path, body in (
            ("/sessions", {"session_id": "s1"}),
            ("/sessions/s1/messages", {"messages": [user_message("hi")]}),
            ("/memory", {"messages": [user_message("tea")]}),
            ("/state/s1", {"state": {"level": 1}}),
        ):
            answer = client.post(path, json={**body, name: user})
            assert answer.status_code == 201, answer.text
        search = client.post("/memory/search", json={"query": "tea", name: user})
        assert len(search.json()["items"]) >= 1, search.text
    assert len(client.get("/sessions/s1/messages").json()["items"]) == 2


def test_state_save_export_rounds_and_delete(alice: httpx.Client) -> None:
    first = alice.post("/state/game", json={"state": {"level": 1}})
    assert first.status_code == 201 and first.json() == {"session_id": "game", "round_id": 1}
    assert alice.post("/state/game", json={"state": {"level": 2}}).json()["round_id"] == 2
    assert (
        alice.post("/state/game", json={"state": {"level": 1.5}, "round_id": 1}).json()["round_id"]
        == 1
    )
    latest = alice.get("/state/game").json()
    assert latest == {"session_id": "game", "round_id": 2, "state": {"level": 2}}
    assert alice.get("/state/game", params={"round_id": 1}).json()["state"] == {"level": 1.5}
    assert alice.get("/state/game", params={"round_id": 7}).status_code == 404
    assert alice.get("/state/game/rounds").json() == {"session_id": "game", "rounds": [1, 2]}
    assert alice.delete("/state/game").status_code == 204
    assert alice.get("/state/game").status_code == 404


def test_a_save_past_the_largest_round_is_a_409_and_stores_nothing(alice: httpx.Client) -> None:
    last = 2**53 - 1
    assert alice.post("/state/end", json={"state": {"v": 1}, "round_id": last}).status_code == 201
    refused = alice.post("/state/end", json={"state": {"v": 2}})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "CONFLICT"
    assert "give round_id" in refused.json()["error"]["message"]
    assert alice.get("/state/end").json() == {
        "session_id": "end",
        "round_id": last,
        "state": {"v": 1},
    }
    assert alice.get("/state/end/rounds").json()["rounds"] == [last]


def test_a_round_not_saved_is_a_404_naming_it(alice: httpx.Client) -> None:
    for round_id in (1, 5):
        alice.post("/state/s1", json={"state": {"v": round_id}, "round_id": round_id})
    missing = alice.get("/state/s1", params={"round_id": 3})
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "no saved state for session 's1' in round 3"


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/state/%20"), ("GET", "/state/%20/rounds"), ("GET", "/sessions/%20")],
)
def test_a_blank_session_id_in_a_path_is_refused_saying_what_an_id_must_be(
    alice: httpx.Client, method: str, path: str
) -> None:
    refused = alice.request(method, path, json={"state": {"v": 1}})
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["param"] == "session_id"
    assert error["message"] == (
        "invalid request: path.session_id: must not be blank (only whitespace) nor contain "
        "control characters"
    )


def test_one_call_erases_all_of_the_callers_data_and_nobody_elses(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    me, other = (
        client_for(keys.service, **{"X-User-Id": f"user-{uuid.uuid4().hex[:8]}"}) for _ in "ab"
    )
    for client in (me, other):
        client.post("/sessions/s1/messages", json={"messages": [user_message("hello")]})
        client.post("/memory", json={"messages": [user_message("I love green tea")]})
        client.post("/state/s1", json={"state": {"level": 3}})
    assert client_for(None).delete("/users/me/data").status_code == 401
    erased = me.delete("/users/me/data")
    assert erased.status_code == 204, erased.text
    assert me.get("/sessions").json()["items"] == []
    assert me.get("/sessions/s1").status_code == 404
    assert me.get("/memory").json()["items"] == []
    assert me.get("/state/s1").status_code == 404
    assert len(other.get("/sessions").json()["items"]) == 1
    assert len(other.get("/memory").json()["items"]) == 1
    assert other.get("/state/s1").json()["state"] == {"level": 3}
    assert me.delete("/users/me/data").status_code == 204


def test_openapi_docs_are_served(client_for: Callable[..., httpx.Client]) -> None:
    client = client_for(None)
    docs = client.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    assert_docs_run_only_their_pinned_scripts(docs)
    paths = client.get("/openapi.json").json()["paths"]
    for path in (
        "/process",
        "/compatible-mode/v1/chat/completions",
        "/compatible-mode/v1/responses",
        "/sessions",
        "/sessions/{session_id}/messages",
        "/memory/search",
        "/state/{session_id}/rounds",
        "/health",
    ):
        assert path in paths


def test_one_router_per_application(keys: Keys) -> None:
    app = create_app(["state"], settings=load_settings(), key_store=keys.store)
    with running(app) as url, httpx.Client(base_url=url, headers=bearer(keys.alice)) as client:
        assert client.post("/state/s", json={"state": {"a": 1}}).status_code == 201
        assert client.get("/sessions").status_code == 404
        assert client.post("/process", json={"input": [user_message("hi")]}).status_code == 404
        health = client.get("/health").json()
        assert health["services"] == {"state": True, "auth_keys": True}
        assert health["runner"] == "not_ready"  # no agent served


def ported_state_app() -> AgentApp:
    """An agent whose init assigns a state service written for AgentScope Runtime (it
    overrides save_state and export_state only), as AgentScope's guide does."""
    app = AgentApp(app_name="ported-state")

    @app.init
    async def init(self: Any) -> None:
        self.state_service = DictStateService()
        await self.state_service.start()

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, request: Any = None, **kwargs: Any) -> AsyncIterator[str]:
        saved = await self.state_service.export_state(request.user_id, request.session_id)
        turn = (saved or {"turn": 0})["turn"] + 1
        await self.state_service.save_state(request.user_id, {"turn": turn}, request.session_id)
        yield f"turn {turn}"

    return app


@pytest.fixture(scope="module")
def ported_url(keys: Keys) -> Iterator[str]:
    app = create_app(settings=load_settings(), agent_app=ported_state_app(), key_store=keys.store)
    with running(app) as url:
        yield url


@pytest.fixture
def ported(client_for: Callable[..., httpx.Client], keys: Keys, ported_url: str) -> httpx.Client:
    """A fresh user's client of the app with the ported state service."""
    return client_for(keys.service, url=ported_url, **{"X-User-Id": f"user-{uuid.uuid4().hex[:8]}"})


def test_the_latest_state_of_a_ported_state_service_is_what_its_export_state_gives(
    ported: httpx.Client,
) -> None:
    assert ported.get("/state/s1").status_code == 404
    for level in (1, 2):
        assert ported.post("/state/s1", json={"state": {"level": level}}).status_code == 201
    latest = ported.get("/state/s1")
    assert latest.status_code == 200, latest.text
    # AgentScope's export_state() gives the state, not which round it is.
    assert latest.json() == {"session_id": "s1", "round_id": None, "state": {"level": 2}}
    assert ported.get("/state/s1", params={"round_id": 1}).json()["round_id"] == 1


@pytest.mark.parametrize(
    ("method", "path", "to_implement"),
    [("GET", "/state/s1/rounds", "list_rounds()"), ("DELETE", "/state/s1", "delete_state()")],
)
def test_what_a_ported_state_service_cannot_do_is_a_501_naming_the_method_to_implement(
    ported: httpx.Client, method: str, path: str, to_implement: str
) -> None:
    ported.post("/state/s1", json={"state": {"level": 1}})
    refused = ported.request(method, path)
    assert refused.status_code == 501, refused.text
    assert refused.headers["X-Should-Retry"] == "false"
    error = refused.json()["error"]
    assert error["code"] == "NOT_IMPLEMENTED"
    assert (
        f"DictStateService implements AgentScope Runtime's methods only: override {to_implement}"
        in error["message"]
    )
    assert ported.get("/state/s1").json()["state"] == {"level": 1}


def test_an_erase_with_a_ported_state_service_erases_every_other_store_and_names_the_method(
    ported: httpx.Client,
) -> None:
    run = {"input": [user_message("My secret is 1234")], "session_id": "s1", "stream": False}
    keyed = {"Idempotency-Key": "k1"}
    assert ported.post("/process", json=run, headers=keyed).status_code == 200
    ported.post("/memory", json={"messages": [user_message("I love green tea")]})
    assert ported.get("/runs", params={"session_id": "s1"}).json()["items"]
    for _ in range(2):  # a retry answers the same
        erased = ported.delete("/users/me/data")
        assert erased.status_code == 501, erased.text
        assert erased.headers["X-Should-Retry"] == "false"
        error = erased.json()["error"]
        assert error["code"] == "NOT_IMPLEMENTED"
        assert error["message"] == (
            "could not erase the caller's agent state (the rest of their data is erased): "
            "DictStateService implements AgentScope Runtime's methods only: override "
            "delete_user_state() to delete a user's state"
        )
        assert ported.get("/sessions").json()["items"] == []
        assert ported.get("/sessions/s1/messages").status_code == 404
        assert ported.get("/memory").json()["items"] == []
        assert ported.get("/runs", params={"session_id": "s1"}).json()["items"] == []
    # The key's record (its answer quotes the conversation) is gone: the request runs anew.
    again = ported.post("/process", json=run, headers=keyed)
    assert again.status_code == 200 and "Idempotent-Replayed" not in again.headers


@pytest.mark.parametrize("backend", BACKENDS)
def test_appends_sent_at_once_of_one_message_id_saying_different_things_store_one(
    backend: str, aws_env: None, keys: Keys, request: pytest.FixtureRequest
) -> None:
    # On DynamoDB all were answered 201 (on Redis some), each body quoting a message that
    # was not the one sent, though the session kept one text; then the others were 409,
    # their other message stored all the same.
    app = create_app(
        settings=load_settings(**backend_settings(backend, request)), key_store=keys.store
    )
    texts = [f"text {i}" for i in range(12)]
    bodies = [
        {"messages": [{**user_message(text), "id": "same"}, user_message(f"more {text}")]}
        for text in texts
    ]
    path = f"/sessions/at-once-{uuid.uuid4().hex[:8]}/messages"
    with (
        running(app) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as alice,
    ):
        answers = posted_at_once(alice, path, bodies)
        winner = the_one_taken(answers, 201)
        stored = alice.get(path).json()["items"]
    assert [m["content"][0]["text"] for m in stored] == [texts[winner], f"more {texts[winner]}"]
    assert answers[winner].json()["messages"][0]["content"][0]["text"] == texts[winner]
