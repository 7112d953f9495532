"""Authentication and tenancy, on every authenticated route, over real HTTP."""

from __future__ import annotations

import urllib.parse
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Optional

import httpx
import pytest
from fastapi import Body, Request
from pydantic import BaseModel, RootModel

from agentscope_serverless.app import AgentApp
from agentscope_serverless.auth import FileKeyStore
from agentscope_serverless.http import create_app
from agentscope_serverless.schemas.agent_schemas import AgentRequest
from agentscope_serverless.settings import load_settings
from tests.support.http import (
    Keys,
    bearer,
    invalid_status,
    issue_key,
    parse_sse,
    revoke_key,
    running,
    user_message,
)

S = "shared-name"

# Every authenticated route, with a body that is valid for it.
ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    (
        "POST",
        "/process",
        {"input": [user_message("What is my name?")], "session_id": S, "stream": False},
    ),
    (
        "POST",
        "/compatible-mode/v1/chat/completions",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "What is my name?"}],
            "metadata": {"session_id": S},
        },
    ),
    (
        "POST",
        "/compatible-mode/v1/responses",
        {"model": "m", "input": "What is my name?", "metadata": {"session_id": S}},
    ),
    ("GET", "/compatible-mode/v1/models", None),
    ("GET", "/sessions", None),
    ("GET", f"/sessions/{S}", None),
    ("GET", f"/sessions/{S}/messages", None),
    ("POST", "/memory/search", {"query": "pineapple"}),
    ("GET", "/memory", None),
    ("GET", f"/state/{S}", None),
    ("GET", f"/state/{S}/rounds", None),
    ("POST", "/sessions", {"session_id": S}),
    ("POST", f"/sessions/{S}/messages", {"messages": [user_message("bob was here")]}),
    ("POST", "/memory", {"messages": [user_message("bob likes kiwis")], "session_id": S}),
    ("POST", f"/state/{S}", {"state": {"owner": "bob"}}),
    ("DELETE", f"/state/{S}", None),
    ("DELETE", f"/memory/{S}", None),
    ("DELETE", "/memory", None),
    ("DELETE", f"/sessions/{S}", None),
]
ROUTE_IDS = [f"{method} {path}" for method, path, _ in ROUTES]


def call(
    client: httpx.Client, route: tuple[str, str, dict[str, Any] | None], **kw: Any
) -> httpx.Response:
    method, path, body = route
    return client.request(method, path, json=body, **kw)


def assert_unauthenticated(response: httpx.Response) -> None:
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "UNAUTHENTICATED"


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
def test_a_missing_key_gets_401(client_for: Callable[..., httpx.Client], route: Any) -> None:
    assert_unauthenticated(call(client_for(None), route))


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
def test_an_authorization_header_of_another_scheme_is_told_apart_from_none(
    client_for: Callable[..., httpx.Client], keys: Keys, route: Any
) -> None:
    # A header was sent: "missing API key" misled. What it holds (a key sent without
    # "Bearer ", a password) is never said back.
    for value in (keys.alice, f"Token {keys.alice}", "Basic YWxpY2U6c2VjcmV0"):
        response = call(client_for(None, Authorization=value), route)
        assert_unauthenticated(response)
        message = response.json()["error"]["message"]
        assert "does not use the Bearer scheme" in message, message
        assert value.split()[-1] not in response.text
    missing = call(client_for(None), route).json()["error"]["message"]
    assert missing.startswith("missing API key")


@pytest.mark.parametrize("body", [b"{not json", b'{"input": 3}', b'{"input": []}'])
def test_the_agent_route_reads_no_body_of_a_caller_without_a_key(
    client_for: Callable[..., httpx.Client], body: bytes
) -> None:
    # Checked before the body is parsed or validated (work a caller without a key could
    # make the server do for nothing): whatever it holds, the answer is 401.
    for client in (client_for(None), client_for("not-a-key")):
        response = client.post(
            "/process", content=body, headers={"Content-Type": "application/json"}
        )
        assert_unauthenticated(response)


