"""LocalDeployManager: an AgentApp or a plain function served on loopback, then stopped."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentscope_serverless.agents.demo import app as demo_app
from agentscope_serverless.auth import FileKeyStore
from agentscope_serverless.deployers import DeployManager, LocalDeployManager
from agentscope_serverless.schemas.agent_schemas import AgentRequest, TextContent
from agentscope_serverless.settings import load_settings
from tests.support.http import (
    Keys,
    assert_late_request_heads_are_cut_off,
    bearer,
    closed_by_the_server,
    issue_key,
    revoke_key,
    stream,
    user_message,
)


async def test_deploys_an_agent_app_and_stops_it(keys: Keys) -> None:
    manager = LocalDeployManager(host="127.0.0.1", port=0)
    assert isinstance(manager, DeployManager)
    assert not manager.is_running and manager.service_url is None
    info = await manager.deploy(demo_app, settings=load_settings(), key_store=keys.store)
    try:
        assert manager.is_running
        assert info["url"] == manager.service_url and info["deploy_id"] == manager.deploy_id
        assert "token" not in info  # the caller's own keys: none was made
        async with httpx.AsyncClient(base_url=info["url"], headers=bearer(keys.alice)) as client:
            assert (await client.get("/health")).status_code == 200
            body = {"input": [user_message("My name is Dana")], "stream": False}
            reply = (await client.post("/process", json=body)).json()
            assert reply["output"][0]["content"][0]["text"].startswith("Nice to meet you, Dana")
    finally:
        await manager.stop()
    assert not manager.is_running and manager.service_url is None
    async with httpx.AsyncClient() as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"{info['url']}/health")


def test_a_deployment_cuts_off_a_client_sending_half_a_request_head(keys: Keys) -> None:
    manager = LocalDeployManager(host="127.0.0.1", port=0)
    settings = load_settings(request_head_timeout_seconds=0.5)
    info = manager.deploy_sync(demo_app, settings=settings, key_store=keys.store)
    try:
        assert_late_request_heads_are_cut_off(info["url"])
    finally:
        manager.stop_sync()


def test_a_deployment_cuts_off_a_client_whose_body_stops_or_is_answered_first(
    keys: Keys,
) -> None:
    # A request head and one byte of its body, without a key: the 401 came at once, then the
    # connection stayed open, idle, for as long as the client wanted.
    manager = LocalDeployManager(host="127.0.0.1", port=0)
    settings = load_settings(request_body_timeout_seconds=0.5)
    info = manager.deploy_sync(demo_app, settings=settings, key_store=keys.store)
    url = httpx.URL(info["url"])
    address = (url.host, url.port)
    head = b"POST /process HTTP/1.1\r\nHost: agent\r\nContent-Length: 100000\r\n"
    try:
        with socket.create_connection(address) as keyless:
            keyless.sendall(head + b"\r\n")
            time.sleep(0.3)
            keyless.sendall(b"{")
            answer = keyless.recv(4096)
            assert answer.startswith(b"HTTP/1.1 401")
            assert b"connection: close" in answer.lower()
            assert closed_by_the_server(keyless)
        with socket.create_connection(address) as stalled:
            stalled.sendall(head + f"Authorization: Bearer {keys.alice}\r\n\r\n{{".encode())
            reply = b""
            stalled.settimeout(10)
            while chunk := stalled.recv(4096):  # the server closes the connection
                reply += chunk
            assert reply.startswith(b"HTTP/1.1 408"), reply
            assert b'"REQUEST_TIMEOUT"' in reply
    finally:
        manager.stop_sync()


async def echo_events(request: AgentRequest) -> AsyncIterator[TextContent]:
    for word in (request.input[-1].get_text_content() or "").split():
        yield TextContent(text=word, delta=True)


def test_deploys_a_plain_function_with_a_file_key_store(tmp_path: Path) -> None:
    key_file = tmp_path / "keys.json"
    store = FileKeyStore(key_file)
    key = issue_key(store, "erin")
    settings = load_settings(auth_keys_backend="file", auth_keys_file=str(key_file))
    started: list[dict[str, Any]] = []
    manager = LocalDeployManager(host="127.0.0.1", port=0)
    info = manager.deploy_sync(
        echo_events,
        endpoint_path="/echo",
        before_start=lambda app, **kw: started.append(kw),
        settings=settings,
        label="test",
    )
    try:
        assert started == [{"label": "test"}]
        with httpx.Client(base_url=info["url"], headers=bearer(key)) as client:
            _, sse = stream(client, "/echo", json={"input": [user_message("one two three")]})
            assert [e["text"] for e in sse.data] == ["one", "two", "three"]
            revoke_key(store, key)
            # The server checks the key file at most once a second.
            deadline = time.monotonic() + 3
            while client.post("/echo", json={"input": [user_message("x")]}).status_code != 401:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        manager.stop_sync()


@pytest.mark.parametrize(
    ("response_type", "expected"),
    [("json", lambda r: r.json() == ["a", "b"]), ("text", lambda r: r.text == "ab")],
)
def test_plain_function_response_types(keys: Keys, response_type: str, expected: Any) -> None:
    def letters(body: dict[str, Any]) -> Iterator[str]:
        assert body["user_id"] == "alice"
        yield from "ab"

    manager = LocalDeployManager(host="127.0.0.1", port=0)
    info = manager.deploy_sync(
        letters,
        request_model=None,
        response_type=response_type,
        settings=load_settings(),
        key_store=keys.store,
    )
    try:
        response = httpx.post(f"{info['url']}/process", json={}, headers=bearer(keys.alice))
        assert expected(response)
    finally:
        manager.stop_sync()


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b'{"text": "\\ud800"}', 422),  # a lone surrogate: not Unicode
        (b'{"n": NaN}', 422),
        (b'{"user": "bob"}', 403),
    ],
)
def test_a_plain_function_checks_a_body_of_another_content_type_as_it_reads_it(
    keys: Keys, body: bytes, status: int
) -> None:
    # The function's body is read as JSON whatever its type (curl -d sends a form's).
    manager = LocalDeployManager(host="127.0.0.1", port=0)
    info = manager.deploy_sync(
        lambda body: body,
        request_model=None,
        response_type="json",
        settings=load_settings(),
        key_store=keys.store,
    )
    try:
        headers = {**bearer(keys.alice), "Content-Type": "application/x-www-form-urlencoded"}
        response = httpx.post(f"{info['url']}/process", content=body, headers=headers)
        assert response.status_code == status, response.text
        as_json = httpx.post(
            f"{info['url']}/process",
            content=body,
            headers={**bearer(keys.alice), "Content-Type": "application/json"},
        )
        assert as_json.status_code == status
        assert response.json()["error"] == as_json.json()["error"]
    finally:
        manager.stop_sync()


def test_an_agent_app_keeps_its_own_configuration() -> None:
    with pytest.raises(TypeError, match="set them on the AgentApp"):
        LocalDeployManager(port=0).deploy_sync(demo_app, endpoint_path="/other")
    # Runner.deploy passes AgentScope's image inputs on (environment=...): named, not
    # blamed on the app's configuration.
    with pytest.raises(TypeError, match="does not take environment for an AgentApp"):
        LocalDeployManager(port=0).deploy_sync(demo_app, environment={"A": "1"})


def test_plain_function_sse_items_are_json(keys: Keys) -> None:
    manager = LocalDeployManager(host="127.0.0.1", port=0)
    info = manager.deploy_sync(
        lambda body: {"seen": body.session_id},
        settings=load_settings(),
        key_store=keys.store,
    )
    try:
        with httpx.Client(base_url=info["url"], headers=bearer(keys.alice)) as client:
            _, sse = stream(client, "/process", json={"input": [], "session_id": "s9"})
        assert sse.data == [{"seen": "s9"}]
        assert json.dumps(sse.data[0]) in sse.raw
    finally:
        manager.stop_sync()
