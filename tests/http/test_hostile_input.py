"""Hostile input on every backend: text that is not valid Unicode, other users, duplicated
identities, stalled bodies, empty deletes.

Each test runs against a server on the in-memory stores, on Redis, and on DynamoDB (moto's
server), with idempotency records in the same store as the history.
"""

from __future__ import annotations

import codecs
import json
import socket
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agentscope_serverless.agents.demo import app as demo_app
from agentscope_serverless.auth import InMemoryKeyStore
from agentscope_serverless.http import create_app
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS
from agentscope_serverless.services._validation import BLANK_USER_MESSAGE
from agentscope_serverless.settings import load_settings
from tests.support.backends import BACKENDS, backend_settings
from tests.support.http import a2a_send, bearer, invalid_status, issue_key, running

LONE = "\ud800"


@pytest.fixture(scope="module", params=BACKENDS)
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, InMemoryKeyStore]]:
    """A server on one backend, with its key store."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", LOCAL_AWS_CREDENTIALS["aws_access_key_id"])
        env.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_AWS_CREDENTIALS["aws_secret_access_key"])
        settings = load_settings(
            **backend_settings(request.param, request), request_body_timeout_seconds=1.0
        )
        store = InMemoryKeyStore()
        with running(create_app(settings=settings, agent_app=demo_app, key_store=store)) as url:
            yield url, store


@pytest.fixture
def client(server: tuple[str, InMemoryKeyStore]) -> Iterator[httpx.Client]:
    """A client acting as a fresh user."""
    url, store = server
    key = issue_key(store, f"user-{uuid.uuid4().hex[:10]}")
    with httpx.Client(base_url=url, headers=bearer(key), timeout=30) as http:
        yield http


def raw_json(value: Any) -> dict[str, Any]:
    """A request body with lone surrogates as JSON escapes (httpx refuses to encode them)."""
    return {
        "content": json.dumps(value),
        "headers": {"Content-Type": "application/json"},
    }


def text_message(text: str, **fields: Any) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}], **fields}


def refusal(response: httpx.Response, path: str, json_rpc_code: int) -> dict[str, Any]:
    """The error of ``response`` refusing an invalid request on ``path``: the API's, with its
    status and code; on A2A's JSON-RPC route, a JSON-RPC error ``json_rpc_code`` sent with
    200, as JSON-RPC errors are, the fields at fault in its data."""
    if path != "/a2a":
        assert response.status_code == invalid_status(path), response.text[:300]
        error: dict[str, Any] = response.json()["error"]
        assert error["code"] == "INVALID_INPUT"
        return error
    assert response.status_code == 200, response.text[:300]
    assert response.json()["jsonrpc"] == "2.0"
    error = response.json()["error"]
    assert error["code"] == json_rpc_code, error
    return {**error, **(error["data"] or {})}


# (method, path, body, where the bad text is): every field of every write route.
POISONED: list[tuple[str, str, Any, list[Any]]] = [
    ("POST", "/sessions", {"session_id": f"s{LONE}"}, ["body", "session_id"]),
    (
        "POST",
        "/sessions/s1/messages",
        {"messages": [text_message(f"hi {LONE}")]},
        ["body", "messages", 0, "content", 0, "text"],
    ),
    (
        "POST",
        "/sessions/s1/messages",
        {"messages": [text_message("hi", id=f"m{LONE}")]},
        ["body", "messages", 0, "id"],
    ),
    (
        "POST",
        "/sessions/s1/messages",
        {"messages": [text_message("hi", metadata={LONE: 1})]},
        ["body", "messages", 0, "metadata", "\\ud800"],
    ),
    ("POST", "/memory", {"messages": [text_message(LONE)]}, ["body", "messages", 0]),
    (
        "POST",
        "/memory",
        {"messages": [text_message("tea")], "session_id": LONE},
        ["body", "session_id"],
    ),
    ("POST", "/memory/search", {"query": f"tea {LONE}"}, ["body", "query"]),
    ("POST", "/state/s1", {"state": {"k": LONE}}, ["body", "state", "k"]),
    ("POST", "/state/s1", {"state": {"nested": [{LONE: 1}]}}, ["body", "state", "nested", 0]),
    (
        "POST",
        "/process",
        {"input": [text_message(LONE)], "stream": False},
        ["body", "input", 0],
    ),
    (
        "POST",
        "/process",
        {"input": [text_message("hi")], "session_id": LONE, "stream": False},
        ["body", "session_id"],
    ),
    (
        "POST",
        "/compatible-mode/v1/chat/completions",
        {"model": "agent", "messages": [{"role": "user", "content": LONE}]},
        ["body", "messages", 0, "content"],
    ),
    (
        "POST",
        "/compatible-mode/v1/responses",
        {"model": "agent", "input": f"hi {LONE}"},
        ["body", "input"],
    ),
    (
        "POST",
        "/a2a",
        a2a_send(f"My name is {LONE}"),
        ["body", "params", "message", "parts", 0, "text"],
    ),
]


def assert_nothing_stored(client: httpx.Client) -> None:
    sessions = client.get("/sessions")
    assert sessions.status_code == 200 and sessions.json()["items"] == []
    memory = client.get("/memory")
    assert memory.status_code == 200 and memory.json()["items"] == []
    search = client.post("/memory/search", json={"query": "tea hi"})
    assert search.status_code == 200 and search.json()["items"] == []
    rounds = client.get("/state/s1/rounds")
    assert rounds.status_code == 200 and rounds.json()["rounds"] == []


@pytest.mark.parametrize(
    ("method", "path", "body", "where"),
    POISONED,
    ids=[f"{m} {p} {w[1:]}" for m, p, _, w in POISONED],
)
def test_text_that_is_not_unicode_is_refused_naming_the_field_and_nothing_is_stored(
    client: httpx.Client, method: str, path: str, body: Any, where: list[Any]
) -> None:
    response = client.request(method, path, **raw_json(body))
    error = refusal(response, path, -32602)
    assert error["fields"][0]["loc"][: len(where)] == where
    assert "Unicode" in error["message"]
    assert_nothing_stored(client)


# (method, path, body with a number JSON cannot carry, where it is): Python's parser reads
# NaN, Infinity and 1e999 as floats, which a store would have kept as null.
NONFINITE: list[tuple[str, str, str, list[Any]]] = [
    (
        "POST",
        "/sessions/s1/messages",
        '{"messages": [{"role": "user", "content": "hi", "metadata": {"score": NaN}}]}',
        ["body", "messages", 0, "metadata", "score"],
    ),
    (
        "POST",
        "/sessions/s1/messages",
        '{"messages": [{"role": "user",'
        ' "content": [{"type": "data", "data": {"x": [1, 1e999]}}]}]}',
        ["body", "messages", 0, "content", 0, "data", "x", 1],
    ),
    (
        "POST",
        "/memory",
        '{"messages": [{"role": "user", "content": "tea", "usage": {"t": -Infinity}}]}',
        ["body", "messages", 0, "usage", "t"],
    ),
    ("POST", "/state/s1", '{"state": {"k": Infinity}}', ["body", "state", "k"]),
    (
        "POST",
        "/process",
        '{"input": [{"role": "user", "content": "hi", "metadata": {"a": -1e400}}],'
        ' "stream": false}',
        ["body", "input", 0, "metadata", "a"],
    ),
    (
        "POST",
        "/compatible-mode/v1/chat/completions",
        '{"model": "agent", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        ["body", "temperature"],
    ),
    # Each A2A binding: the message's metadata went to the history, then the answer failed.
    (
        "POST",
        "/a2a",
        '{"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {'
        '"role": "user", "kind": "message", "messageId": "m1", "metadata": {"x": NaN},'
        ' "parts": [{"kind": "text", "text": "hi"}]}}}',
        ["body", "params", "message", "metadata", "x"],
    ),
    (
        "POST",
        "/a2a/message:send",
        '{"message": {"role": "ROLE_USER", "messageId": "m1", "metadata": {"x": Infinity},'
        ' "parts": [{"text": "hi"}]}}',
        ["body", "message", "metadata", "x"],
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "where"),
    NONFINITE,
    ids=[f"{m} {p} {w[1:]}" for m, p, _, w in NONFINITE],
)
def test_a_number_json_cannot_carry_is_refused_naming_the_field_and_nothing_is_stored(
    client: httpx.Client, method: str, path: str, body: str, where: list[Any]
) -> None:
    response = client.request(
        method, path, content=body, headers={"Content-Type": "application/json"}
    )
    error = refusal(response, path, -32602)
    assert error["fields"][0]["loc"] == where
    assert "NaN" in error["message"]
    assert_nothing_stored(client)


# (path, body, what the error says): bodies a JSON parser cannot read for other reasons
# than their syntax.
UNREADABLE: list[tuple[str, bytes, str]] = [
    ("/sessions", b'{"session_id": "s\xff"}', "the body is not valid UTF-8 text"),
    ("/state/s1", b'{"state": {"n": ' + b"9" * 5000 + b"}}", "more than 4300 digits"),
    ("/a2a", b'{"jsonrpc": "2.0", "id": 1, "method": "\xfe"}', "the body is not valid UTF-8"),
]


# Text a chat shows as nothing: whitespace and format characters (zero width space, word
# joiner, byte order mark, zero width non-joiner and joiner, soft hyphen, invisible separator,
# Arabic letter mark).
INVISIBLE = " \u200b\u2060\ufeff\t\u200c\u200d\u00ad\n\u2063\u061c "

# (path, body holding a user message of INVISIBLE, where it is): every route taking one.
INVISIBLE_MESSAGES: list[tuple[str, Any, list[Any]]] = [
    ("/process", {"input": [text_message(INVISIBLE)], "stream": False}, ["input[0].content"]),
    (
        "/process",
        {"input": [{"role": "user", "content": INVISIBLE}], "stream": True},
        ["input[0].content"],
    ),
    ("/sessions/s1/messages", {"messages": [text_message(INVISIBLE)]}, ["messages[0].content"]),
    (
        "/compatible-mode/v1/chat/completions",
        {"model": "agent", "messages": [{"role": "user", "content": INVISIBLE}]},
        ["messages", 0, "content"],
    ),
    (
        "/compatible-mode/v1/chat/completions",
        {"model": "agent", "messages": [text_message(INVISIBLE)], "stream": True},
        ["messages", 0, "content"],
    ),
    ("/compatible-mode/v1/responses", {"model": "agent", "input": INVISIBLE}, ["input"]),
    (
        "/compatible-mode/v1/responses",
        {"model": "agent", "input": [{"role": "user", "content": INVISIBLE}]},
        ["input", 0, "content"],
    ),
    ("/a2a", a2a_send(INVISIBLE), []),
]


@pytest.mark.parametrize(
    ("path", "body", "where"),
    INVISIBLE_MESSAGES,
    ids=[f"{p} {w}" for p, _, w in INVISIBLE_MESSAGES],
)
def test_a_user_message_of_invisible_characters_is_refused_as_blank_and_nothing_is_stored(
    client: httpx.Client, path: str, body: Any, where: list[Any]
) -> None:
    # It was taken as a message: stored, run as an empty turn, and listed as a blank session.
    response = client.post(path, json=body)
    error = refusal(response, path, -32602)
    if path == "/a2a":
        assert "the message holds no text" in error["message"]
    else:
        assert BLANK_USER_MESSAGE in error["message"]
        assert error["fields"][0]["loc"] == where
    assert_nothing_stored(client)


# A family (joined by zero width joiners), a flag, and a word holding a soft hyphen.
JOINED = "\U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001f3f3\ufe0f\u200d\U0001f308 co\u00adop"


def test_visible_text_with_format_characters_is_taken_as_it_is(client: httpx.Client) -> None:
    session = f"joined-{uuid.uuid4().hex[:8]}"
    stored = client.post(f"/sessions/{session}/messages", json={"messages": [text_message(JOINED)]})
    assert stored.status_code == 201, stored.text
    ran = client.post(
        "/process",
        json={"input": [text_message("\u200b" + JOINED)], "session_id": session, "stream": False},
    )
    assert ran.status_code == 200, ran.text
    chat = client.post(
        "/compatible-mode/v1/chat/completions",
        json={"model": "agent", "messages": [{"role": "user", "content": JOINED}]},
    )
    assert chat.status_code == 200, chat.text
    messages = client.get(f"/sessions/{session}/messages").json()["items"]
    users = [m["content"][0]["text"] for m in messages if m["role"] == "user"]
    assert users == [JOINED, "\u200b" + JOINED]


@pytest.mark.parametrize(("path", "body", "says"), UNREADABLE, ids=[p for p, _, _ in UNREADABLE])
def test_a_body_that_cannot_be_read_is_refused_saying_why(
    client: httpx.Client, path: str, body: bytes, says: str
) -> None:
    response = client.post(path, content=body, headers={"Content-Type": "application/json"})
    error = refusal(response, path, -32700)
    assert says in error["message"]
    assert error["fields"][0]["loc"] == ["body"]
    assert_nothing_stored(client)


# (route, a body it runs): every way a route reads its JSON body.
JSON_ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/sessions", {"session_id": "s1"}),
    ("/process", {"input": [text_message("hi")], "stream": False}),
    (
        "/compatible-mode/v1/chat/completions",
        {"model": "agent", "messages": [{"role": "user", "content": "hi"}]},
    ),
    ("/compatible-mode/v1/responses", {"model": "agent", "input": "hi"}),
    ("/a2a", a2a_send("hi")),
    (
        "/a2a/message:send",
        {"message": {"role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "hi"}]}},
    ),
]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32", "utf-32-be"])
@pytest.mark.parametrize(("path", "body"), JSON_ROUTES, ids=[p for p, _ in JSON_ROUTES])
def test_a_body_in_utf16_or_utf32_is_refused_as_not_utf8(
    client: httpx.Client, path: str, body: dict[str, Any], encoding: str
) -> None:
    # Python's JSON parser reads bytes in UTF-16 and UTF-32 too: they were run. Without a
    # byte order mark, ASCII text in UTF-16 is valid UTF-8 bytes, its NUL bytes no JSON.
    content = json.dumps(body).encode(encoding)
    response = client.post(path, content=content, headers={"Content-Type": "application/json"})
    error = refusal(response, path, -32700)
    assert error["message"] == "the body is not valid UTF-8 text"
    assert_nothing_stored(client)


@pytest.mark.parametrize("charset", ["latin-1", "ISO-8859-1", "utf-16", '"windows-1252"'])
@pytest.mark.parametrize(("path", "body"), JSON_ROUTES, ids=[p for p, _ in JSON_ROUTES])
def test_a_json_body_said_to_be_in_another_charset_is_refused(
    client: httpx.Client, path: str, body: dict[str, Any], charset: str
) -> None:
    # Its bytes were read as UTF-8 whatever the charset said: "é" in latin-1 is not UTF-8,
    # and ASCII text was run as if the charset had been UTF-8.
    content_type = f"application/json; charset={charset}"
    response = client.post(path, content=json.dumps(body), headers={"Content-Type": content_type})
    named = charset.strip('"').lower()
    message = f"the body must be UTF-8 JSON: charset {named!r} is not supported"
    if path == "/a2a":
        assert response.status_code == 200, response.text
        assert response.json()["error"]["code"] == -32700
        assert response.json()["error"]["message"] == message
    else:
        assert response.status_code == 415, response.text
        error = response.json()["error"]
        assert (error["code"], error["message"]) == ("UNSUPPORTED_MEDIA_TYPE", message)
    assert_nothing_stored(client)


@pytest.mark.parametrize("charset", ["utf-8", "UTF-8", "utf8", '"utf-8"', None])
@pytest.mark.parametrize("bom", [b"", codecs.BOM_UTF8], ids=["", "bom"])
def test_a_body_in_utf8_is_run_whatever_the_case_of_its_charset_and_its_byte_order_mark(
    client: httpx.Client, charset: str | None, bom: bytes
) -> None:
    # RFC 8259: a sender must not add a byte order mark, a parser may ignore one.
    content_type = "application/json" + (f"; charset={charset}" if charset else "")
    body = {"input": [text_message("héllo")], "stream": False, "session_id": "s-é"}
    content = bom + json.dumps(body, ensure_ascii=False).encode()
    response = client.post("/process", content=content, headers={"Content-Type": content_type})
    assert response.status_code == 200, response.text
    assert response.json()["session_id"] == "s-é"
    created = client.post(
        "/sessions",
        content=bom + '{"session_id": "s2-é"}'.encode(),
        headers={"Content-Type": content_type},
    )
    assert created.status_code == 201, created.text


def test_a_deep_body_of_another_content_type_is_never_a_server_error(
    client: httpx.Client,
) -> None:
    # The routes do not read such a body as JSON.
    deep = nested(300_000).encode()
    plain = {"Content-Type": "text/plain"}
    for path in ("/sessions", "/a2a", "/a2a/message:send"):
        assert client.post(path, content=deep, headers=plain).status_code == 415
    assert client.request("GET", "/sessions", content=deep, headers=plain).status_code == 200
    assert_nothing_stored(client)


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/sessions", "text/plain"),
        ("/process", "application/x-www-form-urlencoded"),
        ("/state/s1", "multipart/form-data; boundary=x"),
        ("/compatible-mode/v1/chat/completions", "text/json"),
    ],
)
def test_a_json_route_sent_another_media_type_says_so(
    client: httpx.Client, path: str, content_type: str
) -> None:
    # It was a 422 "Input should be a valid dictionary", while the OpenAPI document
    # promised a 415 no route gave.
    body = b'{"session_id": "s1", "state": {}, "input": [], "messages": [], "model": "m"}'
    response = client.post(path, content=body, headers={"Content-Type": content_type})
    assert response.status_code == 415, response.text
    kind = content_type.partition(";")[0]
    assert response.json()["error"] == {
        "code": "UNSUPPORTED_MEDIA_TYPE",
        "message": f"the body must be JSON (Content-Type: application/json), not {kind!r}",
        "type": "invalid_request_error",
        "param": None,
    }
    assert_nothing_stored(client)


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("POST", "/state/%FE"),
        ("POST", "/sessions/%80/messages"),
        ("GET", "/sessions/%ED%A0%80"),  # a lone surrogate, in UTF-8's own form
        ("GET", "/sessions?cursor=%FF"),
    ],
)
def test_a_url_that_is_not_utf8_once_decoded_is_refused(
    client: httpx.Client, method: str, url: str
) -> None:
    # Read with U+FFFD for each byte, /state/%FE and /state/%C0 named the same session.
    body = {"state": {"k": 1}} if url.startswith("/state") else {"messages": []}
    response = client.request(method, url, json=body if method == "POST" else None)
    assert response.status_code == 422, response.text
    where, says = (
        ("cursor", "the cursor query parameter is not UTF-8 text")
        if "?" in url
        else ("path", "the path is not UTF-8 text once percent-decoded")
    )
    assert response.json()["error"] == {
        "code": "INVALID_INPUT",
        "message": says,
        "type": "invalid_request_error",
        "param": where,
        "fields": [{"loc": [where], "msg": says}],
    }
    assert client.get("/state/%EF%BF%BD/rounds").json()["rounds"] == []
    assert_nothing_stored(client)


def test_a_path_id_is_answered_as_stored_without_its_surrounding_whitespace(
    client: httpx.Client,
) -> None:
    saved = client.post("/state/%20ws%20", json={"state": {"k": 1}})
    assert saved.json() == {"session_id": "ws", "round_id": 1}
    assert client.get("/state/ws").json()["session_id"] == "ws"
    assert client.get("/state/%20ws/rounds").json() == {"session_id": "ws", "rounds": [1]}


def test_a_session_id_of_a_control_character_is_refused_not_replaced(
    client: httpx.Client,
) -> None:
    for path, body in (
        ("/sessions", {"session_id": "\x1c"}),
        ("/process", {"input": [text_message("hi")], "session_id": "\x1c", "stream": False}),
    ):
        response = client.post(path, json=body)
        assert response.status_code == 422, response.text
        assert response.json()["error"]["fields"][0]["loc"][-1] == "session_id"
    assert client.delete("/memory/%1C").status_code == 422
    assert_nothing_stored(client)


def test_a_body_naming_another_user_is_refused_on_every_route(client: httpx.Client) -> None:
    other = {"user_id": "someone-else"}
    openai_user = {"user": "someone-else"}
    for method, path, body in (
        ("POST", "/sessions", {"session_id": "s1", **other}),
        ("POST", "/sessions/s1/messages", {"messages": [text_message("hi")], **other}),
        ("POST", "/memory", {"messages": [text_message("tea")], **openai_user}),
        ("POST", "/memory/search", {"query": "tea", **other}),
        ("POST", "/state/s1", {"state": {}, **openai_user}),
        ("DELETE", "/sessions/s1", other),
        ("GET", "/sessions", other),
        ("POST", "/process", {"input": [text_message("hi")], **openai_user}),
    ):
        response = client.request(method, path, json=body)
        assert response.status_code == 403, (method, path, response.text)
        assert response.json()["error"]["code"] == "PERMISSION_DENIED"
    assert_nothing_stored(client)


def test_a_user_named_twice_is_refused(server: tuple[str, InMemoryKeyStore]) -> None:
    url, store = server
    service = issue_key(store)
    with httpx.Client(base_url=url, timeout=30) as http:
        twice = http.get(
            "/sessions", headers=[*bearer(service).items(), ("X-User-Id", "a"), ("X-User-Id", "a")]
        )
        assert twice.status_code == 422
        assert "more than once" in twice.json()["error"]["message"]
        query = http.get(
            "/sessions", params=[("user_id", "a"), ("user_id", "b")], headers=bearer(service)
        )
        assert query.status_code == 422
        once = http.get("/sessions", headers={**bearer(service), "X-User-Id": "a"})
        assert once.status_code == 200
        # Proxies join repeated headers with commas: such a value is refused too...
        joined = http.get("/sessions", headers={**bearer(service), "X-User-Id": "a, b"})
        assert joined.status_code == 422 and "joined" in joined.json()["error"]["message"]
        # ...and a user whose id holds a comma is named in the query.
        comma = http.get("/sessions", params={"user_id": "a, b"}, headers=bearer(service))
        assert comma.status_code == 200


def test_a_stalled_body_times_out(server: tuple[str, InMemoryKeyStore]) -> None:
    url, store = server
    key = issue_key(store, "stalled")
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as connection:
        connection.sendall(
            b"POST /sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {key}\r\n".encode()
            + b'Content-Length: 100\r\n\r\n{"session_id"'
        )
        reply = b""
        while chunk := connection.recv(65536):  # the server closes the connection
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert b'"REQUEST_TIMEOUT"' in reply


def test_deleting_memories_without_words_succeeds(client: httpx.Client) -> None:
    added = client.post("/memory", json={"messages": [text_message("!!! ???")], "session_id": "s"})
    assert added.status_code == 201
    assert client.post("/memory/search", json={"query": "nothing"}).json()["items"] == []
    assert client.delete("/memory/s").status_code == 204
    assert client.get("/memory").json()["items"] == []


def test_appending_a_message_id_twice_keeps_one_copy(client: httpx.Client) -> None:
    first = text_message("once", id="msg-fixed")
    stored = client.post("/sessions/s1/messages", json={"messages": [first]})
    assert stored.status_code == 201
    again = client.post("/sessions/s1/messages", json={"messages": [first, text_message("new")]})
    assert again.status_code == 201
    assert [m["content"][0]["text"] for m in again.json()["messages"]] == ["once", "new"]
    # The id with other content is not taken for a retry, answered with the stored message.
    changed = client.post(
        "/sessions/s1/messages",
        json={"messages": [text_message("changed", id="msg-fixed"), text_message("newer")]},
    )
    assert changed.status_code == 409
    assert changed.json()["error"]["code"] == "MESSAGE_ID_CONFLICT"
    items = client.get("/sessions/s1/messages").json()["items"]
    assert [m["content"][0]["text"] for m in items] == ["once", "new"]


def nested(levels: int, leaf: str = "1") -> str:
    """JSON text of ``levels`` arrays within each other around ``leaf``."""
    return "[" * levels + leaf + "]" * levels


HOLE = "<value>"
DATA_MESSAGE = f'{{"role": "user", "content": [{{"type": "data", "data": {{"v": {HOLE}}}}}]}}'

# Every route with a JSON body, with a HOLE for a deeply nested value where a client puts
# data of its own.
NESTED_BODIES: list[tuple[str, str]] = [
    ("/process", f'{{"input": [{DATA_MESSAGE}], "stream": false}}'),
    ("/process", HOLE),
    ("/compatible-mode/v1/chat/completions", f'{{"model": "m", "messages": {HOLE}}}'),
    ("/compatible-mode/v1/responses", f'{{"model": "m", "input": {HOLE}}}'),
    ("/sessions", f'{{"session_id": {HOLE}}}'),
    ("/sessions/s1/messages", f'{{"messages": [{DATA_MESSAGE}]}}'),
    ("/memory", f'{{"messages": [{DATA_MESSAGE}], "session_id": "s1"}}'),
    ("/memory/search", f'{{"query": {HOLE}}}'),
    ("/state/s1", f'{{"state": {{"v": {HOLE}}}}}'),
    ("/a2a", f'{{"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {HOLE}}}'),
]


@pytest.mark.parametrize("levels", [101, 5_000, 300_000])
@pytest.mark.parametrize(("path", "body"), NESTED_BODIES, ids=[p for p, _ in NESTED_BODIES])
def test_a_body_nesting_too_deeply_is_refused_before_it_is_parsed(
    client: httpx.Client, path: str, body: str, levels: int
) -> None:
    content = body.replace(HOLE, nested(levels)).encode()
    response = client.post(path, content=content, headers={"Content-Type": "application/json"})
    error = refusal(response, path, -32700)
    message = "the request body nests deeper than 100 levels of arrays and objects"
    if path == "/a2a":
        assert (error["message"], error["data"]) == (message, None)
    else:
        assert error == {
            "code": "INVALID_INPUT",
            "message": message,
            "type": "invalid_request_error",
            "param": None,
        }
    assert_nothing_stored(client)


def nested_objects(levels: int, first_key: str) -> str:
    """JSON text of ``levels`` objects within each other, the outermost one's key ``first_key``,
    the others' ``"a"``."""
    return f'{{"{first_key}": ' + '{"a": ' * (levels - 1) + "1" + "}" * levels


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16", "utf-32"])
@pytest.mark.parametrize(("path", "body"), NESTED_BODIES, ids=[p for p, _ in NESTED_BODIES])
def test_a_body_in_utf16_or_utf32_nesting_too_deeply_is_refused_before_it_is_parsed(
    client: httpx.Client, path: str, body: str, encoding: str
) -> None:
    # JSON's parser reads UTF-16 and UTF-32 too. There U+2200 holds a byte '"': read as
    # UTF-8, every bracket after it would seem to lie inside a string.
    content = body.replace(HOLE, nested_objects(5_000, "\u2200")).encode(encoding)
    response = client.post(path, content=content, headers={"Content-Type": "application/json"})
    error = refusal(response, path, -32700)
    assert error["message"] == "the request body nests deeper than 100 levels of arrays and objects"
    assert_nothing_stored(client)