@pytest.mark.parametrize(
    "route", [route for route in ROUTES if route[2] is not None], ids=lambda route: route[1]
)
@pytest.mark.parametrize("body", [b"{not json", b"[" * 200 + b"]" * 200], ids=["bad", "deep"])
def test_no_route_reads_the_body_of_a_caller_without_a_key(
    client_for: Callable[..., httpx.Client], route: Any, body: bytes
) -> None:
    method, path, _ = route
    for client in (client_for(None), client_for("not-a-key")):
        response = client.request(
            method, path, content=body, headers={"Content-Type": "application/json"}
        )
        assert_unauthenticated(response)


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
def test_a_wrong_key_gets_401(
    client_for: Callable[..., httpx.Client], keys: Keys, route: Any
) -> None:
    forged = keys.alice[:-4] + "AAAA"
    unknown = "ask_0123456789abcdef_" + "A" * 43
    for key in (forged, unknown, "not-a-key", keys.revoked):
        assert_unauthenticated(call(client_for(key), route))
    basic = client_for(None, Authorization="Basic YWxpY2U6c2VjcmV0")
    assert_unauthenticated(call(basic, route))


@pytest.mark.parametrize("pasted", ['"{key}"', "'{key}'", "<{key}>", "{key}.", "ask_..."])
def test_a_key_pasted_with_quotes_or_a_stray_character_is_said_to_be_malformed(
    client_for: Callable[..., httpx.Client], keys: Keys, pasted: str
) -> None:
    response = client_for(pasted.format(key=keys.alice)).get("/sessions")
    assert_unauthenticated(response)
    message = response.json()["error"]["message"]
    assert "not of the form ask_<id>_<secret>" in message and "without quotes" in message
    assert keys.alice.split("_", 2)[2] not in response.text  # (the secret may hold "_")


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
def test_two_authorization_headers_get_401(
    client_for: Callable[..., httpx.Client], keys: Keys, route: Any
) -> None:
    # Servers take the first, proxies may take the last: no key acts when two are sent.
    for first, second in ((keys.alice, keys.bob), (keys.bob, keys.bob)):
        headers = [("Authorization", f"Bearer {first}"), ("Authorization", f"Bearer {second}")]
        response = call(client_for(None), route, headers=headers)
        assert_unauthenticated(response)
        assert "more than once" in response.json()["error"]["message"]


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
def test_a_user_key_naming_another_user_gets_403(
    client_for: Callable[..., httpx.Client], keys: Keys, route: Any
) -> None:
    bob = client_for(keys.bob)
    as_header = call(bob, route, headers={"X-User-Id": "alice"})
    as_query = call(bob, route, params={"user_id": "alice"})
    for response in (as_header, as_query):
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "PERMISSION_DENIED"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/process", {"input": [user_message("hi")], "user_id": "alice", "stream": False}),
        (
            "/compatible-mode/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": "alice"},
        ),
        ("/compatible-mode/v1/responses", {"model": "m", "input": "hi", "user": "alice"}),
    ],
)
def test_a_user_key_naming_another_user_in_the_body_gets_403(
    client_for: Callable[..., httpx.Client], keys: Keys, path: str, body: dict[str, Any]
) -> None:
    response = client_for(keys.bob).post(path, json=body)
    assert response.status_code == 403


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/process", {"input": [user_message("hi")], "user_id": "", "stream": False}),
        (
            "/compatible-mode/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": ""},
        ),
        ("/compatible-mode/v1/responses", {"model": "m", "input": "hi", "user": ""}),
    ],
)
def test_an_empty_user_in_the_body_names_no_user(
    client_for: Callable[..., httpx.Client], keys: Keys, path: str, body: dict[str, Any]
) -> None:
    # It was a 403 saying the field names another user; a service key naming its user in
    # the header is not refused either.
    assert client_for(keys.bob).post(path, json=body).status_code == 200
    service = client_for(keys.service, **{"X-User-Id": "bob"})
    assert service.post(path, json=body).status_code == 200


