"""The sandbox routes, /health and a model's sandbox tool, over real HTTP, on a sandbox
server that misbehaves (a raw socket server on loopback): one answering 200 with what is not
the sandbox protocol, one that never answers."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from agentscope_serverless.agents.llm import create_llm_app
from agentscope_serverless.http import create_app
from agentscope_serverless.settings import load_settings
from tests.http.test_llm_agent import API_KEY, messages_of
from tests.http.test_llm_sandbox_tools import ReportingLLM
from tests.sandbox.test_client_misbehaving_server import NO_DATA, NOT_JSON, hang
from tests.support.http import Keys, bearer, running, stream, user_message
from tests.support.raw_server import Answer, RawServer, raw_servers, response

TOKEN = "sbx-Token-Marmot-4411"
ROUTES = [
    ("POST", "/sandboxes/s"),
    ("GET", "/sandboxes/s"),
    ("GET", "/sandboxes/s/tools"),
    ("POST", "/sandboxes/s/tools/run_shell_command"),
    ("DELETE", "/sandboxes/s"),
]


@pytest.fixture
def serve() -> Iterator[Callable[[Answer], RawServer]]:
    with raw_servers() as start:
        yield start


@contextlib.contextmanager
def sandbox_routes_over(
    server: RawServer, keys: Keys
) -> Iterator[tuple[str, list[httpx.Response]]]:
    """The sandbox routes served on the sandbox server ``server``: their URL, and the answer
    of each of :data:`ROUTES`."""
    settings = load_settings(sandbox_base_url=server.url, sandbox_bearer_token=TOKEN)
    with (
        running(create_app(["sandbox"], settings=settings, key_store=keys.store)) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client,
    ):
        body = {"command": "echo hi"}
        yield (
            url,
            [
                client.request(method, path, json=body if "tools/" in path else None)
                for method, path in ROUTES
            ],
        )


@pytest.mark.parametrize("answer", [NOT_JSON, NO_DATA], ids=["not-json", "no-data"])
def test_a_sandbox_server_answering_200_not_in_the_protocol_gets_503_and_health_says_so(
    serve: Callable[[Answer], RawServer], keys: Keys, answer: Answer
) -> None:
    with sandbox_routes_over(serve(answer), keys) as (url, answers):
        for route, response in zip(ROUTES, answers, strict=True):
            assert response.status_code == 503, (route, response.text)
            error = response.json()["error"]
            assert error["code"] == "SANDBOX_UNAVAILABLE"
            assert "the sandbox server answered something unreadable" in error["message"]
            for quoted in ("oops", "hello", "nope", TOKEN):
                assert quoted not in response.text
        health = httpx.get(f"{url}/health", timeout=30)
    assert health.status_code == 503
    assert health.json()["services"]["sandbox"] is False


def test_a_hung_sandbox_server_gets_503_within_the_time_limit_retries_included(
    serve: Callable[[Answer], RawServer], keys: Keys
) -> None:
    server = serve(hang)
    settings = load_settings(
        sandbox_base_url=server.url, sandbox_bearer_token=TOKEN, sandbox_timeout_seconds=1
    )
    with running(create_app(["sandbox"], settings=settings, key_store=keys.store)) as url:
        started = time.monotonic()
        response = httpx.get(f"{url}/sandboxes/s", headers=bearer(keys.alice), timeout=60)
        took = time.monotonic() - started
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "SANDBOX_UNAVAILABLE"
    assert "did not answer in time" in response.json()["error"]["message"]
    # Three attempts, as the idempotent mapping once got, would take 3 s at least.
    assert took < 2.5
    assert server.requests == 1


def test_a_sandbox_server_out_of_resources_has_its_retry_after_passed_on(
    serve: Callable[[Answer], RawServer], keys: Keys
) -> None:
    # The API answered 503 without it: clients retried at once, or not at all.
    detail = b'{"detail": "the sandbox server is out of resources", "code": "SANDBOX_UNAVAILABLE"}'
    server = serve(
        lambda connection, head: connection.sendall(
            response("503 Service Unavailable", detail, "Retry-After: 7")
        )
    )
    with sandbox_routes_over(server, keys) as (_, answers):
        for route, answer in zip(ROUTES, answers, strict=True):
            assert answer.status_code == 503, (route, answer.text)
            assert answer.json()["error"]["code"] == "SANDBOX_UNAVAILABLE"
            assert answer.headers["Retry-After"] == "7", route


def test_the_model_reads_a_sandbox_answer_not_in_the_protocol_as_a_tool_error(
    serve: Callable[[Answer], RawServer], keys: Keys
) -> None:
    server = serve(NOT_JSON)
    llm = ReportingLLM()
    settings = load_settings(sandbox_base_url=server.url, sandbox_bearer_token=TOKEN)
    with running(llm.app) as llm_url:
        agent_settings = load_settings(
            llm_base_url=f"{llm_url}/v1", llm_api_key=API_KEY, llm_model="scripted"
        )
        app = create_llm_app(sandbox_tools=["run_ipython_cell"], settings=agent_settings)
        with (
            running(create_app(settings=settings, agent_app=app, key_store=keys.store)) as url,
            httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=60) as client,
        ):
            body = {"input": [user_message("What is 6 times 7?")], "session_id": "maths"}
            response, sse = stream(client, "/process", json=body)
    assert response.status_code == 200
    _, output, answer = messages_of(sse.data)
    said = output["content"][0]["data"]["output"]
    assert said.startswith("error: get_session_mapping failed: the sandbox server answered ")
    assert "unreadable (26 bytes of text/html, not JSON)" in said
    assert "oops" not in json.dumps(sse.data)
    assert answer["content"][0]["text"].startswith("The sandbox says error:")
