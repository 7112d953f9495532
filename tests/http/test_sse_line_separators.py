"""A reply holding U+2028, U+2029 or U+0085 (models write them): the server's streams carry
them as JSON escapes, and the project's clients (the CLI, ``HTTPAgentAPIClient``) read them
whole, whoever sends them; so do A2A's streams, which the ``a2a-sdk`` writes, and its client
reads them whole."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import get_artifact_text, new_text_message
from a2a.types import Role, SendMessageRequest

from agentscope_serverless import AgentApp
from agentscope_serverless.auth import InMemoryKeyStore
from agentscope_serverless.helpers.agent_api_client import (
    HTTPAgentAPIClient,
    create_simple_text_request,
    extract_text_from_event,
)
from agentscope_serverless.helpers.sse_lines import SSELineDecoder
from agentscope_serverless.http.sse import escaping_line_breaks
from agentscope_serverless.schemas.agent_schemas import AgentResponse, Message
from agentscope_serverless.settings import load_settings
from tests.support.http import bearer, issue_key, running
from tests.support.raw_server import raw_servers

SCRIPT = str(Path(sys.executable).parent / "agentscope-serverless")
REPLY = "first\u2028second\u2029third\x85fourth"
BREAKS = ("\u2028", "\u2029", "\x85")


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, str]]:
    app = AgentApp(app_name="separators")

    @app.query(framework="text")
    async def query(self, msgs, request=None, **kwargs):  # type: ignore[no-untyped-def]
        yield REPLY

    @app.endpoint("/said", methods=["GET"])
    async def said():  # type: ignore[no-untyped-def]
        yield {"text": REPLY}

    store = InMemoryKeyStore()
    key = issue_key(store, "dev")
    with running(app.get_fastapi_app(settings=load_settings(), key_store=store)) as url:
        yield url, key


def raw_stream(method: str, url: str, key: str, **kwargs: object) -> tuple[httpx.Response, bytes]:
    with httpx.stream(method, url, headers=bearer(key), timeout=30, **kwargs) as response:  # type: ignore[arg-type]
        return response, response.read()


def test_the_servers_streams_carry_the_characters_as_json_escapes(
    served: tuple[str, str],
) -> None:
    url, key = served
    body = {"input": [{"role": "user", "content": "hi"}], "stream": True}
    process, streamed = raw_stream("POST", f"{url}/process", key, json=body)
    run = process.headers["x-run-id"]
    _, replayed = raw_stream("GET", f"{url}/runs/{run}/events", key)
    model = httpx.get(f"{url}/compatible-mode/v1/models", headers=bearer(key)).json()
    chat = {"model": model["data"][0]["id"], "stream": True}
    chat["messages"] = [{"role": "user", "content": "hi"}]
    _, completions = raw_stream(
        "POST", f"{url}/compatible-mode/v1/chat/completions", key, json=chat
    )
    _, custom = raw_stream("GET", f"{url}/said", key)
    for raw in (streamed, replayed, completions, custom):
        text = raw.decode()
        assert not any(char in text for char in BREAKS)
        assert "first\\u2028second\\u2029third\\u0085fourth" in text
    events = [
        json.loads(line[6:]) for line in streamed.decode().split("\n") if line[:6] == "data: "
    ]
    assert events[-1]["object"] == "response" and events[-1]["status"] == "completed"
    assert events[-1]["output"][0]["content"][0]["text"] == REPLY


def test_the_client_reads_a_reply_holding_the_characters_whole(served: tuple[str, str]) -> None:
    url, key = served
    client = HTTPAgentAPIClient(f"{url}/process", token=key)
    events = list(client.stream(create_simple_text_request("hi")))
    assert isinstance(events[-1], AgentResponse) and events[-1].status == "completed"
    [message] = [e for e in events if isinstance(e, Message) and e.status == "completed"]
    assert extract_text_from_event(message) == REPLY


async def test_the_async_client_reads_a_reply_holding_the_characters_whole(
    served: tuple[str, str],
) -> None:
    url, key = served
    client = HTTPAgentAPIClient(f"{url}/process", token=key)
    events = [e async for e in client.astream(create_simple_text_request("hi"))]
    [message] = [e for e in events if isinstance(e, Message) and e.status == "completed"]
    assert extract_text_from_event(message) == REPLY


def test_cli_invoke_prints_a_reply_holding_the_characters_whole(served: tuple[str, str]) -> None:
    url, key = served
    said = subprocess.run(
        [SCRIPT, "invoke", "hi", "--url", url, "--key", key],
        capture_output=True,
        env={**os.environ, "LC_ALL": "C.UTF-8", "PYTHONUTF8": "1"},
        timeout=60,
    )
    stdout, stderr = said.stdout.decode(), said.stderr.decode()
    assert said.returncode == 0, stderr
    # U+0085 is a C1 control character: the CLI shows those escaped.
    assert stdout.startswith("first\u2028second\u2029third\\x85fourth\n"), stdout
    assert "Traceback" not in stderr


def event_stream_with_raw_breaks(connection: socket.socket, head: bytes) -> None:
    """Another server's stream: the characters raw in the JSON, lines ended by \\r\\n."""
    lines = [
        'data: {"object":"content","type":"text","delta":true,"msg_id":"m1","index":0,'
        f'"text":{json.dumps(REPLY, ensure_ascii=False)}}}',
        'data: {"object":"response","status":"completed","id":"r1"}',
    ]
    body = "".join(line + "\r\n\r\n" for line in lines).encode()
    connection.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
    )


