"""Streamed ``@app.endpoint`` routes as AgentScope Runtime 1.0.5 streams them: every item a
``data:`` line of JSON, models and dataclasses as objects at any depth, a generator that
raises ending with AgentScope's error item (secrets hidden), and a sync generator that
blocks holding up no other request."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import HTTPException, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from agentscope_serverless import AgentApp
from agentscope_serverless.schemas.agent_schemas import Message, TextContent
from agentscope_serverless.settings import load_settings
from tests.support.http import (
    InMemoryKeyStore,
    bearer,
    issue_key,
    parse_sse,
    revoke_key,
    running,
)

SECRET = "sk-custom-endpoint-secret"
# Set when the sync generator of /ticking is closed.
TICKING_CLOSED = threading.Event()
# Set as the async generator of /cleaning has cleaned up, awaits included.
CLEANED = threading.Event()
# Set as the cleanup of /stuck-cleaning has done its first await, and as it is cut short.
STUCK_CLEANUP_STARTED = threading.Event()
STUCK_CLEANUP_CUT_SHORT = threading.Event()
# Set as the cleanup of /stuck-sync-cleaning starts; it ends once the test releases it.
SYNC_CLEANUP_STARTED = threading.Event()
SYNC_CLEANUP_RELEASED = threading.Event()


class OwnBaseException(BaseException):
    """A library's exception that is no ``Exception``."""


# What an endpoint raises that is no Exception, by name.
NOT_EXCEPTIONS: dict[str, BaseException] = {
    "interrupt": KeyboardInterrupt("stop"),
    "exit": SystemExit(3),
    "generator-exit": GeneratorExit(),
    "own": OwnBaseException(f"mine {SECRET}"),
}


@dataclass
class Point:
    x: int
    y: int


class Mapped:
    """An SDK object of the kind AgentScope turns into JSON through ``to_dict()``."""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "mapped", "point": Point(5, 6)}


def build_app(released: threading.Event) -> AgentApp:
    app = AgentApp(app_name="endpoints")

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        yield "unused"

    @app.endpoint("/objects")
    async def objects(body: dict[str, Any]) -> AsyncIterator[Any]:
        yield {"message": Message(role="user", content=[TextContent(text="hi")])}
        yield Point(1, 2)
        yield {"points": (Point(3, 4),), "tags": {"a"}}
        yield Mapped()

    @app.endpoint("/mixed", methods=["GET"])
    async def mixed() -> AsyncIterator[Any]:
        yield b"event: raw\ndata: \xff\n\n"
        yield "h\u00e9"
        yield bytearray(b"data: 2\n\n")
        yield {"k": "\u00e9"}

    @app.endpoint("/mixed-plain", methods=["GET"])
    def mixed_plain() -> Iterator[Any]:
        yield b"event: raw\ndata: \xff\n\n"
        yield "h\u00e9"
        yield bytearray(b"data: 2\n\n")
        yield {"k": "\u00e9"}

    @app.endpoint("/failing")
    async def failing(body: dict[str, Any]) -> AsyncIterator[dict[str, int]]:
        yield {"i": 0}
        raise ValueError(f"upstream refused key {SECRET}")

    @app.endpoint("/interrupted", methods=["GET"])
    async def interrupted() -> AsyncIterator[int]:
        yield 0
        raise KeyboardInterrupt("stop")

    @app.endpoint("/interrupted-plain", methods=["GET"])
    def interrupted_plain() -> Iterator[int]:
        yield 0
        raise KeyboardInterrupt("stop")

    @app.endpoint("/base-failing", methods=["GET"])
    def base_failing(kind: str) -> dict[str, str]:
        raise NOT_EXCEPTIONS[kind]

    @app.endpoint("/async-base-failing", methods=["GET"])
    async def async_base_failing(kind: str) -> dict[str, str]:
        raise NOT_EXCEPTIONS[kind]

    @app.endpoint("/blocking")
    def blocking(body: dict[str, Any]) -> Iterator[str]:
        yield "waiting"
        # A blocking wait, as a sync generator calling a blocking client does: released by
        # another request, which only a server that is not blocked can answer.
        yield "released" if released.wait(timeout=30) else "never released"

    @app.endpoint("/ticking", methods=["GET"])
    def ticking() -> Iterator[int]:
        try:
            for tick in range(10_000):
                yield tick
                time.sleep(0.05)
        finally:
            TICKING_CLOSED.set()

    @app.endpoint("/cleaning", methods=["GET"])
    async def cleaning() -> AsyncIterator[int]:
        try:
            for tick in range(10_000):
                yield tick
                await asyncio.sleep(0.05)
        finally:
            await asyncio.sleep(0.05)  # a cleanup's await: closing a connection, saving
            await asyncio.sleep(0.05)
            CLEANED.set()

    @app.endpoint("/stuck-cleaning", methods=["GET"])
    async def stuck_cleaning() -> AsyncIterator[int]:
        try:
            yield 0
            await asyncio.Event().wait()  # news that never come
        finally:
            await asyncio.sleep(0.05)
            STUCK_CLEANUP_STARTED.set()
            try:
                await asyncio.Event().wait()  # a cleanup that never ends
            except asyncio.CancelledError:
                STUCK_CLEANUP_CUT_SHORT.set()
                raise

    @app.endpoint("/stuck-sync-cleaning", methods=["GET"])
    def stuck_sync_cleaning() -> Iterator[int]:
        try:
            for tick in range(10_000):
                yield tick
                time.sleep(0.05)
        finally:
            SYNC_CLEANUP_STARTED.set()
            SYNC_CLEANUP_RELEASED.wait(timeout=120)  # a cleanup that never ends

    @app.endpoint("/scores", methods=["GET"])
    async def scores() -> AsyncIterator[dict[str, float]]:
        yield {"score": 0.5}
        yield {"score": float("nan"), "max": float("inf")}
        yield {"score": 1.0}

    @app.endpoint("/teapot/{shape}", methods=["GET"])
    async def teapot(shape: str) -> None:
        detail: Any = {"why": "teapot"} if shape == "dict" else ["short", "stout"]
        if shape == "secret":
            detail = f"upstream refused key {SECRET}"
        elif shape == "secret-dict":
            detail = {"why": f"upstream refused key {SECRET}", "key": SECRET}
        raise HTTPException(418, detail=detail, headers={"X-Teapot": "1"})

    @app.endpoint("/raw", methods=["POST"])
    async def raw(request: Request) -> dict[str, Any]:
        return {"got": await request.json()}

    @app.endpoint("/raw-bytes", methods=["POST"])
    async def raw_bytes(request: Request) -> dict[str, int]:
        return {"length": len(await request.body())}

    @app.endpoint("/release", methods=["POST"])
    async def release() -> dict[str, bool]:
        released.set()
        return {"released": True}

    return app


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, str]]:
    store = InMemoryKeyStore()
    key = issue_key(store, "dev")
    app = build_app(threading.Event())
    settings = load_settings(llm_api_key=SECRET)
    with running(app.get_fastapi_app(settings=settings, key_store=store)) as url:
        yield url, key