def test_a_body_of_one_hundred_levels_is_stored_and_read_back(client: httpx.Client) -> None:
    # {"state": {"v": <98 arrays>}}: 100 levels, the most a body may nest.
    deepest = json.loads(nested(98))
    saved = client.post("/state/s1", json={"state": {"v": deepest}})
    assert saved.status_code == 201, saved.text
    assert client.get("/state/s1").json()["state"] == {"v": deepest}
    refused = client.post("/state/s1", json={"state": {"v": [deepest]}})
    assert refused.status_code == 422
    assert client.get("/state/s1/rounds").json()["rounds"] == [1]


def test_brackets_inside_strings_do_not_count_and_chunks_are_read_as_one_body(
    client: httpx.Client,
) -> None:
    def chunked(value: str) -> Iterator[bytes]:  # sent chunked, 7 bytes at a time
        body = ('{"state": {"s": ' + value + "}}").encode()
        for start in range(0, len(body), 7):
            yield body[start : start + 7]

    headers = {"Content-Type": "application/json"}
    text = '"[{' + "[" * 500 + '\\"' + "{" * 500 + '"'
    stored = client.post("/state/s1", content=chunked(text), headers=headers)
    assert stored.status_code == 201, stored.text
    assert client.get("/state/s1").json()["state"]["s"].startswith("[{[[")
    deep = client.post("/state/s2", content=chunked(nested(200)), headers=headers)
    assert deep.status_code == 422
    assert client.get("/state/s2/rounds").json()["rounds"] == []