def test_the_client_reads_the_characters_sent_raw_by_another_server() -> None:
    with raw_servers() as start:
        server = start(event_stream_with_raw_breaks)
        client = HTTPAgentAPIClient(f"{server.url}/process", token="ask_any")
        events = list(client.stream(create_simple_text_request("hi")))
    assert [extract_text_from_event(e) for e in events[:1]] == [REPLY]
    assert isinstance(events[-1], AgentResponse) and events[-1].status == "completed"


def test_lines_end_at_cr_lf_and_crlf_only_even_split_across_pieces() -> None:
    decoder = SSELineDecoder()
    pieces = ["data: a\u2028b\r", "\ndata: c\x85", "d\rdata: e\n", "\n", "data: f"]
    lines = [line for piece in pieces for line in decoder.decode(piece)] + decoder.flush()
    assert lines == ["data: a\u2028b", "data: c\x85d", "data: e", "", "data: f"]


@pytest.mark.parametrize(
    ("method", "version"), [("SendStreamingMessage", "1.0"), ("message/stream", "0.3")]
)
def test_an_a2a_stream_carries_the_characters_as_json_escapes(
    served: tuple[str, str], method: str, version: str
) -> None:
    # The SDK's streams wrote them raw, as its encoder does.
    url, key = served
    message: dict[str, Any] = {"role": "user", "messageId": "m1", "parts": [{"text": "hi"}]}
    if version == "0.3":
        message = {**message, "kind": "message", "parts": [{"kind": "text", "text": "hi"}]}
    else:
        message["role"] = "ROLE_USER"
    call = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"message": message}}
    headers = {**bearer(key), "A2A-Version": version}
    with httpx.stream("POST", f"{url}/a2a", json=call, headers=headers, timeout=30) as response:
        raw = response.read()
    text = raw.decode()
    assert not any(char in text for char in BREAKS)
    assert "first\\u2028second\\u2029third\\u0085fourth" in text


async def test_the_a2a_sdk_client_streams_a_reply_holding_the_characters_whole(
    served: tuple[str, str],
) -> None:
    # Its client, reading lines with str.splitlines, broke the event: "Unterminated string".
    url, key = served
    async with httpx.AsyncClient(headers=bearer(key), timeout=30) as http:
        config = ClientConfig(httpx_client=http, streaming=True)
        client = await ClientFactory(config).create_from_url(url)
        request = SendMessageRequest(message=new_text_message("hi", role=Role.ROLE_USER))
        events = [event async for event in client.send_message(request)]
    chunks = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
    assert "".join(get_artifact_text(chunk) for chunk in chunks) == REPLY


async def test_a_character_split_between_two_pieces_of_a_stream_is_escaped_whole() -> None:
    sent: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message.get("body", b""))

    escaped = escaping_line_breaks(send)
    encoded = 'data: "a\u2028b\u2029c\x85"\n\n'.encode()
    for at in range(len(encoded)):
        body = {"type": "http.response.body", "more_body": True}
        await escaped({**body, "body": encoded[at : at + 1]})
    await escaped({"type": "http.response.body", "body": b"", "more_body": False})
    assert b"".join(sent) == b'data: "a\\u2028b\\u2029c\\u0085"\n\n'