def test_models_dataclasses_and_mapped_objects_stream_as_json_objects(
    served: tuple[str, str],
) -> None:
    url, key = served
    with httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client:
        response = client.post("/objects", json={})
    items = parse_sse(response.text.splitlines()).data
    assert items[0]["message"]["role"] == "user"
    assert items[0]["message"]["content"][0]["text"] == "hi"
    assert items[1:] == [
        {"x": 1, "y": 2},
        {"points": [{"x": 3, "y": 4}], "tags": ["a"]},
        {"kind": "mapped", "point": {"x": 5, "y": 6}},
    ]


@pytest.mark.parametrize("path", ["/mixed", "/mixed-plain"])
def test_bytes_stream_as_they_are_text_as_utf8_json_and_dicts_as_json(
    served: tuple[str, str], path: str
) -> None:
    # The bytes went out as their repr: data: "b'event: raw\\ndata: \\xff\\n\\n'".
    url, key = served
    with httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client:
        response = client.get(path)
    assert response.content == (
        b"event: raw\ndata: \xff\n\n"
        + 'data: "h\u00e9"\n\n'.encode()
        + b"data: 2\n\n"
        + 'data: {"k": "\u00e9"}\n\n'.encode()
    )


def test_a_generator_that_raises_ends_with_agentscopes_error_item(
    served: tuple[str, str],
) -> None:
    url, key = served
    with httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client:
        response = client.post("/failing", json={})
    assert response.status_code == 200
    assert parse_sse(response.text.splitlines()).data == [
        {"i": 0},
        {
            "error": "upstream refused key ***",
            "error_type": "ValueError",
            "message": "Error in streaming generator",
        },
    ]


def test_a_blocking_sync_generator_holds_up_no_other_request(served: tuple[str, str]) -> None:
    url, key = served
    with (
        httpx.Client(base_url=url, headers=bearer(key), timeout=60) as client,
        client.stream("POST", "/blocking", json={}) as response,
    ):
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:")) == 'data: "waiting"'
        with httpx.Client(base_url=url, headers=bearer(key), timeout=60) as other:
            assert other.post("/release").json() == {"released": True}
        assert next(line for line in lines if line.startswith("data:")) == 'data: "released"'


