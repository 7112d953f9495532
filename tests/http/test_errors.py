"""The one error mapping, over real HTTP: 422, 413, 404, 405, 500 and 503, with request ids."""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.responses import StreamingResponse

from agentscope_serverless.agents.demo import app as demo_app
from agentscope_serverless.app import AgentApp
from agentscope_serverless.auth import FileKeyStore
from agentscope_serverless.http import create_app
from agentscope_serverless.http.function_app import create_function_app
from agentscope_serverless.http.middleware import DRAIN_BYTES, DRAIN_SECONDS
from agentscope_serverless.settings import load_settings
from tests.http.conftest import SECRET
from tests.support.http import Keys, bearer, invalid_status, issue_key, running, user_message

LIMIT = 4096


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    return error


@pytest.mark.parametrize(
    ("method", "path", "body", "loc"),
    [
        ("POST", "/process", {"session_id": "s"}, ["body", "input"]),
        (
            "POST",
            "/process",
            {"input": [{"role": "robot", "content": "hi"}]},
            ["body", "input", 0, "role"],
        ),
        ("POST", "/process", {"input": [user_message("hi")], "n": 9}, ["body", "n"]),
        ("POST", "/sessions/s/messages", {"messages": []}, ["body", "messages"]),
        ("POST", "/memory", {"messages": "hello"}, ["body", "messages"]),
        ("POST", "/memory/search", {"query": ""}, ["body", "query"]),
        ("POST", "/state/s", {"state": "not an object"}, ["body", "state"]),
        ("POST", "/state/s", {"state": {}, "round_id": 0}, ["body", "round_id"]),
        ("GET", "/sessions?limit=0", None, ["query", "limit"]),
        # A repeated one was read as its last value, the others ignored.
        ("GET", "/sessions?limit=10&limit=20", None, ["query", "limit"]),
        ("GET", "/runs?session_id=a&session_id=b", None, ["query", "session_id"]),
        ("GET", "/memory?page_num=1&page_size=5&page_size=6", None, ["query", "page_size"]),
        ("GET", "/memory?page_size=5000", None, ["query", "page_size"]),
        ("GET", "/sessions?cursor=%21%21", None, ["query", "cursor"]),
        ("POST", "/compatible-mode/v1/responses", {"model": "m"}, ["body", "input"]),
    ],
)
def test_malformed_requests_are_refused_naming_the_field(
    client_for: Callable[..., httpx.Client],
    keys: Keys,
    method: str,
    path: str,
    body: Any,
    loc: list[Any],
) -> None:
    response = client_for(keys.alice).request(method, path, json=body)
    assert response.status_code == invalid_status(path)
    error = error_of(response)
    assert error["code"] == "INVALID_INPUT"
    assert loc in [field["loc"] for field in error["fields"]]
    # What OpenAI's SDKs read of an error: its type, and the parameter it names.
    assert error["type"] == "invalid_request_error"
    named = ".".join(str(p) for p in error["fields"][0]["loc"][1:])  # after "body", "query"
    assert error["param"] == named.replace(".0", "[0]")  # input[0].role
    assert ".".join(str(p) for p in loc) in error["message"] or loc == ["cursor"]


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        (
            "/process",
            {"model": "m", "messages": [user_message("hi")]},
            "'messages' is the body of /compatible-mode/v1/chat/completions: this route "
            "takes 'input'",
        ),
        (
            "/compatible-mode/v1/responses",
            {"model": "m", "messages": [user_message("hi")]},
            "'messages' is the body of /compatible-mode/v1/chat/completions",
        ),
        (
            "/process",
            {"input": "hi"},
            'input is a list of messages, as [{"role": "user", "content": "Hello"}], not a text',
        ),
        (
            "/compatible-mode/v1/chat/completions",
            {"messages": "hi"},
            "messages is a list of messages, as [",
        ),
        (
            "/compatible-mode/v1/chat/completions",
            {"input": [user_message("hi")], "session_id": "s"},
            "'input' is the body of /process and /compatible-mode/v1/responses: this route "
            "takes 'messages'",
        ),
    ],
)
def test_a_body_of_another_shape_says_what_this_route_takes(
    client_for: Callable[..., httpx.Client], keys: Keys, path: str, body: Any, said: str
) -> None:
    response = client_for(keys.alice).post(path, json=body)
    assert response.status_code == invalid_status(path)
    assert said in error_of(response)["message"]


