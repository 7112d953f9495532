"""WebSocket routes an app adds to ``app.get_fastapi_app()``, served by a local server: behind
the key as every route, their handshake refused as an HTTP request to the same URL would be,
and their caller (``CurrentUser``, ``CurrentCaller``) known as on HTTP routes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import WebSocket
from fastapi.responses import StreamingResponse
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from agentscope_serverless.app import AgentApp
from agentscope_serverless.auth import InMemoryKeyStore, KeyStore, Principal
from agentscope_serverless.errors import InvalidInputError
from agentscope_serverless.http.auth import CurrentCaller, CurrentUser, public
from agentscope_serverless.http.middleware import refuse_handshake
from agentscope_serverless.settings import load_settings
from tests.support.http import Keys, bearer, issue_key, revoke_key, running

# The parts of the public stream, a tenth of a second apart: longer than a key's recheck.
STREAMED_PARTS = 30


def build_app(store: KeyStore, **settings: Any) -> Any:
    app = AgentApp(app_name="sockets")

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        yield "unused"

    web = app.get_fastapi_app(settings=load_settings(**settings), key_store=store)

    @web.websocket("/ws/user")
    async def user(websocket: WebSocket, user_id: CurrentUser) -> None:
        await websocket.accept()
        await websocket.send_json({"user": user_id})
        await websocket.close()

    @web.websocket("/ws/caller")
    async def caller(websocket: WebSocket, caller: CurrentCaller) -> None:
        await websocket.accept()
        await websocket.send_json({"key_id": caller.principal.key_id})
        await websocket.close()

    @web.websocket("/ws/open")
    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("hello")
        await websocket.close()

    @web.websocket("/ws/echo")
    async def echo_all(websocket: WebSocket) -> None:
        await websocket.accept()
        async for text in websocket.iter_text():
            await websocket.send_text(text)

    @web.get("/notes")
    async def notes() -> dict[str, str]:
        return {"notes": "none"}

    @web.websocket("/ws/public")
    @public
    async def open_echo(websocket: WebSocket) -> None:
        await websocket.accept()
        async for text in websocket.iter_text():
            await websocket.send_text(text)

    @web.get("/stream/public")
    @public
    async def open_stream() -> StreamingResponse:
        async def parts() -> AsyncIterator[str]:
            for part in range(STREAMED_PARTS):
                await asyncio.sleep(0.1)
                yield f"{part}\n"

        return StreamingResponse(parts(), media_type="text/plain")

    @web.websocket("/ws/of/{user_id}")
    async def of_user(websocket: WebSocket, user_id: str) -> None:
        await websocket.accept()
        await websocket.send_json({"user": user_id})
        await websocket.close()

    @web.websocket("/ws/users/{name}")
    async def named(websocket: WebSocket, name: str) -> None:
        await websocket.accept()
        await websocket.send_json({"name": name})
        await websocket.close()

    return web


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys.make()


@pytest.fixture(scope="module")
def ws_url(keys: Keys) -> Iterator[str]:
    with running(build_app(keys.store)) as url:
        yield url.replace("http://", "ws://", 1)


def opened(url: str, key: str | None = None, **headers: str) -> ClientConnection:
    """A WebSocket connection to ``url``, with ``key`` and ``headers``."""
    sent = {**(bearer(key) if key is not None else {}), **headers}
    return connect(url, additional_headers=sent, open_timeout=10)


def refusal(url: str, key: str | None = None, **headers: str) -> tuple[int, bytes]:
    """The status and body of the answer refusing a WebSocket handshake to ``url``."""
    with pytest.raises(InvalidStatus) as refused, opened(url, key, **headers):
        pass
    return refused.value.response.status_code, bytes(refused.value.response.body or b"")


def test_current_user_on_a_websocket_route_is_the_user_the_caller_acts_as(
    ws_url: str, keys: Keys
) -> None:
    with opened(f"{ws_url}/ws/user", keys.alice) as ws:
        assert ws.recv(timeout=10) == '{"user":"alice"}'
    with opened(f"{ws_url}/ws/user", keys.service, **{"X-User-Id": "bob"}) as ws:
        assert ws.recv(timeout=10) == '{"user":"bob"}'


def test_a_user_id_path_parameter_of_a_websocket_route_names_a_user(
    ws_url: str, keys: Keys
) -> None:
    status, body = refusal(f"{ws_url}/ws/of/bob", keys.alice)
    assert status == 403
    assert b"user_id path parameter names another user" in body
    with opened(f"{ws_url}/ws/of/alice", keys.alice) as ws:
        assert ws.recv(timeout=10) == '{"user":"alice"}'
    # A service key acts for the user the path names, and naming two users is a 422.
    with opened(f"{ws_url}/ws/of/bob", keys.service) as ws:
        assert ws.recv(timeout=10) == '{"user":"bob"}'
    assert refusal(f"{ws_url}/ws/of/bob", keys.service, **{"X-User-Id": "carol"})[0] == 422


def test_current_caller_on_a_websocket_route_is_the_callers_key(ws_url: str, keys: Keys) -> None:
    for key in (keys.bob, keys.service):
        with opened(f"{ws_url}/ws/caller", key) as ws:
            assert ws.recv(timeout=10) == f'{{"key_id":"{key.split("_")[1]}"}}'


@pytest.mark.parametrize("path", ["/ws/user", "/ws/caller"])
def test_a_websocket_route_of_the_caller_refuses_a_handshake_without_a_valid_key(
    ws_url: str, keys: Keys, path: str
) -> None:
    assert refusal(f"{ws_url}{path}")[0] == 401
    assert refusal(f"{ws_url}{path}", keys.revoked)[0] == 401


@pytest.mark.parametrize("path", ["/ws/user", "/ws/user?user_id=%FF"])
def test_a_refused_handshake_carries_its_request_id_and_is_not_stored(
    ws_url: str, keys: Keys, path: str
) -> None:
    # It carried neither header.
    with (
        pytest.raises(InvalidStatus) as refused,
        opened(f"{ws_url}{path}", **{"X-Request-Id": "r-1"}),
    ):
        pass
    headers = refused.value.response.headers
    assert headers["X-Request-Id"] == "r-1"
    assert headers["Cache-Control"] == "no-store"


def test_an_accepted_handshake_carries_its_request_id(ws_url: str, keys: Keys) -> None:
    with opened(f"{ws_url}/ws/user", keys.alice) as ws:
        assert ws.response is not None
        assert len(ws.response.headers["X-Request-Id"]) == 32  # a fresh one
    with opened(f"{ws_url}/ws/user", keys.alice, **{"X-Request-Id": "mine-2"}) as ws:
        assert ws.response is not None
        assert ws.response.headers["X-Request-Id"] == "mine-2"


def test_current_user_refuses_a_service_keys_handshake_naming_no_user(
    ws_url: str, keys: Keys
) -> None:
    status, body = refusal(f"{ws_url}/ws/user", keys.service)
    assert status == 422
    assert b"must name the user it acts for" in body


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/ws/user?user_id=%FE", b"the user_id query parameter is not UTF-8 text"),
        ("/ws/user?user_id=%FF", b"the user_id query parameter is not UTF-8 text"),
        ("/ws/users/%FF", b"the path is not UTF-8 text once percent-decoded"),
    ],
)
def test_a_handshake_whose_path_or_query_is_not_utf8_is_refused_as_a_request_would_be(
    ws_url: str, keys: Keys, path: str, message: bytes
) -> None:
    # Accepted, naming user "\ufffd" (%FE and %FF alike).
    status, body = refusal(f"{ws_url}{path}", keys.service)
    assert status == 422
    assert message in body


async def test_a_handshake_is_refused_with_a_close_saying_why_without_denial_responses() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "websocket.connect"}

    error = InvalidInputError("the path is not UTF-8 text once percent-decoded", field="path")
    await refuse_handshake(error, {"type": "websocket", "extensions": {}}, receive, send)
    assert sent == [
        {
            "type": "websocket.close",
            "code": 1008,
            "reason": "the path is not UTF-8 text once percent-decoded",
        }
    ]


def test_a_service_key_naming_two_users_is_refused_on_routes_an_app_adds(
    ws_url: str, keys: Keys
) -> None:
    # Both were accepted; an @app.endpoint route refused it.
    two_users = {**bearer(keys.service), "X-User-Id": "bob"}
    http_url = ws_url.replace("ws://", "http://", 1)
    answer = httpx.get(f"{http_url}/notes?user_id=carol", headers=two_users, timeout=10)
    assert answer.status_code == 422
    assert answer.json()["error"]["message"] == "the request names more than one user"
    status, body = refusal(f"{ws_url}/ws/open?user_id=carol", **two_users)
    assert status == 422
    assert b"the request names more than one user" in body
    with opened(f"{ws_url}/ws/open?user_id=bob", **two_users) as ws:  # the same user twice
        assert ws.recv(timeout=10) == "hello"


def test_a_websocket_is_closed_once_its_key_is_revoked(ws_url: str, keys: Keys) -> None:
    # It stayed open, and echoing, however long after the revoke.
    key = issue_key(keys.store, "dave")
    with opened(f"{ws_url}/ws/echo", key) as ws:
        ws.send("before")
        assert ws.recv(timeout=10) == "before"
        revoke_key(keys.store, key)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=15)  # idle: nothing sent meanwhile
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1008
    assert closed.value.rcvd.reason == "the API key was revoked"


@pytest.mark.parametrize("token", ["revoked", "some-other-services-token"])
def test_a_public_websocket_is_not_closed_for_a_bearer_token_it_does_not_need(
    ws_url: str, keys: Keys, token: str
) -> None:
    # Closed 1008 "the API key was revoked" a second after it was accepted.
    sent = keys.revoked if token == "revoked" else token
    key = issue_key(keys.store, "frank")
    with opened(f"{ws_url}/ws/public", sent) as public_ws, opened(f"{ws_url}/ws/echo", key) as ws:
        revoke_key(keys.store, key)
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=15)  # a check of the keys ran since, the public one's too
        public_ws.send("still open")
        assert public_ws.recv(timeout=10) == "still open"


def test_a_public_stream_is_not_ended_for_a_bearer_token_it_does_not_need(
    ws_url: str, keys: Keys
) -> None:
    # Ended after its first second, as if the key had been revoked.
    http_url = ws_url.replace("ws://", "http://", 1)
    answer = httpx.get(f"{http_url}/stream/public", headers=bearer(keys.revoked), timeout=30)
    assert answer.status_code == 200
    assert answer.text.splitlines() == [str(part) for part in range(STREAMED_PARTS)]


@pytest.mark.parametrize("path", ["/ws/user", "/ws/public"])
def test_a_handshake_from_a_page_of_another_origin_is_refused(
    ws_url: str, keys: Keys, path: str
) -> None:
    # Accepted: any page a user visited could open a connection with their key.
    status, body = refusal(f"{ws_url}{path}", keys.alice, Origin="https://evil.example")
    assert status == 403
    assert json.loads(body)["error"]["message"] == (
        "the handshake's origin is not one CORS_ALLOW_ORIGINS allows"
    )
    with opened(f"{ws_url}/ws/user", keys.alice) as ws:  # no Origin: not a browser's
        assert ws.recv(timeout=10) == '{"user":"alice"}'


@pytest.mark.parametrize(
    ("setting", "allowed", "refused"),
    [
        ("HTTPS://App.Example:443", "https://app.example", "https://evil.example"),
        ("*", "https://evil.example", None),
    ],
)
def test_a_handshake_from_an_origin_cors_allow_origins_allows_is_accepted(
    keys: Keys, setting: str, allowed: str, refused: str | None
) -> None:
    with running(build_app(keys.store, cors_allow_origins=setting)) as url:
        ws_url = url.replace("http://", "ws://", 1)
        with opened(f"{ws_url}/ws/user", keys.alice, Origin=allowed) as ws:
            assert ws.recv(timeout=10) == '{"user":"alice"}'
        if refused is not None:
            assert refusal(f"{ws_url}/ws/user", keys.alice, Origin=refused)[0] == 403


class CountingKeyStore(InMemoryKeyStore):
    """An in-memory key store counting the keys it is asked to check."""

    checks = 0

    async def authenticate(self, key: str) -> Principal:
        CountingKeyStore.checks += 1
        return await super().authenticate(key)


def test_an_open_websocket_checks_its_key_at_most_once_a_second(keys: Keys) -> None:
    store = CountingKeyStore()
    key = issue_key(store, "erin")
    with (
        running(build_app(store)) as url,
        opened(f"{url.replace('http://', 'ws://', 1)}/ws/echo", key) as ws,
    ):
        started = time.monotonic()
        for count in range(200):
            ws.send(str(count))
            assert ws.recv(timeout=10) == str(count)
            time.sleep(0.01)
        seconds = time.monotonic() - started
    # The handshake's check, then one a second at most (whatever the messages).
    assert CountingKeyStore.checks <= 1 + seconds + 1