@pytest.mark.parametrize(
    ("content_type", "body", "status"),
    [
        ("application/json", '{"a": 1}'.encode("utf-16"), 422),
        ("application/json", '{"a": 1}'.encode("utf-16-le"), 422),
        ("application/json; charset=iso-8859-1", b'{"a": 1}', 415),
    ],
    ids=["utf-16", "utf-16-le", "charset=iso-8859-1"],
)
def test_a_body_that_is_not_utf8_is_refused_before_the_endpoint_runs(
    served: tuple[str, str], content_type: str, body: bytes, status: int
) -> None:
    # Python's JSON parser read UTF-16 too: the endpoint ran.
    url, key = served
    response = httpx.post(
        f"{url}/objects", content=body, headers={**bearer(key), "Content-Type": content_type}
    )
    assert response.status_code == status, response.text
    assert "UTF-8" in response.json()["error"]["message"]


def test_a_sync_generator_is_closed_when_its_client_leaves(served: tuple[str, str]) -> None:
    # Its ``finally`` ran only when the server shut down (an async generator's at once).
    url, key = served
    with (
        httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client,
        client.stream("GET", "/ticking") as response,
    ):
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:")) == "data: 0"
    assert TICKING_CLOSED.wait(timeout=10)


def test_an_async_generators_cleanup_runs_to_its_end_when_its_client_leaves(
    served: tuple[str, str],
) -> None:
    # Its ``finally`` was cut at its first await.
    url, key = served
    with (
        httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client,
        client.stream("GET", "/cleaning") as response,
    ):
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:")) == "data: 0"
    assert CLEANED.wait(timeout=10)


def test_an_async_generators_cleanup_runs_to_its_end_when_its_key_is_revoked() -> None:
    # The stream ended, but its generator was left open.
    store = InMemoryKeyStore()
    key = issue_key(store, "dev")
    served = build_app(threading.Event()).get_fastapi_app(settings=load_settings(), key_store=store)
    CLEANED.clear()
    with (
        running(served) as url,
        httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client,
        client.stream("GET", "/cleaning") as response,
    ):
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:")) == "data: 0"
        revoke_key(store, key)
        assert sum(1 for _ in lines) < 10_000  # ended before its generator did
        assert CLEANED.wait(timeout=10)


def test_a_cleanup_that_never_ends_is_cut_short(served: tuple[str, str]) -> None:
    url, key = served
    with (
        httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client,
        client.stream("GET", "/stuck-cleaning") as response,
    ):
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:")) == "data: 0"
    assert STUCK_CLEANUP_STARTED.wait(timeout=10)
    assert STUCK_CLEANUP_CUT_SHORT.wait(timeout=30)
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200


def test_a_sync_cleanup_that_never_ends_does_not_hold_its_response() -> None:
    # The response waited for it as long as it went on.
    store = InMemoryKeyStore()
    key = issue_key(store, "dev")
    served = build_app(threading.Event()).get_fastapi_app(settings=load_settings(), key_store=store)
    answered = threading.Event()

    class Answered:
        """Sets ``answered`` once the app is done with a request to /stuck-sync-cleaning."""

        def __init__(self, app: ASGIApp) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            await self.app(scope, receive, send)
            if scope.get("path") == "/stuck-sync-cleaning":
                answered.set()

    served.add_middleware(Answered)
    with running(served) as url:
        try:
            with (
                httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client,
                client.stream("GET", "/stuck-sync-cleaning") as response,
            ):
                lines = response.iter_lines()
                assert next(line for line in lines if line.startswith("data:")) == "data: 0"
            assert SYNC_CLEANUP_STARTED.wait(timeout=10)
            assert answered.wait(timeout=30)
            assert not SYNC_CLEANUP_RELEASED.is_set()
        finally:
            SYNC_CLEANUP_RELEASED.set()


def test_an_item_json_cannot_carry_ends_the_stream_with_the_error_item(
    served: tuple[str, str],
) -> None:
    # It was sent as `data: {"score": NaN, "max": Infinity}`, which no JSON parser reads.
    url, key = served
    response = httpx.get(f"{url}/scores", headers=bearer(key), timeout=30)
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    items = [json.loads(item, parse_constant=pytest.fail) for item in data]
    assert items == [
        {"score": 0.5},
        {
            "error": "the item holds a number JSON cannot carry (NaN or Infinity)",
            "error_type": "ValueError",
            "message": "Error in streaming generator",
        },
    ]