def test_invalid_json_gets_422(client_for: Callable[..., httpx.Client], keys: Keys) -> None:
    response = client_for(keys.alice).post(
        "/process", content=b'{"input": [', headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert error_of(response)["fields"][0]["loc"][0] == "body"


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (
            b"{'input': [{'role': 'user', 'content': 'hi'}]}",
            "Expecting property name enclosed in double quotes at line 1, column 2",
        ),
        (
            b'{"input": [\n  {"role": "user", "content": "hi"},\n]}',
            "Expecting value at line 3, column 1",
        ),
    ],
)
def test_a_body_that_is_not_json_is_said_to_be_so_and_where(
    client_for: Callable[..., httpx.Client], keys: Keys, body: bytes, said: str
) -> None:
    response = client_for(keys.alice).post(
        "/process", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    message = error_of(response)["message"]
    assert message.startswith("the body is not valid JSON: ") and said in message
    assert "JSON takes double quotes, and no comma after a last item" in message


def test_validation_errors_do_not_echo_the_input(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    response = client_for(keys.alice).post("/state/s", json={"state": SECRET})
    assert response.status_code == 422
    assert SECRET not in response.text


@pytest.fixture(scope="module")
def small_limit_url(keys: Keys) -> Iterator[str]:
    settings = load_settings(max_request_bytes=LIMIT)
    with running(create_app(settings=settings, agent_app=demo_app, key_store=keys.store)) as url:
        yield url


def oversized_body() -> bytes:
    padding = "x" * (LIMIT + 100)
    return f'{{"input": [{{"role": "user", "content": "{padding}"}}]}}'.encode()


def test_a_body_over_the_limit_gets_413_from_its_content_length(
    small_limit_url: str, keys: Keys
) -> None:
    with httpx.Client(base_url=small_limit_url, headers=bearer(keys.alice)) as client:
        response = client.post(
            "/process", content=oversized_body(), headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 413
    error = error_of(response)
    assert error["code"] == "PAYLOAD_TOO_LARGE"
    assert str(LIMIT) in error["message"]


def test_a_streamed_body_over_the_limit_gets_413(small_limit_url: str, keys: Keys) -> None:
    body = oversized_body()

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 1000):
            yield body[start : start + 1000]

    with httpx.Client(base_url=small_limit_url, headers=bearer(keys.alice)) as client:
        response = client.post(
            "/process", content=chunks(), headers={"Content-Type": "application/json"}
        )
    assert "content-length" not in response.request.headers
    assert response.status_code == 413
    assert error_of(response)["code"] == "PAYLOAD_TOO_LARGE"


async def test_a_client_writing_its_whole_body_before_reading_gets_the_413(
    small_limit_url: str, keys: Keys
) -> None:
    """httpx's async client (as most SDKs) sends all of a body before reading the answer: a
    connection closed under it while it still sends is reset, and the 413 was lost."""
    body = b'{"state": {"text": "' + b"x" * 4_000_000 + b'"}}'
    headers = {**bearer(keys.alice), "Content-Type": "application/json"}
    statuses = []
    for _ in range(5):
        async with httpx.AsyncClient(base_url=small_limit_url, headers=headers) as client:
            statuses.append((await client.post("/state/s", content=body)).status_code)
    assert statuses == [413] * 5


def test_a_body_declared_far_too_large_is_read_no_further_than_the_drain_bound(
    small_limit_url: str, keys: Keys
) -> None:
    """The refused body is read (and dropped) for a moment only: a client sending 10 GB
    gets its 413 and the connection closes once DRAIN_BYTES are read."""
    host, port = httpx.URL(small_limit_url).host, httpx.URL(small_limit_url).port
    assert port is not None
    head = (
        f"POST /state/s HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {keys.alice}\r\n"
        "Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n"
    )
    sent = 0
    with socket.create_connection((host, port), timeout=10) as connection:
        connection.sendall(head.encode())
        chunk = b"x" * 65536
        started = time.monotonic()
        try:
            while time.monotonic() - started < 20:
                connection.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        answer = b""
        with contextlib.suppress(OSError):
            while data := connection.recv(65536):
                answer += data
    assert sent < DRAIN_BYTES + 32 * 1024 * 1024  # what the sockets' buffers hold besides
    assert time.monotonic() - started < DRAIN_SECONDS + 5
    assert answer.startswith(b"HTTP/1.1 413"), answer[:100]


def answer_head(url: str, request_head: str) -> tuple[bytes, float]:
    """The head of the answer to ``request_head`` sent alone (no body follows), and the
    seconds it took."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    assert port is not None
    with socket.create_connection((host, port), timeout=10) as connection:
        started = time.monotonic()
        connection.sendall(request_head.encode())
        answer = b""
        while b"\r\n\r\n" not in answer and (data := connection.recv(65536)):
            answer += data
        return answer.partition(b"\r\n\r\n")[0], time.monotonic() - started


@pytest.mark.parametrize("path", ["/process", "/state/s", "/compatible-mode/v1/chat/completions"])
def test_a_caller_without_a_valid_key_gets_401_whatever_body_it_declares(
    small_limit_url: str, keys: Keys, path: str
) -> None:
    # It got the body's 415 (compressed) or 413 (too large, after waiting for the body it
    # declared): the key is checked first, and nothing of the body is read without one.
    forged = "Bearer ask_0123456789abcdef_" + "A" * 43
    for authorization in (None, forged, f"Bearer {keys.revoked}", "Basic YWxpY2U6c2VjcmV0"):
        sent = {} if authorization is None else {"Authorization": authorization}
        for extra in ({}, {"Idempotency-Key": f"k-{uuid.uuid4().hex}"}):
            compressed = httpx.post(
                f"{small_limit_url}{path}",
                content=gzip.compress(b'{"input": []}'),
                headers={**sent, **extra, "Content-Type": "application/json",
                         "Content-Encoding": "gzip"},
            )  # fmt: skip
            assert compressed.status_code == 401, compressed.text
            assert compressed.headers["www-authenticate"] == "Bearer"
            lines = "".join(f"{name}: {value}\r\n" for name, value in {**sent, **extra}.items())
            head, took = answer_head(
                small_limit_url,
                f"POST {path} HTTP/1.1\r\nHost: test\r\n{lines}Content-Type: application/json"
                f"\r\nContent-Length: {LIMIT * 100}\r\n\r\n",
            )
            assert head.startswith(b"HTTP/1.1 401"), head
            assert took < DRAIN_SECONDS / 2
    # With a valid key, the body's refusal.
    head, _ = answer_head(
        small_limit_url,
        f"POST {path} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {keys.alice}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {LIMIT * 100}\r\n\r\n",
    )
    assert head.startswith(b"HTTP/1.1 413"), head


def test_routes_without_a_key_refuse_a_body_too_large_or_compressed_as_before(
    small_limit_url: str,
) -> None:
    for path in ("/health", "/no-such-route"):
        compressed = httpx.post(
            f"{small_limit_url}{path}", content=b"{}", headers={"Content-Encoding": "gzip"}
        )
        assert compressed.status_code == 415, compressed.text
        assert compressed.headers["Accept-Encoding"] == "identity"
        large = httpx.post(f"{small_limit_url}{path}", content=b"x" * (LIMIT + 1))
        assert large.status_code == 413, large.text
        assert error_of(large)["code"] == "PAYLOAD_TOO_LARGE"
        assert large.headers["Connection"] == "close"
    health = httpx.get(f"{small_limit_url}/health", headers={"Content-Encoding": "gzip"})
    assert health.status_code == 415


def test_a_body_under_the_limit_is_served(small_limit_url: str, keys: Keys) -> None:
    with httpx.Client(base_url=small_limit_url, headers=bearer(keys.alice)) as client:
        response = client.post("/process", json={"input": [user_message("hi")], "stream": False})
    assert response.status_code == 200


def test_a_round_id_of_true_is_refused_and_round_1_kept(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    # It was read as round 1 and overwrote it (the services refuse a bool for a round).
    client = client_for(keys.alice)
    path = f"/state/rounds-{uuid.uuid4().hex}"
    assert client.post(path, json={"state": {"kept": True}}).json()["round_id"] == 1
    response = client.post(path, json={"state": {"kept": False}, "round_id": True})
    assert response.status_code == 422, response.text
    assert error_of(response)["param"] == "round_id"
    assert client.get(path, params={"round_id": 1}).json()["state"] == {"kept": True}


@pytest.mark.parametrize("coding", ["gzip", "br", "deflate, gzip"])
def test_a_compressed_body_is_refused_saying_to_send_it_uncompressed(
    client_for: Callable[..., httpx.Client], keys: Keys, coding: str
) -> None:
    # It was read as JSON text as it came, and refused as "not valid UTF-8 text".
    client = client_for(keys.alice)
    path = f"/state/compressed-{uuid.uuid4().hex}"
    body = gzip.compress(json.dumps({"state": {"k": "x" * 10_000}}).encode())
    headers = {"Content-Type": "application/json", "Content-Encoding": coding}
    response = client.post(path, content=body, headers=headers)
    assert response.status_code == 415, response.text
    assert response.headers["Accept-Encoding"] == "identity"
    assert error_of(response)["message"] == (
        f"the request body must be sent uncompressed: Content-Encoding {coding!r} is not supported"
    )
    assert client.get(path).status_code == 404
    # A coding that compresses nothing (a charset sent by mistake too): read as it comes.
    for plain in ("identity", "UTF-8"):
        headers = {"Content-Type": "application/json", "Content-Encoding": plain}
        stored = client.post(path, json={"state": {"k": 1}}, headers=headers)
        assert stored.status_code == 201, stored.text


@pytest.mark.parametrize("coding", ["gzip, chunked", "foo, chunked"])
def test_a_body_of_a_transfer_coding_but_chunked_is_refused_saying_to_send_it_uncompressed(
    demo_url: str, keys: Keys, coding: str
) -> None:
    # The server undid the chunks only: gzip was read as the body (a 422 "not valid UTF-8
    # text") and a coding it does not know was ignored.
    session_id = f"coded-{uuid.uuid4().hex[:8]}"
    body = json.dumps({"session_id": session_id}).encode()
    if coding.startswith("gzip"):
        body = gzip.compress(body)
    host, port = httpx.URL(demo_url).host, httpx.URL(demo_url).port
    assert port is not None
    with socket.create_connection((host, port), timeout=10) as connection:
        connection.sendall(
            f"POST /sessions HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {keys.alice}\r\n"
            f"Content-Type: application/json\r\nTransfer-Encoding: {coding}\r\n\r\n".encode()
            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        )
        answer = b""
        while data := connection.recv(65536):
            answer += data
    head, _, content = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 415"), answer[:300]
    assert json.loads(content)["error"]["message"] == (
        f"the request body must be sent uncompressed: Transfer-Encoding {coding!r} is not supported"
    )
    created = httpx.get(f"{demo_url}/sessions/{session_id}", headers=bearer(keys.alice))
    assert created.status_code == 404


def test_every_answer_without_a_cache_control_of_its_own_is_not_to_be_stored(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    # A user's sessions, messages, memory and runs (and the refusals) were answered with no
    # Cache-Control: a browser's cache, or a proxy told to cache these paths, could keep them.
    client = client_for(keys.alice)
    session_id = f"cached-{uuid.uuid4().hex[:8]}"
    assert client.post("/sessions", json={"session_id": session_id}).status_code == 201
    run = {"input": [user_message("hi")], "session_id": session_id, "stream": False}
    assert client.post("/process", json=run).status_code == 200
    answers = [
        client.get(path)
        for path in (
            "/sessions",
            f"/sessions/{session_id}",
            f"/sessions/{session_id}/messages",
            "/memory",
            f"/runs?session_id={session_id}",
            "/sessions/nope",
            "/health",
            "/openapi.json",
        )
    ]
    answers.append(client_for(None).get("/sessions"))
    for answer in answers:
        assert answer.headers["cache-control"] == "no-store", (answer.url, answer.status_code)
    # An event stream keeps its own: no-cache.
    with client.stream("POST", "/process", json={**run, "stream": True}) as streamed:
        assert streamed.headers.get_list("cache-control") == ["no-cache"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/process", {"input": [{"role": "user", "content": "hi"}], "stream": False}),
        ("/state/untyped", {"state": {"k": 1}}),
        ("/sessions", {"session_id": "untyped"}),
        ("/memory", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/compatible-mode/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ],
)
def test_a_json_body_sent_without_a_content_type_is_refused_saying_to_name_it(
    client_for: Callable[..., httpx.Client], keys: Keys, path: str, body: dict[str, Any]
) -> None:
    # It was refused as a 422 saying the body was no object ("Input should be a valid
    # dictionary or object"), though it was one: the routes read JSON only when named so.
    client = client_for(keys.alice)
    response = client.post(path, content=json.dumps(body).encode())
    assert "content-type" not in response.request.headers
    assert response.status_code == 415, response.text
    assert error_of(response)["message"] == (
        "the body must be JSON (Content-Type: application/json), and no Content-Type was sent"
    )


def test_unknown_routes_and_missing_things_get_404(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    client = client_for(keys.alice)
    missing_route = client.get("/no/such/route")
    assert missing_route.status_code == 404
    assert error_of(missing_route)["code"] == "NOT_FOUND"
    missing_session = client.get("/sessions/never-created")
    assert missing_session.status_code == 404
    assert error_of(missing_session)["code"] == "SESSION_NOT_FOUND"
    assert client.get("/sessions/never-created/messages").status_code == 404
    assert client.get("/state/never-saved").status_code == 404


def test_a_wrong_method_gets_405(client_for: Callable[..., httpx.Client], keys: Keys) -> None:
    response = client_for(keys.alice).get("/process")
    assert response.status_code == 405
    assert error_of(response)["code"] == "METHOD_NOT_ALLOWED"
    assert response.headers["Allow"] == "POST"


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/sessions", "GET, HEAD, POST"),
        ("/sessions/s1", "DELETE, GET, HEAD"),
        ("/memory", "DELETE, GET, HEAD, POST"),
        ("/state/s1", "DELETE, GET, HEAD, POST"),
    ],
)
def test_a_405_allows_every_method_of_the_path(
    client_for: Callable[..., httpx.Client], keys: Keys, path: str, allowed: str
) -> None:
    # Allow named the methods of the first route of the path only (POST for /sessions).
    response = client_for(keys.alice).put(path, json={})
    assert response.status_code == 405, response.text
    assert response.headers["Allow"] == allowed


def test_an_unexpected_error_is_a_500_without_internals(keys: Keys) -> None:
    def explode(body: Any) -> Any:
        raise RuntimeError(f"database password is {SECRET}")

    app = create_function_app(explode, settings=load_settings(), key_store=keys.store)
    with running(app) as url, httpx.Client(base_url=url, headers=bearer(keys.alice)) as client:
        response = client.post("/process", json={"anything": 1}, headers={"X-Request-Id": "req-42"})
    assert response.status_code == 500
    assert error_of(response) == {
        "code": "INTERNAL_ERROR",
        "message": "internal server error",
        "type": "server_error",
        "param": None,
    }
    assert SECRET not in response.text and "Traceback" not in response.text
    assert response.headers["x-request-id"] == "req-42"


def test_a_plain_functions_body_that_is_not_utf8_is_refused_before_it_runs(keys: Keys) -> None:
    called: list[Any] = []
    app = create_function_app(called.append, settings=load_settings(), key_store=keys.store)
    with running(app) as url, httpx.Client(base_url=url, headers=bearer(keys.alice)) as client:
        for content_type, body, status in (
            ("application/json", '{"a": 1}'.encode("utf-16"), 422),
            ("application/json", '{"a": 1}'.encode("utf-32-be"), 422),
            ("text/plain", '{"a": 1}'.encode("utf-16-le"), 422),
            ("application/json; charset=latin-1", b'{"a": 1}', 415),
        ):
            response = client.post("/process", content=body, headers={"Content-Type": content_type})
            assert response.status_code == status, response.text
            assert "UTF-8" in error_of(response)["message"]
    assert called == []


def test_an_unexpected_error_is_logged_once_as_json_and_the_connection_kept(
    keys: Keys, capfd: pytest.CaptureFixture[str], info_logs: None
) -> None:
    # The exception's text is the client's: it must not forge a log line of its own.
    forged = '{"level":"INFO","message":"forged"}'

    def explode(body: Any) -> Any:
        raise RuntimeError(f"bad input\n{forged}")

    page = "https://app.example.com"
    settings = load_settings(cors_allow_origins=page)
    app = create_function_app(explode, settings=settings, key_store=keys.store)
    with running(app) as url, httpx.Client(base_url=url, headers=bearer(keys.alice)) as client:
        capfd.readouterr()
        failed = client.post("/process", json={}, headers={"Origin": page, "X-Request-Id": "r-9"})
        # The same connection serves the next request.
        assert client.get("/health").status_code == 200
    out, err = capfd.readouterr()
    assert failed.status_code == 500 and error_of(failed)["code"] == "INTERNAL_ERROR"
    # A page can read the answer, and quote its request id.
    assert failed.headers["access-control-allow-origin"] == page
    assert failed.headers["x-request-id"] == "r-9"
    lines = [json.loads(line) for line in (out + err).splitlines() if line.strip()]
    (logged,) = [line for line in lines if line.get("level") == "ERROR"]
    assert logged["request_id"] == "r-9" and forged in logged["exception"]
    assert [line["status"] for line in lines if line["message"] == "request"] == [500, 200]


def test_a_function_serving_no_agent_keeps_the_settings_secrets_out_of_its_log(
    keys: Keys, capfd: pytest.CaptureFixture[str], info_logs: None
) -> None:
    key = f"sk-{uuid.uuid4().hex}"  # no other test has given it to the logger

    def explode(body: Any) -> Any:
        raise RuntimeError(f"the chat API refused {key}")

    settings = load_settings(llm_api_key=key)
    app = create_function_app(explode, settings=settings, key_store=keys.store)
    with running(app) as url:
        failed = httpx.post(f"{url}/process", json={}, headers=bearer(keys.alice))
    logged = capfd.readouterr().out
    assert failed.status_code == 500
    assert "the chat API refused ***" in logged and key not in logged


def test_a_response_failing_after_it_began_is_cut_and_logged_with_its_request_id(
    keys: Keys, capfd: pytest.CaptureFixture[str], info_logs: None
) -> None:
    agent = AgentApp(app_name="exporter")

    @agent.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> str:
        return "ok"

    @agent.endpoint("/export", methods=["GET"])
    async def export() -> StreamingResponse:
        async def rows() -> AsyncIterator[str]:
            yield "row 1\n"
            raise RuntimeError("the export lost its source")

        return StreamingResponse(rows(), media_type="text/plain")

    app = create_app(settings=load_settings(), agent_app=agent, key_store=keys.store)
    with running(app) as url, httpx.Client(base_url=url, headers=bearer(keys.alice)) as client:
        capfd.readouterr()
        exporting = client.stream("GET", "/export", headers={"X-Request-Id": "export-1"})
        # Cut, not ended: the client knows it has not got the whole of it.
        with exporting as answer, pytest.raises(httpx.RemoteProtocolError):
            answer.read()
    out, err = capfd.readouterr()
    assert "Traceback" not in err
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    (failure,) = [line for line in lines if line["level"] == "ERROR"]
    assert failure["request_id"] == "export-1"
    assert "the export lost its source" in failure["exception"]


def test_health_is_503_when_a_store_is_down(tmp_path: Path) -> None:
    key_file = tmp_path / "keys.json"
    settings = load_settings(auth_keys_backend="file", auth_keys_file=str(key_file))
    issue_key(FileKeyStore(key_file), "alice")
    with running(create_app(["sessions"], settings=settings)) as url:
        assert httpx.get(f"{url}/health").status_code == 200
        key_file.write_text("{ not json")
        time.sleep(1.1)  # the key file is checked at most once a second, as for requests
        response = httpx.get(f"{url}/health")
    assert response.status_code == 503
    assert response.json() == {
        "status": "degraded",
        # A session's deletion deletes its stored runs and its agent state: the runs and
        # state stores serve it too.
        "services": {"session_history": True, "state": True, "runs": True, "auth_keys": False},
        "runner": "not_ready",  # the sessions function serves no agent
    }


def test_a_store_failure_is_a_503(tmp_path: Path) -> None:
    key_file = tmp_path / "keys.json"
    settings = load_settings(auth_keys_backend="file", auth_keys_file=str(key_file))
    key = issue_key(FileKeyStore(key_file), "alice")
    with running(create_app(["sessions"], settings=settings)) as url:
        key_file.write_text("{ not json")
        response = httpx.get(f"{url}/sessions", headers=bearer(key))
    assert response.status_code == 503
    assert error_of(response)["code"] == "STORE_UNAVAILABLE"


def test_request_ids_are_echoed_or_made(client_for: Callable[..., httpx.Client]) -> None:
    client = client_for(None)
    assert (
        client.get("/health", headers={"X-Request-Id": "abc-123"}).headers["x-request-id"]
        == "abc-123"
    )
    made = client.get("/health", headers={"X-Request-Id": "bad id\twith spaces"}).headers[
        "x-request-id"
    ]
    assert made != "bad id\twith spaces" and len(made) == 32
    assert client.get("/no/such/route").headers["x-request-id"]