def test_naming_ones_own_user_is_allowed(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    bob = client_for(keys.bob, **{"X-User-Id": "bob"})
    assert bob.get("/sessions", params={"user_id": "bob"}).status_code == 200
    response = bob.post(
        "/process", json={"input": [user_message("hi")], "user_id": "bob", "stream": False}
    )
    assert response.status_code == 200


def test_two_users_cannot_reach_each_others_data_on_any_route(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    alice = client_for(keys.alice)
    told = alice.post(
        "/process",
        json={"input": [user_message("My name is Alice")], "session_id": S, "stream": False},
    )
    assert told.status_code == 200
    alice.post(
        "/memory", json={"messages": [user_message("alice loves pineapple")], "session_id": S}
    )
    alice.post(f"/state/{S}", json={"state": {"owner": "alice"}})

    bob = client_for(keys.bob)
    seen = {}
    for route in ROUTES:
        response = call(bob, route)
        assert response.status_code < 500, route
        seen[f"{route[0]} {route[1]}"] = response
        for secret in ("Alice", "alice", "pineapple"):
            assert secret not in response.text, (route, response.text)
    assert seen[f"GET /state/{S}"].status_code == 404
    assert seen[f"GET /state/{S}/rounds"].json()["rounds"] == []
    assert seen[f"POST /state/{S}"].json()["round_id"] == 1
    assert seen["POST /memory/search"].json()["items"] == []
    assert "don't know your name" in seen["POST /process"].text

    # Alice's data is untouched by everything Bob did.
    history = alice.get(f"/sessions/{S}/messages").json()["items"]
    assert history[0]["content"][0]["text"] == "My name is Alice"
    assert len(history) == 2
    assert [s["id"] for s in alice.get("/sessions").json()["items"]] == [S]
    hits = alice.post("/memory/search", json={"query": "pineapple"}).json()["items"]
    assert [h["content"][0]["text"] for h in hits] == ["alice loves pineapple"]
    state = alice.get(f"/state/{S}").json()
    assert (state["round_id"], state["state"]) == (1, {"owner": "alice"})


def test_a_service_key_must_name_the_user(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    response = client_for(keys.service).get("/sessions")
    assert response.status_code == 422
    assert response.json()["error"]["fields"][0]["loc"] == ["X-User-Id"]


def test_a_service_key_acts_for_the_user_it_names(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    session = f"svc-{uuid.uuid4()}"
    alice = client_for(keys.alice)
    alice.post(
        "/process",
        json={"input": [user_message("My name is Alice")], "session_id": session, "stream": False},
    )
    service = client_for(keys.service)
    as_alice = {"X-User-Id": "alice"}
    assert service.get(f"/sessions/{session}", headers=as_alice).json()["user_id"] == "alice"
    assert service.get(f"/sessions/{session}", params={"user_id": "alice"}).status_code == 200
    answer = service.post(
        "/process",
        json={
            "input": [user_message("What is my name?")],
            "session_id": session,
            "user_id": "alice",
            "stream": False,
        },
    )
    assert answer.json()["output"][0]["content"][0]["text"] == "Your name is Alice."
    assert service.get(f"/sessions/{session}", headers={"X-User-Id": "bob"}).status_code == 404


def test_a_user_named_in_a_header_is_the_one_its_utf8_bytes_spell(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    # Header bytes reach the app as Latin-1: "é" sent as UTF-8 would read "Ã©", and the
    # user named in the header and in the body or query would be two users.
    service = client_for(keys.service)
    user = f"é-{uuid.uuid4().hex[:8]}"
    as_user = {"X-User-Id": user.encode()}
    created = service.post("/sessions", json={"session_id": "s"}, headers=as_user)
    assert created.status_code == 201 and created.json()["user_id"] == user
    listed = service.get("/sessions", params={"user_id": user}).json()["items"]
    assert [s["user_id"] for s in listed] == [user]
    both = service.post("/sessions", json={"session_id": "t", "user_id": user}, headers=as_user)
    assert both.status_code == 201
    latin1 = service.get("/sessions", headers={"X-User-Id": "é".encode("latin-1")})
    assert latin1.status_code == 422
    assert latin1.json()["error"]["message"] == "the X-User-Id header is not UTF-8 text"
    # In the query, bytes that are not UTF-8 would all read as one user named "\ufffd".
    for query in ("user_id=%E9", "user_id=%FF"):
        refused = service.get(f"/sessions?{query}")
        assert refused.status_code == 422
        assert refused.json()["error"]["message"] == "the user_id query parameter is not UTF-8 text"
    replacement = service.get("/sessions?user_id=%EF%BF%BD")  # U+FFFD itself, as UTF-8
    assert replacement.status_code == 200


def test_a_session_named_in_a_header_is_the_one_its_utf8_bytes_spell(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    alice = client_for(keys.alice)
    session = f"séance-{uuid.uuid4().hex[:8]}"
    body = {"model": "m", "messages": [{"role": "user", "content": "My name is Zoé"}]}
    headers = {"X-Session-Id": session.encode()}
    first = alice.post("/compatible-mode/v1/chat/completions", json=body, headers=headers)
    assert first.status_code == 200, first.text
    again = {"model": "m", "messages": [{"role": "user", "content": "What is my name?"}]}
    answer = alice.post(
        "/compatible-mode/v1/chat/completions", json={**again, "metadata": {"session_id": session}}
    )
    assert answer.json()["choices"][0]["message"]["content"] == "Your name is Zoé."
    quoted = urllib.parse.quote(session, safe="")
    assert len(alice.get(f"/sessions/{quoted}/messages").json()["items"]) == 4


def test_a_service_key_naming_a_user_with_surrounding_whitespace_gets_422(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    # A server strips a header's value: " alice" in the header is "alice", so " alice" named
    # in a body or a query would be a user no header could reach.
    service = client_for(keys.service)
    user = f"alice-{uuid.uuid4().hex[:8]}"
    for padded in (f" {user}", f"{user}\t", f"{user} "):
        agent = {"input": [user_message("hi")], "user_id": padded, "stream": False}
        in_body = service.post("/process", json=agent)
        assert in_body.status_code == 422, in_body.text
        assert "whitespace" in in_body.json()["error"]["message"]
        in_query = service.post("/sessions", params={"user_id": padded}, json={})
        assert in_query.status_code == 422
        assert "whitespace" in in_query.json()["error"]["message"]
    assert service.get("/sessions", headers={"X-User-Id": user}).json()["items"] == []
    # Inside the id, whitespace is the user's own.
    spaced = f"alice {uuid.uuid4().hex[:8]}"
    made = service.post("/sessions", params={"user_id": spaced}, json={"session_id": "s"})
    assert made.status_code == 201, made.text
    assert made.json()["user_id"] == spaced
    listed = service.get("/sessions", headers={"X-User-Id": spaced}).json()["items"]
    assert [s["user_id"] for s in listed] == [spaced]


def test_a_service_key_naming_two_users_gets_422(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    service = client_for(keys.service, **{"X-User-Id": "alice"})
    response = service.post(
        "/process", json={"input": [user_message("hi")], "user_id": "bob", "stream": False}
    )
    assert response.status_code == 422


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/process", {"input": [user_message("My name is Bob")], "stream": False}),
        (
            "/compatible-mode/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "My name is Bob"}]},
        ),
        ("/compatible-mode/v1/responses", {"model": "m", "input": "My name is Bob"}),
        ("/sessions", {"session_id": "named-twice"}),
    ],
)
def test_a_body_naming_two_users_is_refused(
    client_for: Callable[..., httpx.Client], keys: Keys, path: str, body: dict[str, Any]
) -> None:
    # /process would act as the user_id, the OpenAI routes as the user: neither acts.
    service = client_for(keys.service)
    first, second = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("alice", "bob"))
    response = service.post(path, json={**body, "user_id": first, "user": second})
    assert response.status_code == invalid_status(path)
    assert response.json()["error"]["message"] == "the request names more than one user"
    for user in (first, second):
        assert service.get("/sessions", headers={"X-User-Id": user}).json()["items"] == []
    as_first = {"X-User-Id": first}
    same = service.post(path, json={**body, "user_id": first, "user": first}, headers=as_first)
    assert same.status_code < 300, same.text


def test_health_needs_no_key(client_for: Callable[..., httpx.Client]) -> None:
    response = client_for(None).get("/health")
    assert response.status_code == 200
    assert response.json() == {
        "status": "healthy",
        "services": {
            "session_history": True,
            "memory": True,
            "state": True,
            "runs": True,
            "auth_keys": True,
        },
        "runner": "ready",  # AgentScope Runtime's probes read it
    }


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/shutdown"), ("POST", "/admin/shutdown"), ("GET", "/admin/status")],
)
def test_there_are_no_admin_routes(
    client_for: Callable[..., httpx.Client], keys: Keys, method: str, path: str
) -> None:
    assert client_for(keys.alice).request(method, path).status_code in (404, 405)


def test_a_broken_key_file_is_a_503_that_does_not_say_where_it_lives(tmp_path: Path) -> None:
    path = tmp_path / "secret-place" / "keys.json"
    key = issue_key(FileKeyStore(path), "alice")
    path.write_text(path.read_text()[:100])  # cut short, as by an editor saving in place
    app = create_app(["sessions"], settings=load_settings(), key_store=FileKeyStore(path))
    with running(app) as url, httpx.Client(base_url=url, headers=bearer(key)) as client:
        response = client.get("/sessions")
        health = client.get("/health")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "STORE_UNAVAILABLE"
    assert health.json()["services"]["auth_keys"] is False
    for answer in (response, health):
        assert "secret-place" not in answer.text and str(tmp_path) not in answer.text


@pytest.mark.parametrize("follow", [False, True], ids=["its own run", "a run it follows"])
def test_a_stream_ends_once_its_key_is_revoked(
    scenario_url: str, keys: Keys, user_id: str, follow: bool
) -> None:
    key = issue_key(keys.store, user_id)
    run = {"input": [user_message("sleep 8")], "session_id": "revoked"}
    with httpx.Client(base_url=scenario_url, headers=bearer(key), timeout=30) as client:
        request = client.stream("POST", "/process", json=run)
        if follow:
            with request as leaving:  # the run goes on without its first client
                run_id = leaving.headers["X-Run-Id"]
            request = client.stream("GET", f"/runs/{run_id}/events")
        with request as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            revoke_key(keys.store, key)
            rest = "\n".join(lines)
        # It ended before its run did, and the key opens no stream any more.
        assert '"status":"completed"' not in rest.replace(" ", "")
        assert client.get("/runs", params={"session_id": "revoked"}).status_code == 401


def test_a_custom_endpoint_taking_a_request_gets_the_callers_user_in_it(keys: Keys) -> None:
    app = AgentApp(app_name="custom")

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        yield "unused"

    @app.endpoint("/whoami", methods=["POST"])
    async def whoami(request: AgentRequest) -> dict[str, Any]:
        return {"user_id": request.user_id, "session_id": request.session_id}

    @app.endpoint("/whoami/stream", methods=["POST"])
    def whoami_streamed(request: AgentRequest) -> Iterator[str | None]:
        yield request.user_id

    body = {"input": [user_message("who am I?")], "session_id": "s"}
    as_bob = {**bearer(keys.service), "X-User-Id": "bob"}
    served = app.get_fastapi_app(settings=load_settings(), key_store=keys.store)
    with running(served) as url, httpx.Client(base_url=url, timeout=10) as client:
        for headers, user in ((bearer(keys.alice), "alice"), (as_bob, "bob")):
            answer = client.post("/whoami", json=body, headers=headers)
            assert answer.json() == {"user_id": user, "session_id": "s"}
            streamed = client.post("/whoami/stream", json=body, headers=headers)
            assert parse_sse(streamed.text.splitlines()).data == [user]
        naming_bob = client.post(
            "/whoami", json={**body, "user_id": "bob"}, headers=bearer(keys.alice)
        )
        assert naming_bob.status_code == 403


class Wanted(BaseModel):
    text: str
    user_id: str | None = None


class Required(BaseModel):
    text: str
    user_id: str


class Wrapper(BaseModel):
    inner: Wanted
    many: list[Wanted] = []


Wanteds = RootModel[list[Wanted]]


class HistoryQuery(BaseModel):
    session_id: str
    user_id: str | None = None


def bobs_secret_session(client: httpx.Client, keys: Keys) -> None:
    """Bob's session ``private``, holding his secret."""
    created = client.post("/sessions", json={"session_id": "private"}, headers=bearer(keys.bob))
    assert created.status_code == 201
    appended = client.post(
        "/sessions/private/messages",
        json={"messages": [user_message("bob's PIN is 4321")]},
        headers=bearer(keys.bob),
    )
    assert appended.status_code == 201


async def history_of(request: Request, user_id: str | None, session_id: str) -> list[str]:
    service = request.app.state.runner.session_history_service
    session = await service.get_session(user_id, session_id)
    return [message.get_text_content() for message in (session.messages if session else [])]


def test_a_custom_endpoints_body_models_however_declared_hold_the_callers_user(
    keys: Keys,
) -> None:
    app = AgentApp(app_name="custom")

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        yield "unused"

    @app.endpoint("/history", methods=["POST"])
    async def history(
        q: Annotated[HistoryQuery, Body(embed=True)], request: Request
    ) -> dict[str, Any]:
        return {"user_id": q.user_id, "messages": await history_of(request, q.user_id, "private")}

    @app.endpoint("/embedded", methods=["POST"])
    async def embedded(body: Annotated[Wanted, Body(embed=True)]) -> list[str | None]:
        return [body.user_id]

    @app.endpoint("/optional", methods=["POST"])
    async def optional(body: Optional[Wanted] = None) -> list[str | None]:  # noqa: UP045
        return [body.user_id if body else None]

    @app.endpoint("/union", methods=["POST"])
    async def union(body: Wanted | None = None) -> list[str | None]:
        return [body.user_id if body else None]

    @app.endpoint("/listed", methods=["POST"])
    def listed(body: list[Wanted]) -> list[str | None]:
        return [item.user_id for item in body]

    @app.endpoint("/rooted", methods=["POST"])
    async def rooted(body: Wanteds) -> list[str | None]:
        return [item.user_id for item in body.root]

    @app.endpoint("/nested", methods=["POST"])
    async def nested(body: Wrapper) -> list[str | None]:
        return [body.inner.user_id, *(item.user_id for item in body.many)]

    @app.endpoint("/required", methods=["POST"])
    async def required(body: Required) -> list[str | None]:
        return [body.user_id]

    @app.endpoint("/request", methods=["POST"])
    async def request(body: Optional[AgentRequest] = None) -> list[str | None]:  # noqa: UP045
        return [body.user_id if body else None]

    item = {"text": "t"}
    cases: list[tuple[str, Callable[[dict[str, Any]], Any], int]] = [
        ("/embedded", lambda model: {"body": model}, 1),
        ("/optional", lambda model: model, 1),
        ("/union", lambda model: model, 1),
        ("/listed", lambda model: [item, model], 2),
        ("/rooted", lambda model: [model], 1),
        ("/nested", lambda model: {"inner": model, "many": [model]}, 2),
        ("/required", lambda model: model, 1),
        ("/request", lambda model: {"input": [], **model}, 1),
    ]
    as_bob = {**bearer(keys.service), "X-User-Id": "bob"}
    served = app.get_fastapi_app(settings=load_settings(), key_store=keys.store)
    with running(served) as url, httpx.Client(base_url=url, timeout=10) as client:
        bobs_secret_session(client, keys)
        leak = {"q": {"session_id": "private", "user_id": "bob"}}
        refused = client.post("/history", json=leak, headers=bearer(keys.alice))
        assert refused.status_code == 403, refused.text
        assert "4321" not in refused.text
        assert "user_id field names another user" in refused.json()["error"]["message"]
        own = client.post(
            "/history", json={"q": {"session_id": "private"}}, headers=bearer(keys.alice)
        )
        assert own.json() == {"user_id": "alice", "messages": []}
        for path, body, count in cases:
            for headers, user in ((bearer(keys.alice), "alice"), (as_bob, "bob")):
                # Absent, null or empty, the user_id is the user the key acts as.
                named = ({**item, "user_id": given} for given in (user, None, ""))
                for model in (item, *named):
                    answer = client.post(path, json=body(model), headers=headers)
                    assert answer.json() == [user] * count, (path, model, answer.text)
            naming_bob = client.post(
                path, json=body({**item, "user_id": "bob"}), headers=bearer(keys.alice)
            )
            assert naming_bob.status_code == 403, (path, naming_bob.text)
            # A service key acting for bob, whose body names carol: two users.
            naming_carol = client.post(
                path, json=body({**item, "user_id": "carol"}), headers=as_bob
            )
            assert naming_carol.status_code == 422, (path, naming_carol.text)
        # Without a body, an optional model stays None.
        assert client.post("/optional", headers=bearer(keys.alice)).json() == [None]


@pytest.mark.parametrize("added", ["custom endpoint", "route of the FastAPI app"])
def test_a_user_id_path_parameter_of_an_apps_own_route_names_a_user(keys: Keys, added: str) -> None:
    app = AgentApp(app_name="custom")

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        yield "unused"

    async def user_session(user_id: str, session_id: str, request: Request) -> dict[str, Any]:
        return {"user_id": user_id, "messages": await history_of(request, user_id, session_id)}

    path = "/users/{user_id}/sessions/{session_id}"
    if added == "custom endpoint":
        app.endpoint(path, methods=["GET"])(user_session)
    served = app.get_fastapi_app(settings=load_settings(), key_store=keys.store)
    if added != "custom endpoint":
        served.get(path)(user_session)
    with running(served) as url, httpx.Client(base_url=url, timeout=10) as client:
        bobs_secret_session(client, keys)
        refused = client.get("/users/bob/sessions/private", headers=bearer(keys.alice))
        assert refused.status_code == 403, refused.text
        assert "4321" not in refused.text
        assert "user_id path parameter names another user" in refused.json()["error"]["message"]
        own = client.get("/users/alice/sessions/private", headers=bearer(keys.alice))
        assert own.json() == {"user_id": "alice", "messages": []}
        # Bob's own key, and a service key acting for bob (named by the path alone, or by
        # the header too), read his session.
        for headers in (
            bearer(keys.bob),
            bearer(keys.service),
            {**bearer(keys.service), "X-User-Id": "bob"},
        ):
            answer = client.get("/users/bob/sessions/private", headers=headers)
            assert answer.json() == {"user_id": "bob", "messages": ["bob's PIN is 4321"]}
        # A service key naming two users.
        two = client.get(
            "/users/bob/sessions/private", headers={**bearer(keys.service), "X-User-Id": "carol"}
        )
        assert two.status_code == 422, two.text
