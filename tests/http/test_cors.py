"""CORS: a browser page of an allowed origin calls the API (preflight, headers it may read,
errors it can see); any other origin, and every origin by default, gets no CORS headers."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from agentscope_serverless.agents.demo import app as demo_app
from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.http import create_app
from agentscope_serverless.http.auth import CurrentCaller
from agentscope_serverless.settings import load_settings
from tests.support.http import Keys, bearer, running

PAGE = "https://app.example.com"


def preflight(url: str, origin: str) -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, idempotency-key",
    }
    return httpx.options(f"{url}/process", headers=headers)


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys.make()


@pytest.fixture(scope="module")
def allowed(keys: Keys) -> Iterator[str]:
    settings = load_settings(cors_allow_origins=f"{PAGE}, http://localhost:5173")
    with running(create_app(settings=settings, agent_app=demo_app, key_store=keys.store)) as url:
        yield url


def test_a_page_of_an_allowed_origin_calls_the_api(allowed: str, keys: Keys) -> None:
    answer = preflight(allowed, PAGE)
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == PAGE
    assert "idempotency-key" in answer.headers["access-control-allow-headers"].lower()
    body = {"input": [{"role": "user", "content": "hello"}], "stream": False}
    reply = httpx.post(
        f"{allowed}/process", json=body, headers={**bearer(keys.alice), "Origin": PAGE}
    )
    assert reply.status_code == 200
    assert reply.headers["access-control-allow-origin"] == PAGE
    exposed = reply.headers["access-control-expose-headers"].lower()
    assert {"x-run-id", "x-session-id", "x-request-id"} <= set(exposed.replace(" ", "").split(","))
    assert "access-control-allow-credentials" not in reply.headers  # bearer keys, no cookies


def test_a_preflight_is_cached_as_long_as_its_max_age_says_and_a_refused_one_not(
    allowed: str,
) -> None:
    # Preflights had no Cache-Control, where every other answer has one.
    answer = preflight(allowed, PAGE)
    assert answer.headers["access-control-max-age"] == "600"
    assert answer.headers["cache-control"] == "private, max-age=600"
    refused = preflight(allowed, "https://evil.example.com")
    assert refused.status_code == 400
    assert refused.headers["cache-control"] == "no-store"
    assert "access-control-max-age" not in refused.headers


def test_a_preflight_carries_a_request_id_and_is_logged(
    allowed: str, capfd: pytest.CaptureFixture[str], info_logs: None
) -> None:
    # Answered before the request context, preflights had no X-Request-Id and no log line.
    capfd.readouterr()
    answer = httpx.options(
        f"{allowed}/process",
        headers={"Origin": PAGE, "Access-Control-Request-Method": "POST", "X-Request-Id": "pf-1"},
    )
    refused = preflight(allowed, "https://evil.example.com")
    assert (answer.status_code, refused.status_code) == (200, 400)
    assert answer.headers["x-request-id"] == "pf-1"
    assert refused.headers["x-request-id"]
    assert refused.headers["cache-control"] == "no-store"  # its own, not doubled
    # A request's line is written once its answer is sent: it may come a moment after.
    logged: list[tuple[str, str, int, str | None]] = []
    deadline = time.monotonic() + 10
    while len(logged) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
        lines = [json.loads(line) for line in capfd.readouterr().out.splitlines() if line]
        logged += [
            (line["request_id"], line["method"], line["status"], line.get("code"))
            for line in lines
            if line["message"] == "request"
        ]
    assert logged == [
        ("pf-1", "OPTIONS", 200, None),
        (refused.headers["x-request-id"], "OPTIONS", 400, "BAD_REQUEST"),
    ]


def test_a_preflight_allows_the_methods_the_routes_take_and_no_other() -> None:
    # It allowed PUT and PATCH, which no route took.
    settings = load_settings(cors_allow_origins=PAGE)
    # Stores of their own: an application stops its key store as it stops.
    app = create_app(settings=settings, agent_app=demo_app, key_store=Keys.make().store)
    asked = {"Origin": PAGE, "Access-Control-Request-Method": "PATCH"}
    with running(app) as url:
        answer = preflight(url, PAGE)
        assert answer.headers["access-control-allow-methods"] == "DELETE, GET, HEAD, POST"
        assert httpx.options(f"{url}/sessions", headers=asked).status_code == 400

    async def rename(caller: CurrentCaller) -> dict[str, str]:
        return {"renamed": caller.user_id()}

    app = create_app(settings=settings, agent_app=demo_app, key_store=Keys.make().store)
    app.add_api_route("/names", rename, methods=["PATCH"])
    with running(app) as url:
        answer = httpx.options(f"{url}/names", headers=asked)
        assert answer.status_code == 200
        assert answer.headers["access-control-allow-methods"] == "DELETE, GET, HEAD, PATCH, POST"


def test_a_page_reads_that_an_answer_was_replayed(allowed: str, keys: Keys) -> None:
    # Idempotent-Replayed was not exposed: the page could not tell a retry's answer was kept.
    headers = {**bearer(keys.alice), "Origin": PAGE, "Idempotency-Key": uuid.uuid4().hex}
    body = {"session_id": f"replayed-{uuid.uuid4().hex[:8]}"}
    first, again = (httpx.post(f"{allowed}/sessions", json=body, headers=headers) for _ in "12")
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.headers["idempotent-replayed"] == "true"
    exposed = again.headers["access-control-expose-headers"].lower().replace(" ", "").split(",")
    assert "idempotent-replayed" in exposed


def test_an_error_reaches_the_page_and_the_key_is_still_required(allowed: str) -> None:
    # Without the CORS headers on an error, the page sees a network error instead of the 401.
    answer = httpx.get(f"{allowed}/sessions", headers={"Origin": PAGE})
    assert answer.status_code == 401
    assert answer.headers["access-control-allow-origin"] == PAGE


@pytest.mark.parametrize("path", ["/%ff", "/sessions/%c3%28", "/process?q=%ff"])
def test_a_preflight_to_a_url_not_utf8_is_refused_with_the_cors_headers(
    allowed: str, path: str
) -> None:
    # Refused before CORS saw it, the 422 had no CORS headers: the page saw a CORS failure.
    headers = {"Origin": PAGE, "Access-Control-Request-Method": "POST"}
    refused = httpx.options(f"{allowed}{path}", headers=headers)
    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "INVALID_INPUT"
    assert refused.headers["access-control-allow-origin"] == PAGE
    assert "POST" in refused.headers["access-control-allow-methods"]
    assert "access-control-max-age" not in refused.headers
    assert refused.headers["cache-control"] == "no-store"
    other = httpx.options(f"{allowed}{path}", headers={**headers, "Origin": "https://evil.example"})
    assert other.status_code == 422
    assert "access-control-allow-origin" not in other.headers


def test_another_origin_gets_no_cors_headers(allowed: str, keys: Keys) -> None:
    refused = preflight(allowed, "https://evil.example.com")
    assert refused.status_code == 400
    # It was the only answer in plain text ("Disallowed CORS origin"), not the error shape.
    assert refused.json()["error"]["code"] == "BAD_REQUEST"
    assert refused.json()["error"]["message"] == (
        "this preflight is refused: its origin is not one CORS_ALLOW_ORIGINS allows"
    )
    headers = {"Origin": PAGE, "Access-Control-Request-Method": "TRACE"}
    method = httpx.options(f"{allowed}/process", headers=headers)
    assert method.status_code == 400
    assert method.json()["error"]["message"] == (
        "this preflight is refused: its method is not one of DELETE, GET, HEAD, POST"
    )
    assert method.headers["access-control-allow-origin"] == PAGE  # the page reads why
    answer = httpx.get(
        f"{allowed}/sessions", headers={**bearer(keys.alice), "Origin": "https://evil.example.com"}
    )
    assert "access-control-allow-origin" not in answer.headers


def test_no_origin_is_allowed_by_default() -> None:
    app = create_app(settings=load_settings(), agent_app=demo_app, key_store=Keys.make().store)
    with running(app) as url:
        assert preflight(url, PAGE).status_code == 405
        answer = httpx.get(f"{url}/health", headers={"Origin": PAGE})
        assert "access-control-allow-origin" not in answer.headers


@pytest.mark.parametrize(
    "setting", ["https://App.Example.com", "https://app.example.com:443", "HTTPS://app.example.com"]
)
def test_an_origin_set_in_capitals_or_with_its_default_port_matches_what_browsers_send(
    keys: Keys, setting: str
) -> None:
    # Taken as written, it never matched: browsers send the host in lower case, no :443.
    settings = load_settings(cors_allow_origins=setting)
    app = create_app(settings=settings, agent_app=demo_app, key_store=keys.store)
    with running(app) as url:
        answer = preflight(url, PAGE)
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == PAGE


def test_a_port_other_than_the_default_is_kept() -> None:
    settings = load_settings(cors_allow_origins="http://LocalHost:5173, http://127.0.0.1:80")
    assert settings.cors_allow_origins == ("http://localhost:5173", "http://127.0.0.1")


@pytest.mark.parametrize(
    "origin", [f"{PAGE}/", f"{PAGE}/app", "app.example.com", "ftp://x", f"{PAGE}:99999"]
)
def test_what_is_no_origin_is_refused_at_start(origin: str) -> None:
    # With a trailing slash no browser's Origin would ever match: said at start, not later.
    with pytest.raises(ConfigurationError, match=r"CORS_ALLOW_ORIGINS.*is not an origin"):
        load_settings(cors_allow_origins=origin)