@pytest.mark.parametrize("session_id", ["a/b", ".", ".."])
def test_a_session_id_no_url_can_name_is_refused_before_anything_is_stored(
    client: httpx.Client, session_id: str
) -> None:
    body = {"input": [text_message("hi")], "session_id": session_id, "stream": False}
    for path, json_body in (
        ("/process", body),
        ("/sessions", {"session_id": session_id}),
        ("/memory", {"messages": [text_message("hi")], "session_id": session_id}),
    ):
        response = client.post(path, json=json_body)
        assert response.status_code == 422, response.text
        assert "session_id must not contain '/'" in response.json()["error"]["message"]
    assert_nothing_stored(client)


def test_every_other_session_id_is_reached_through_its_url(client: httpx.Client) -> None:
    session_id = "a?b#c %2F\\é 🙂 ..."
    body = {"input": [text_message("hi")], "session_id": session_id, "stream": False}
    assert client.post("/process", json=body).status_code == 200
    (listed,) = client.get("/sessions").json()["items"]
    assert listed["id"] == session_id
    quoted = urllib.parse.quote(session_id, safe="")
    assert client.get(f"/sessions/{quoted}").json()["id"] == session_id
    messages = client.get(f"/sessions/{quoted}/messages").json()["items"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert client.delete(f"/sessions/{quoted}").status_code == 204
    assert client.get("/sessions").json()["items"] == []