def test_a_generator_raising_keyboard_interrupt_ends_its_stream_and_the_server_goes_on() -> None:
    # The KeyboardInterrupt left the response and ended the server.
    store = InMemoryKeyStore()
    key = issue_key(store, "dev")
    app = build_app(threading.Event()).get_fastapi_app(settings=load_settings(), key_store=store)
    with running(app) as url, httpx.Client(base_url=url, headers=bearer(key)) as client:
        for path in ("/interrupted", "/interrupted-plain"):
            response = client.get(path)
            assert parse_sse(response.text.splitlines()).data == [
                0,
                {
                    "error": "stop",
                    "error_type": "KeyboardInterrupt",
                    "message": "Error in streaming generator",
                },
            ]
        assert client.get("/health").status_code == 200


@pytest.mark.parametrize("path", ["/base-failing", "/async-base-failing"])
def test_an_endpoint_raising_what_is_no_exception_answers_the_json_500(path: str) -> None:
    # It answered a plain-text 500 with no X-Request-Id, the traceback logged as plain text.
    store = InMemoryKeyStore()
    key = issue_key(store, "dev")
    app = build_app(threading.Event()).get_fastapi_app(settings=load_settings(), key_store=store)
    with running(app) as url, httpx.Client(base_url=url, headers=bearer(key)) as client:
        for kind in NOT_EXCEPTIONS:
            response = client.get(path, params={"kind": kind})
            assert response.status_code == 500
            assert response.json()["error"]["code"] == "INTERNAL_ERROR"
            assert SECRET not in response.text
            assert response.headers["X-Request-Id"]
        assert client.get("/health").status_code == 200


@pytest.mark.parametrize(
    ("shape", "detail"), [("dict", {"why": "teapot"}), ("list", ["short", "stout"])]
)
def test_an_http_exception_keeps_its_structured_detail(
    served: tuple[str, str], shape: str, detail: Any
) -> None:
    # It answered {"error": {"code": "HTTP_ERROR", "message": "request failed"}}.
    url, key = served
    response = httpx.get(f"{url}/teapot/{shape}", headers=bearer(key), timeout=30)
    assert response.status_code == 418
    assert response.headers["X-Teapot"] == "1"
    error = response.json()["error"]
    assert error["code"] == "HTTP_ERROR"
    assert error["detail"] == detail
    assert json.loads(error["message"]) == detail


@pytest.mark.parametrize("shape", ["secret", "secret-dict"])
def test_an_http_exception_quoting_a_secret_is_masked(served: tuple[str, str], shape: str) -> None:
    # A route's HTTPException quoting a secret of the settings sent it to the client as it
    # was: every other error masks it.
    url, key = served
    response = httpx.get(f"{url}/teapot/{shape}", headers=bearer(key), timeout=30)
    assert response.status_code == 418
    assert SECRET not in response.text
    error = response.json()["error"]
    assert "upstream refused key ***" in error["message"]
    if shape == "secret-dict":
        assert error["detail"] == {"why": "upstream refused key ***", "key": "***"}


def test_a_request_handler_reading_a_body_that_is_not_json_answers_422(
    served: tuple[str, str],
) -> None:
    # It answered 500 INTERNAL_ERROR (a JSONDecodeError from `await request.json()`).
    url, key = served
    headers = {**bearer(key), "Content-Type": "application/json"}
    response = httpx.post(f"{url}/raw", content=b'{"name": ', headers=headers, timeout=30)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "body"
    assert error["message"].startswith("the body is not valid JSON: Expecting value at line 1")
    # A JSON body is read as before; one of another type, read as bytes, is not refused.
    response = httpx.post(f"{url}/raw", json={"name": "x"}, headers=bearer(key), timeout=30)
    assert response.json() == {"got": {"name": "x"}}
    text = {**bearer(key), "Content-Type": "text/plain"}
    response = httpx.post(f"{url}/raw-bytes", content=b"not json", headers=text, timeout=30)
    assert response.json() == {"length": 8}


def test_openapi_documents_a_streamed_endpoint_as_an_event_stream(
    served: tuple[str, str],
) -> None:
    # It documented application/json, which clients generated from the document expect.
    url, key = served
    document = httpx.get(f"{url}/openapi.json", headers=bearer(key), timeout=30).json()
    streamed = document["paths"]["/ticking"]["get"]["responses"]["200"]["content"]
    assert list(streamed) == ["text/event-stream"]
    plain = document["paths"]["/raw"]["post"]["responses"]["200"]["content"]
    assert list(plain) == ["application/json"]
