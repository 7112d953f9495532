"""The events AWS sends a buffered function, and hostile ones, answered as HTTP should be.

Mangum decodes the body and encodes the headers, path and query string before the
application sees them; a failure there was an invocation error, which a Function URL caller
gets as a 502 without a body. Events of API Gateway (REST and HTTP APIs) and of an ALB are
answered in their own shapes, a response larger than Lambda returns is made to fit, and an
event that is no HTTP request is refused without an invocation error. The handler is the one
``functions/sessions/agentscope_handler.py`` builds.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from agentscope_serverless.auth.file import FileKeyStore
from agentscope_serverless.http.lambda_handler import (
    ALB_RESPONSE_LIMIT_BYTES,
    RESPONSE_LIMIT_BYTES,
    LambdaHandler,
    build_web_adapter_app,
    make_handler,
)
from agentscope_serverless.log import logger
from agentscope_serverless.services.runs.base import RunRecord
from tests.support.http import issue_key
from tests.support.lambda_runtime import function_url_event


@pytest.fixture(scope="module")
def sessions_handler(tmp_path_factory: pytest.TempPathFactory) -> tuple[LambdaHandler, str]:
    keys_file = tmp_path_factory.mktemp("keys") / "keys.json"
    key = issue_key(FileKeyStore(keys_file), "event-user")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AUTH_KEYS_BACKEND", "file")
        env.setenv("AUTH_KEYS_FILE", str(keys_file))
        env.setenv("SESSION_HISTORY_BACKEND", "in_memory")
        handler = make_handler(["sessions", "runs"])
        handler(function_url_event("GET", "/health"), None)  # builds the app with these settings
    return handler, key


def _event(key: str, body: str, *, base64: bool) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    event = function_url_event("POST", "/sessions", headers=headers, body=body)
    event["isBase64Encoded"] = base64
    return event


def _error(response: dict[str, Any]) -> dict[str, Any]:
    assert response["statusCode"] == 400, response
    assert response["headers"]["content-type"] == "application/json"
    assert response["headers"]["x-request-id"]
    assert response["headers"]["cache-control"] == "no-store"
    error: dict[str, Any] = json.loads(response["body"])["error"]
    assert error["code"] == "BAD_REQUEST"
    return error


def test_a_body_marked_base64_that_is_not_base64_gets_400(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    handler, key = sessions_handler
    error = _error(handler(_event(key, "!!not base64", base64=True), None))
    assert "base64" in error["message"]


def _sessions(handler: LambdaHandler, key: str) -> list[str]:
    listing = function_url_event("GET", "/sessions", headers={"authorization": f"Bearer {key}"})
    response = handler(listing, None)
    assert response["statusCode"] == 200, response
    page = json.loads(response["body"])
    assert page["next_cursor"] is None, page
    return [session["id"] for session in page["items"]]


@pytest.mark.parametrize("body", ["@@@@", "e30=!!!", "e30=\n", "!e30=", "e3é0="])
def test_a_body_marked_base64_with_characters_outside_base64_is_refused_not_read(
    sessions_handler: tuple[LambdaHandler, str], body: str
) -> None:
    # What is not base64 was dropped before decoding: "@@@@" was an empty body (a 422 for a
    # missing field), "e30=!!!" the JSON {} (a session created).
    handler, key = sessions_handler
    before = _sessions(handler, key)
    error = _error(handler(_event(key, body, base64=True), None))
    assert error["message"] == "the request body is not valid base64 (isBase64Encoded is true)"
    assert _sessions(handler, key) == before


def test_a_body_in_base64_is_read(sessions_handler: tuple[LambdaHandler, str]) -> None:
    handler, key = sessions_handler
    body = base64.b64encode(json.dumps({"session_id": "sent-in-base64"}).encode()).decode()
    response = handler(_event(key, body, base64=True), None)
    assert response["statusCode"] == 201, response
    assert json.loads(response["body"])["id"] == "sent-in-base64"


def test_a_body_that_is_not_unicode_gets_400(sessions_handler: tuple[LambdaHandler, str]) -> None:
    handler, key = sessions_handler
    error = _error(handler(_event(key, '{"session_id": "\ud800"}', base64=False), None))
    assert "Unicode" in error["message"]


def test_a_header_or_query_that_is_not_unicode_gets_400(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    handler, key = sessions_handler
    header = _event(key, "{}", base64=False)
    header["headers"]["x-session-id"] = "s\udcff"
    query = function_url_event(
        "GET", "/sessions", headers={"authorization": f"Bearer {key}"}, query="limit=\udcff"
    )
    for event in (header, query):
        assert "Unicode" in _error(handler(event, None))["message"]


def test_an_event_with_null_headers_gets_400(sessions_handler: tuple[LambdaHandler, str]) -> None:
    handler, key = sessions_handler
    event = _event(key, "{}", base64=False)
    event["headers"] = None
    _error(handler(event, None))


def test_a_rest_api_event_that_does_not_decode_gets_400(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    handler, key = sessions_handler
    event = {
        "resource": "/{proxy+}",
        "path": "/sessions",
        "httpMethod": "POST",
        "headers": {"Authorization": f"Bearer {key}"},
        "multiValueHeaders": None,
        "queryStringParameters": None,
        "requestContext": {"identity": {"sourceIp": "203.0.113.1"}},
        "body": "abcde",
        "isBase64Encoded": True,
    }
    _error(handler(event, None))


def test_a_decodable_event_is_still_served(sessions_handler: tuple[LambdaHandler, str]) -> None:
    handler, key = sessions_handler
    body = json.dumps({"session_id": "after-bad-events"})
    response = handler(_event(key, body, base64=False), None)
    assert response["statusCode"] == 201, response
    assert json.loads(response["body"])["id"] == "after-bad-events"


def test_a_functions_answers_are_not_to_be_stored_by_a_cache(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    # A user's sessions were answered with no Cache-Control: a cache could keep them.
    handler, key = sessions_handler
    for authorization in ({"authorization": f"Bearer {key}"}, {}):
        answer = handler(function_url_event("GET", "/sessions", headers=authorization), None)
        assert answer["statusCode"] == (200 if authorization else 401)
        assert answer["headers"]["cache-control"] == "no-store"


def test_a_user_named_twice_behind_a_function_url_is_refused(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    handler, key = sessions_handler
    # Two X-User-Id headers reach the function joined by a comma.
    headers = {"authorization": f"Bearer {key}", "x-user-id": "event-user,event-user"}
    response = handler(function_url_event("GET", "/sessions", headers=headers), None)
    assert response["statusCode"] == 422, response
    assert "joined" in json.loads(response["body"])["error"]["message"]
    headers["x-user-id"] = "event-user"
    assert (
        handler(function_url_event("GET", "/sessions", headers=headers), None)["statusCode"] == 200
    )


def test_a_key_sent_twice_behind_a_function_url_is_said_to_be_so(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    handler, key = sessions_handler
    # Two Authorization headers reach the function joined by a comma: the key was said not
    # to be of the form ask_<id>_<secret>, as if it had been pasted wrong.
    for joined in (f"Bearer {key},Bearer {key}", f"Bearer {key}, Bearer ask_x_y"):
        event = function_url_event("GET", "/sessions", headers={"authorization": joined})
        response = handler(event, None)
        assert response["statusCode"] == 401, response
        error = json.loads(response["body"])["error"]
        assert error["message"] == (
            "the Authorization header is given more than once (several arrive joined by ',')"
        )


class LambdaContext:
    """The part of Lambda's context object the handler reads: the time left, and the
    invocation's id."""

    def __init__(self, seconds: float, request_id: str = "invocation-1") -> None:
        self.deadline = time.monotonic() + seconds
        self.aws_request_id = request_id

    def get_remaining_time_in_millis(self) -> int:
        return int((self.deadline - time.monotonic()) * 1000)


@pytest.mark.parametrize(
    "event",
    [
        {},
        None,
        [],
        "hello",
        {"Records": [{"eventSource": "aws:sqs", "body": "{}"}]},
        {"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}},
        {"resource": "/{proxy+}", "path": "/sessions", "httpMethod": "GET"},
    ],
)
def test_an_event_that_is_no_http_request_is_refused_without_an_invocation_error(
    sessions_handler: tuple[LambdaHandler, str], event: Any
) -> None:
    handler, _ = sessions_handler
    answer = handler(event, None)  # raising would make Lambda retry, and show a stack trace
    assert answer["error"]["code"] == "UNSUPPORTED_EVENT"
    assert "HTTP requests" in answer["error"]["message"]


def test_a_path_or_alb_query_that_is_not_utf8_gets_422_naming_it(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    handler, key = sessions_handler
    auth = {"authorization": f"Bearer {key}"}
    answers = []
    for byte in ("FE", "FF"):  # one session to the application, were they decoded as U+FFFD
        event = function_url_event("GET", f"/sessions/%{byte}", headers=auth)
        event["requestContext"]["http"]["path"] = f"/sessions/%{byte}"
        answers.append(handler(event, None))
    alb = _alb_event("GET", "/sessions", {"authorization": [f"Bearer {key}"]})
    alb["multiValueQueryStringParameters"] = {"user_id": ["%FF"]}
    answers.append(handler(alb, None))
    for answer in answers:
        assert answer["statusCode"] == 422, answer
        assert "not UTF-8" in json.loads(answer["body"])["error"]["message"]


def _rest_event(key: str, **overrides: Any) -> dict[str, Any]:
    """An API Gateway REST API (payload 1.0) request event."""
    event: dict[str, Any] = {
        "resource": "/{proxy+}",
        "path": "/sessions",
        "httpMethod": "GET",
        "headers": {"Authorization": f"Bearer {key}", "Host": "abc.execute-api.aws"},
        "multiValueHeaders": {
            "Authorization": [f"Bearer {key}"],
            "Host": ["abc.execute-api.aws"],
        },
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "requestContext": {"identity": {"sourceIp": "203.0.113.1"}, "stage": "prod"},
        "body": None,
        "isBase64Encoded": False,
    }
    event.update(overrides)
    return event


def _alb_event(method: str, path: str, headers: dict[str, list[str]]) -> dict[str, Any]:
    """An ALB request event with multi-value headers turned on."""
    return {
        "requestContext": {"elb": {"targetGroupArn": "arn:aws:elasticloadbalancing:tg"}},
        "httpMethod": method,
        "path": path,
        "multiValueQueryStringParameters": {},
        "multiValueHeaders": {"host": ["alb.example.com"], **headers},
        "body": "",
        "isBase64Encoded": False,
    }


def test_a_rest_api_event_is_answered_and_its_repeated_values_refused(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    handler, key = sessions_handler
    listed = handler(_rest_event(key), None)
    assert listed["statusCode"] == 200, listed
    assert "items" in json.loads(listed["body"])
    # API Gateway joins a repeated header's values: no key is "k, Bearer k".
    two_keys = _rest_event(key, multiValueHeaders={"Authorization": [f"Bearer {key}"] * 2})
    assert handler(two_keys, None)["statusCode"] == 401
    two_users = _rest_event(key, multiValueQueryStringParameters={"user_id": ["a", "b"]})
    answer = handler(two_users, None)
    assert answer["statusCode"] == 422
    assert "more than once" in json.loads(answer["body"])["error"]["message"]


def test_a_header_given_in_two_spellings_is_given_more_than_once(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    """An API Gateway event lists headers by the names the client spelt: ``X-User-Id`` and
    ``x-user-id`` were one header to the function, the last spelling acting (a request
    naming two users served as one of them), where two headers are refused: 422 naming
    two users, 401 with two keys, as an ALB event's are."""
    handler, key = sessions_handler
    bearer = f"Bearer {key}"
    spelt_twice = {
        "X-User-Id": {
            "Authorization": [bearer],
            "X-User-Id": ["someone"],
            "x-user-id": ["event-user"],
        },
        "Authorization": {"Authorization": ["Bearer ask_x_y"], "authorization": [bearer]},
    }
    for name, sent in spelt_twice.items():
        last = {header: values[-1] for header, values in sent.items()}
        rest = _rest_event(key, headers=last, multiValueHeaders=sent)
        http_v1 = _http_api_v1_event(key, "/sessions", "$default", _API)
        http_v1.update(headers=last, multiValueHeaders=sent)
        function_url = function_url_event("GET", "/sessions")
        function_url["headers"].update(last)
        alb = _alb_event("GET", "/sessions", sent)
        for kind, event in [
            ("REST", rest),
            ("HTTP API 1.0", http_v1),
            ("Function URL", function_url),
            ("ALB", alb),
        ]:
            answer = handler(event, None)
            expected = 422 if name == "X-User-Id" else 401
            assert answer["statusCode"] == expected, (name, kind, answer)
            error = json.loads(answer["body"])["error"]
            assert name in error["message"], (name, kind, error)


def _http_api_event(key: str, path: str, stage: str, domain: str) -> dict[str, Any]:
    """An API Gateway HTTP API (payload 2.0) request to ``path`` (as the client sent it) of
    the stage ``stage``, reached at ``domain``."""
    event = function_url_event("GET", path, headers={"authorization": f"Bearer {key}"})
    event["headers"]["host"] = domain
    event["routeKey"] = "ANY /{proxy+}"
    event["requestContext"].update(
        apiId="abc123", domainName=domain, routeKey="ANY /{proxy+}", stage=stage
    )
    return event


def test_an_http_api_event_of_a_named_stage_is_routed_without_the_stage(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    handler, key = sessions_handler
    api = "abc123.execute-api.us-east-1.amazonaws.com"
    # At the API's own endpoint the stage leads the path; at a custom domain it does not.
    for path, domain in [("/prod/sessions", api), ("/sessions", "api.example.com")]:
        answer = handler(_http_api_event(key, path, "prod", domain), None)
        assert answer["statusCode"] == 200, (path, answer)
        assert "items" in json.loads(answer["body"])
    # A path that only begins like the stage's name is not in the stage.
    answer = handler(_http_api_event(key, "/production/sessions", "prod", api), None)
    assert answer["statusCode"] == 404, answer


def _http_api_v1_event(
    key: str, path: str, stage: str, domain: str, *, proxy: str | None = None
) -> dict[str, Any]:
    """An API Gateway HTTP API request in payload format 1.0 to ``path`` (as the client
    sent it) of the stage ``stage``, reached at ``domain``: by the ``$default`` route, or
    with ``proxy`` the path parameter of ``ANY /{proxy+}``."""
    headers = {"Authorization": f"Bearer {key}", "Host": domain}
    resource = "$default" if proxy is None else "/{proxy+}"
    return {
        "version": "1.0",
        "resource": resource,
        "path": path,
        "httpMethod": "GET",
        "headers": headers,
        "multiValueHeaders": {name: [value] for name, value in headers.items()},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": None if proxy is None else {"proxy": proxy},
        "requestContext": {
            "apiId": "abc123",
            "domainName": domain,
            "httpMethod": "GET",
            "identity": {"sourceIp": "203.0.113.1"},
            "path": path,
            "resourcePath": resource,
            "routeKey": "$default" if proxy is None else "ANY /{proxy+}",
            "stage": stage,
        },
        "body": None,
        "isBase64Encoded": False,
    }


def test_an_http_api_payload_1_event_of_a_named_stage_is_routed_without_the_stage(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    """Payload format 1.0's ``path`` holds the stage at the API's own endpoint, as 2.0's
    ``rawPath`` does: behind the ``$default`` route it was routed with it (a 404)."""
    handler, key = sessions_handler
    for path, domain, proxy in [
        ("/prod/sessions", _API, None),
        ("/prod/sessions", _API, "sessions"),
        ("/sessions", "api.example.com", None),
        ("/agent/sessions", "api.example.com", "sessions"),  # a custom domain's base path
    ]:
        answer = handler(_http_api_v1_event(key, path, "prod", domain, proxy=proxy), None)
        assert answer["statusCode"] == 200, (path, domain, proxy, answer)
        assert "items" in json.loads(answer["body"])
    docs = handler(_http_api_v1_event(key, "/prod/docs", "prod", _API), None)
    assert docs["statusCode"] == 200, docs
    assert 'url: "/prod/openapi.json"' in docs["body"]
    at_default = handler(_http_api_v1_event(key, "/sessions", "$default", _API), None)
    assert at_default["statusCode"] == 200, at_default
    # A path that only begins like the stage's name is not in the stage.
    other = handler(_http_api_v1_event(key, "/production/sessions", "prod", _API), None)
    assert other["statusCode"] == 404, other


def test_an_invalid_openai_request_behind_an_api_gateway_stage_is_a_400(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As everywhere else (OpenAI's SDKs raise BadRequestError for it): behind a stage, the
    OpenAI-compatible routes' path is the one after the stage."""
    keys_file = tmp_path / "keys.json"
    key = issue_key(FileKeyStore(keys_file), "event-user")
    monkeypatch.setenv("AUTH_KEYS_BACKEND", "file")
    monkeypatch.setenv("AUTH_KEYS_FILE", str(keys_file))
    handler = make_handler(["process"])
    api = "abc123.execute-api.us-east-1.amazonaws.com"
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    for path, stage in [("/prod/compatible-mode/v1/chat/completions", "prod"), ("/process", "")]:
        event = function_url_event("POST", path, headers=headers, body='{"model": "m"}')
        event["headers"]["host"] = api
        event["routeKey"] = "ANY /{proxy+}"
        event["requestContext"].update(domainName=api, routeKey="ANY /{proxy+}")
        if stage:
            event["requestContext"]["stage"] = stage
        answer = handler(event, None)
        expected = 400 if stage else 422
        assert answer["statusCode"] == expected, answer
        assert json.loads(answer["body"])["error"]["type"] == "invalid_request_error"


def test_the_urls_an_api_gateway_stage_serves_keep_its_stage(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    """The docs page names its OpenAPI document by the URL it was served at: behind a stage
    of a REST or an HTTP API, under the stage's path (API Gateway has nothing elsewhere)."""
    handler, key = sessions_handler
    api = "abc123.execute-api.us-east-1.amazonaws.com"
    context = {"identity": {"sourceIp": "203.0.113.1"}, "stage": "prod", "path": "/prod/docs"}
    events = [
        _rest_event(key, path="/docs", requestContext=context),
        _http_api_event(key, "/prod/docs", "prod", api),
    ]
    for event in events:
        answer = handler(event, None)
        assert answer["statusCode"] == 200, answer
        assert 'url: "/prod/openapi.json"' in answer["body"]
    listed = _rest_event(key, requestContext={**context, "path": "/prod/sessions"})
    assert handler(listed, None)["statusCode"] == 200


def test_a_rest_api_behind_a_custom_domains_base_path_serves_its_routes(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    """A custom domain mapping a base path to a REST API's stage gives the function the
    path with the base path before the route (``/agent/sessions``): every route was a 404.
    The base path is the part before what the API's route matched, and the URLs the
    application gives keep it."""
    handler, key = sessions_handler
    for base in ("/agent", "/v1/agent"):
        context = {
            "identity": {"sourceIp": "203.0.113.1"},
            "stage": "prod",
            "domainName": "api.example.com",
            "resourcePath": "/{proxy+}",
        }

        def event(route: str, base: str = base, context: dict[str, Any] = context) -> Any:
            return _rest_event(
                key,
                path=base + route,
                pathParameters={"proxy": route.lstrip("/")},
                requestContext={**context, "path": base + route},
            )

        listed = handler(event("/sessions"), None)
        assert listed["statusCode"] == 200, (base, listed)
        assert "items" in json.loads(listed["body"])
        docs = handler(event("/docs"), None)
        assert docs["statusCode"] == 200, docs
        assert f'url: "{base}/openapi.json"' in docs["body"]
        assert handler(event("/nothing-here"), None)["statusCode"] == 404


_API = "abc123.execute-api.us-east-1.amazonaws.com"


def _base_path_event(key: str, base: str, route: str, **overrides: Any) -> dict[str, Any]:
    """A REST API request to ``route`` through a custom domain mapping ``base`` to it."""
    context = {
        "identity": {"sourceIp": "203.0.113.1"},
        "stage": "prod",
        "domainName": "api.example.com",
        "resourcePath": "/{proxy+}",
        "path": base + route,
    }
    return _rest_event(
        key,
        path=base + route,
        pathParameters={"proxy": route.lstrip("/")} if route else None,
        requestContext=context,
        **overrides,
    )


@pytest.fixture
def process_handler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., tuple[LambdaHandler, str]]:
    """A handler serving ``routers`` with the settings ``env`` adds, and a key for it."""

    def build(routers: list[str], **env: str) -> tuple[LambdaHandler, str]:
        keys_file = tmp_path / "keys.json"
        key = issue_key(FileKeyStore(keys_file), "event-user")
        monkeypatch.setenv("AUTH_KEYS_BACKEND", "file")
        monkeypatch.setenv("AUTH_KEYS_FILE", str(keys_file))
        monkeypatch.setenv("SESSION_HISTORY_BACKEND", "in_memory")
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return make_handler(routers), key

    return build


def _json_rpc_call(call_id: int | None, text: str, task_id: str | None = None) -> str:
    message: dict[str, Any] = {
        "messageId": f"m-{text}",
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    }
    if task_id is not None:
        message["taskId"] = task_id
    call: dict[str, Any] = {
        "jsonrpc": "2.0",
        "method": "SendMessage",
        "params": {"message": message},
    }
    if call_id is not None:
        call["id"] = call_id
    return json.dumps(call)


def test_a2a_json_rpc_behind_a_stage_or_a_base_path_is_answered_as_at_the_root(
    process_handler: Callable[..., tuple[LambdaHandler, str]],
) -> None:
    """``POST /prod/a2a`` (an HTTP API's stage) and ``/agent/a2a`` (a custom domain's base
    path) are the JSON-RPC route, checked as ``/a2a`` is: the route was told by the URL's
    path, so under a root path a notification ran a task, a retry with its
    ``Idempotency-Key`` and a new id (as the SDK's client sends) was a 409, a number JSON
    cannot carry an HTTP 422, and a call answered with a JSON-RPC error kept its key."""
    handler, key = process_handler(["process"])
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    headers["a2a-version"] = "1.0"

    def at_stage(body: str, sent: dict[str, str]) -> dict[str, Any]:
        event = _http_api_event(key, "/prod/a2a", "prod", _API)
        event["requestContext"]["http"]["method"] = "POST"
        event["headers"] = {**event["headers"], **headers, **sent}
        event["body"] = body
        return event

    def at_base_path(body: str, sent: dict[str, str]) -> dict[str, Any]:
        all_headers = {**headers, **sent, "host": "api.example.com"}
        return _base_path_event(
            key,
            "/agent",
            "/a2a",
            httpMethod="POST",
            headers=all_headers,
            multiValueHeaders={name: [value] for name, value in all_headers.items()},
            body=body,
        )

    for tag, event in [("stage", at_stage), ("base", at_base_path)]:
        notified = handler(event(_json_rpc_call(None, f"note-{tag}"), {}), None)
        assert json.loads(notified["body"])["error"]["code"] == -32600, (tag, notified)

        idempotency = {"idempotency-key": f"key-{tag}"}
        first = handler(event(_json_rpc_call(1, f"retry-{tag}"), idempotency), None)
        retried = handler(event(_json_rpc_call(2, f"retry-{tag}"), idempotency), None)
        assert retried["statusCode"] == 200, (tag, retried)
        replayed = json.loads(retried["body"])
        assert replayed["id"] == 2, (tag, replayed)
        assert replayed["result"] == json.loads(first["body"])["result"]

        unencodable = '{"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": {"x": 1e999}}'
        refused = handler(event(unencodable, {}), None)
        assert refused["statusCode"] == 200, (tag, refused)
        assert json.loads(refused["body"])["id"] == 7

        failing = {"idempotency-key": f"fails-{tag}"}
        call = _json_rpc_call(3, f"fails-{tag}", task_id=f"no-such-task-{tag}")
        failed = handler(event(call, failing), None)
        assert "error" in json.loads(failed["body"]), (tag, failed)
        again = handler(event(call, failing), None)
        assert "idempotent-replayed" not in (again.get("headers") or {}), (tag, again)
        assert "idempotent-replayed" not in (again.get("multiValueHeaders") or {}), (tag, again)


def test_the_keyed_openapi_document_behind_a_stage_names_the_stage_as_its_server(
    process_handler: Callable[..., tuple[LambdaHandler, str]],
) -> None:
    """With ``DOCS_REQUIRE_KEY=true`` the OpenAPI document behind ``/prod`` names ``/prod``
    as its server, as the open one does: without it, the docs page's "Try it out" sent its
    requests outside the stage. At the root it names none (what it keeps is not changed)."""
    handler, key = process_handler(["sessions"], DOCS_REQUIRE_KEY="true")
    for _ in range(2):
        staged = handler(_http_api_event(key, "/prod/openapi.json", "prod", _API), None)
        assert staged["statusCode"] == 200, staged
        assert json.loads(staged["body"])["servers"] == [{"url": "/prod"}]
        at_root = handler(_http_api_event(key, "/openapi.json", "$default", _API), None)
        assert at_root["statusCode"] == 200, at_root
        assert "servers" not in json.loads(at_root["body"])
    based = handler(_base_path_event(key, "/agent", "/openapi.json"), None)
    assert json.loads(based["body"])["servers"] == [{"url": "/agent"}]


def test_the_chat_page_behind_a_stage_is_reached_at_the_stages_url(
    process_handler: Callable[..., tuple[LambdaHandler, str]],
) -> None:
    """The stage's invoke URL as AWS prints it (``.../prod``, no trailing slash) redirects
    to the chat page at ``/prod/`` (its assets are relative to it): it was a 404. The
    redirect is built from the root path, never from the ``Host`` the client sent."""
    handler, key = process_handler(["sessions"], WEB_UI="true")
    event = _http_api_event(key, "/prod", "prod", _API)
    event["headers"]["host"] = "evil.example"
    bare = handler(event, None)
    assert bare["statusCode"] == 307, bare
    assert bare["headers"]["location"] == "/prod/"
    page = handler(_http_api_event(key, "/prod/", "prod", _API), None)
    assert page["statusCode"] == 200, page
    assert "<html" in page["body"]
    # A REST API's stage: its invoke URL gives the path "/" and the requested path "/prod"
    # (the page was served there, its assets resolving outside the stage); "/prod/" is
    # the page.
    context = {"identity": {"sourceIp": "203.0.113.1"}, "stage": "prod", "path": "/prod"}
    rest = handler(_rest_event(key, path="/", resource="/", requestContext=context), None)
    assert rest["statusCode"] == 307, rest
    assert rest["headers"]["location"] == "/prod/"
    context["path"] = "/prod/"
    rest_page = handler(_rest_event(key, path="/", resource="/", requestContext=context), None)
    assert rest_page["statusCode"] == 200, rest_page
    assert 'src="web/app.js"' in rest_page["body"]
    # A REST API's root resource (``/``) reached at the custom domain's base path.
    root = _base_path_event(key, "/agent", "", resource="/")
    based = handler(root, None)
    assert based["statusCode"] == 307, based
    assert based["headers"]["location"] == "/agent/"
    # Outside any root path nothing is redirected.
    assert handler(_http_api_event(key, "/production", "prod", _API), None)["statusCode"] == 404
    assert handler(function_url_event("GET", "/"), None)["statusCode"] == 200


def test_a_404_behind_a_stage_advises_paths_in_the_stage(
    process_handler: Callable[..., tuple[LambdaHandler, str]],
) -> None:
    """Behind ``/prod`` a 404 says the routes are listed at ``/prod/docs``, and tells an
    OpenAI SDK its base URL ends ``/prod/compatible-mode/v1`` only when it is not there
    already: one at ``/prod/compatible-mode/v1`` asking for a route not served was told
    to use ``/compatible-mode/v1``."""
    handler, key = process_handler(["process"])

    def message(path: str, stage: str) -> str:
        event = _http_api_event(key, path, stage, _API)
        event["requestContext"]["http"]["method"] = "POST"
        answer = handler(event, None)
        assert answer["statusCode"] == 404, answer
        return str(json.loads(answer["body"])["error"]["message"])

    listed_at = "no route has this path (the API's routes are listed at /prod/docs)"
    assert listed_at in message("/prod/nothing", "prod")
    assert listed_at in message("/prod/compatible-mode/v1/embeddings", "prod")
    advice = message("/prod/v1/chat/completions", "prod")
    assert "base_url is http://<host>:<port>/prod/compatible-mode/v1)" in advice
    assert "listed at /docs)" in message("/nothing", "$default")


def test_a_percent_in_a_session_id_names_it_behind_a_custom_domains_base_path(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    """Session ``a%41`` (sent as ``a%2541``) through a custom domain mapping ``/agent`` to
    an HTTP or a REST API is the session the Function URL serves. API Gateway gives the
    path parameters decoded, and they were decoded a second time (``aA``): the route
    matched no longer ended the path, and such a request was a 404; so was an HTTP API's
    ``http.path`` when given decoded (session ``aA`` not found)."""
    handler, key = sessions_handler
    auth = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    body = json.dumps({"session_id": "a%41"})
    created = handler(function_url_event("POST", "/sessions", headers=auth, body=body), None)
    assert created["statusCode"] == 201, created
    direct = handler(function_url_event("GET", "/sessions/a%2541", headers=auth), None)
    assert direct["statusCode"] == 200, direct
    sent = "/agent/sessions/a%2541"
    events = []
    # An HTTP API's request context gives the path as sent or decoded; rawPath is as sent.
    for path in (sent, "/agent/sessions/a%41"):
        event = _http_api_event(key, sent, "$default", "api.example.com")
        event["requestContext"]["http"]["path"] = path
        event["pathParameters"] = {"proxy": "sessions/a%41"}
        events.append(event)
    context = {
        "identity": {"sourceIp": "203.0.113.1"},
        "stage": "prod",
        "domainName": "api.example.com",
        "resourcePath": "/{proxy+}",
        "path": sent,
    }
    rest = _rest_event(
        key, path=sent, pathParameters={"proxy": "sessions/a%41"}, requestContext=context
    )
    for event in [*events, rest]:
        answer = handler(event, None)
        assert answer["statusCode"] == 200, answer
        assert json.loads(answer["body"])["id"] == "a%41"


def test_an_alb_event_is_answered_with_multi_value_headers(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    handler, key = sessions_handler
    answer = handler(_alb_event("GET", "/sessions", {"authorization": [f"Bearer {key}"]}), None)
    assert answer["statusCode"] == 200, answer
    assert answer["multiValueHeaders"]["content-type"] == ["application/json"]
    assert "headers" not in answer  # the ALB would ignore them
    two_users = _alb_event(
        "GET", "/sessions", {"authorization": [f"Bearer {key}"], "x-user-id": ["a", "b"]}
    )
    assert handler(two_users, None)["statusCode"] == 422


DOWNLOAD_AGENT = """
from fastapi import Response
from agentscope_serverless.app import AgentApp

app = AgentApp(app_name="downloads")


@app.query(framework="text")
async def query(self, msgs, request=None, **kwargs):
    yield "hello"


@app.endpoint("/download", methods=["GET"])
async def download() -> Response:
    disposition = 'attachment; filename="caf\\u00e9.txt"'
    return Response(b"hi", media_type="text/plain", headers={"Content-Disposition": disposition})
"""


def test_a_response_header_outside_ascii_reaches_the_client_whatever_the_event(
    process_handler: Callable[..., tuple[LambdaHandler, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request_log: pytest.CaptureFixture[str],
) -> None:
    """Starlette sends a header's value in Latin-1, as HTTP has it (a download named
    ``café.txt``), and a server serves it so: read as UTF-8, it turned the finished
    response into a 500, logged as a second request line after the first's 200."""
    (tmp_path / "latin1_header_agent.py").write_text(DOWNLOAD_AGENT)
    monkeypatch.syspath_prepend(str(tmp_path))
    handler, key = process_handler(["process"], AGENT_APP="latin1_header_agent:app")
    bearer = f"Bearer {key}"
    alb_single = _alb_event("GET", "/download", {})
    alb_single["headers"] = {"host": "alb.example.com", "authorization": bearer}
    alb_single["queryStringParameters"] = alb_single.pop("multiValueQueryStringParameters")
    del alb_single["multiValueHeaders"]
    events = [
        ("GET", function_url_event("GET", "/download", headers={"authorization": bearer})),
        ("HEAD", function_url_event("HEAD", "/download", headers={"authorization": bearer})),
        ("GET", _rest_event(key, path="/download")),
        ("GET", _http_api_v1_event(key, "/download", "$default", _API)),
        ("GET", _alb_event("GET", "/download", {"authorization": [bearer]})),
        ("GET", alb_single),
    ]
    for method, event in events:
        request_log.readouterr()
        answer = handler(event, None)
        assert answer["statusCode"] == 200, answer
        headers = answer.get("headers") or {}
        headers.update({k: v[-1] for k, v in (answer.get("multiValueHeaders") or {}).items()})
        assert headers["content-disposition"] == 'attachment; filename="café.txt"', answer
        assert answer["body"] == ("" if method == "HEAD" else "hi")
        assert _request_lines(request_log) == [(method, "/download", 200)]


def _payload_bytes(answer: dict[str, Any]) -> int:
    """The bytes Lambda counts of a buffered answer (its JSON, as the runtime writes it)."""
    return len(json.dumps(answer, ensure_ascii=False).encode())


def test_a_response_larger_than_lambda_returns_is_a_500_saying_to_ask_for_less(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    handler, key = sessions_handler
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    # 14 messages of 500 KB of UTF-8 (each under the 1 MB request limit): a 7 MB session.
    body = json.dumps(
        {"messages": [{"role": "user", "content": "é" * 250_000}]}, ensure_ascii=False
    )
    for _ in range(14):
        appended = handler(
            function_url_event("POST", "/sessions/big/messages", headers=headers, body=body), None
        )
        assert appended["statusCode"] == 201, appended["body"][:200]
    events = [
        function_url_event("GET", "/sessions/big", headers=headers),
        _rest_event(key, path="/sessions/big"),
        _alb_event("GET", "/sessions/big", {"authorization": [f"Bearer {key}"]}),
    ]
    for event in events:
        answer = handler(event, None)
        assert answer["statusCode"] == 500
        assert _payload_bytes(answer) < RESPONSE_LIMIT_BYTES
        error = json.loads(answer["body"])["error"]
        assert error["code"] == "RESPONSE_TOO_LARGE"
        assert "a page at a time" in error["message"]
        answered = {k: v[0] for k, v in (answer.get("multiValueHeaders") or {}).items()}
        answered.update(answer.get("headers") or {})
        assert answered["x-should-retry"] == "false"  # OpenAI's SDKs retry a 500 otherwise
        assert answered["x-request-id"]
        assert answered["cache-control"] == "no-store"
    page = handler(
        function_url_event("GET", "/sessions/big/messages", headers=headers, query="limit=3"), None
    )
    assert page["statusCode"] == 200
    assert len(json.loads(page["body"])["items"]) == 3


def test_head_answers_as_get_of_a_response_larger_than_lambda_returns(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    """HEAD said 200 (its body, which was measured, being empty) where GET said 500."""
    handler, key = sessions_handler
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    body = json.dumps({"messages": [{"role": "user", "content": "h" * 900_000}]})
    for _ in range(8):
        appended = handler(
            function_url_event("POST", "/sessions/head-big/messages", headers=headers, body=body),
            None,
        )
        assert appended["statusCode"] == 201, appended["body"][:200]
    get = handler(function_url_event("GET", "/sessions/head-big", headers=headers), None)
    head = handler(function_url_event("HEAD", "/sessions/head-big", headers=headers), None)
    assert get["statusCode"] == head["statusCode"] == 500
    assert head["body"] == ""
    assert head["headers"]["x-should-retry"] == get["headers"]["x-should-retry"] == "false"
    assert head["headers"]["content-type"] == get["headers"]["content-type"]
    page = function_url_event(
        "HEAD", "/sessions/head-big/messages", headers=headers, query="limit=2"
    )
    small = handler(page, None)
    assert small["statusCode"] == 200 and small["body"] == ""


def test_a_response_larger_than_an_alb_takes_is_a_500_saying_to_ask_for_less(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    """An ALB takes at most 1 MB from a Lambda function (its caller gets a 502 otherwise),
    where a Function URL takes 6 MB."""
    handler, key = sessions_handler
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    body = json.dumps({"messages": [{"role": "user", "content": "a" * 400_000}]})
    for _ in range(3):
        appended = handler(
            function_url_event("POST", "/sessions/alb-big/messages", headers=headers, body=body),
            None,
        )
        assert appended["statusCode"] == 201, appended["body"][:200]
    whole = handler(function_url_event("GET", "/sessions/alb-big", headers=headers), None)
    assert whole["statusCode"] == 200
    answer = handler(
        _alb_event("GET", "/sessions/alb-big", {"authorization": [f"Bearer {key}"]}), None
    )
    assert answer["statusCode"] == 500, _payload_bytes(answer)
    assert _payload_bytes(answer) < ALB_RESPONSE_LIMIT_BYTES <= 1_000_000
    error = json.loads(answer["body"])["error"]
    assert error["code"] == "RESPONSE_TOO_LARGE"
    assert "a page at a time" in error["message"]
    assert answer["multiValueHeaders"]["x-should-retry"] == ["false"]


@pytest.fixture
def request_log(capsys: pytest.CaptureFixture[str]) -> Iterator[pytest.CaptureFixture[str]]:
    """The output, with the request lines logged (the tests log nothing below CRITICAL)."""
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield capsys
    finally:
        logger.setLevel(level)


def _request_lines(capsys: pytest.CaptureFixture[str]) -> list[tuple[Any, Any, Any]]:
    """The method, path and status of the request lines logged since the last read."""
    lines = [
        json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")
    ]
    return [
        (line["method"], line["path"], line["status"])
        for line in lines
        if line.get("message") == "request"
    ]


def test_a_function_that_cannot_start_answers_503_then_starts_once_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request_log: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AUTH_KEYS_BACKEND", "file")
    monkeypatch.setenv("AUTH_KEYS_FILE", str(tmp_path / "keys.json"))
    monkeypatch.setenv("SESSION_HISTORY_BACKEND", "in_memory")
    monkeypatch.setenv("RUNS_BACKEND", "cassandra")  # a setting that stops the start
    handler = make_handler(["sessions", "runs"])
    request_log.readouterr()
    answer = handler(function_url_event("GET", "/health"), None)
    assert answer["statusCode"] == 503
    assert _request_lines(request_log) == [("GET", "/health", 503)]
    assert json.loads(answer["body"])["error"] == {
        "code": "UNAVAILABLE",
        "message": "the function could not start",
        "type": "server_error",
        "param": None,
    }
    assert "cassandra" not in answer["body"] and "Traceback" not in answer["body"]
    assert handler(_rest_event("key", path="/sessions/a%20b"), None)["statusCode"] == 503
    assert _request_lines(request_log) == [("GET", "/sessions/a b", 503)]
    monkeypatch.setenv("RUNS_BACKEND", "in_memory")
    assert handler(function_url_event("GET", "/health"), None)["statusCode"] == 200


def test_the_streaming_function_that_cannot_start_answers_503_then_starts_once_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request_log: pytest.CaptureFixture[str]
) -> None:
    """The streaming function's server (run.sh: uvicorn behind the Web Adapter) keeps
    serving when the application cannot start, answering as the buffered functions do:
    exiting, it left Lambda to answer a bare 502 and start the function again."""
    monkeypatch.setenv("AUTH_KEYS_BACKEND", "file")
    monkeypatch.setenv("AUTH_KEYS_FILE", str(tmp_path / "keys.json"))
    monkeypatch.setenv("SESSION_HISTORY_BACKEND", "in_memory")
    monkeypatch.setenv("RUNS_BACKEND", "cassandra")  # a setting that stops the start
    app = build_web_adapter_app(["sessions", "runs"])  # what uvicorn's --factory calls
    with TestClient(app) as client:  # runs the lifespan, as uvicorn does
        request_log.readouterr()
        answer = client.get("/health")
        assert answer.status_code == 503
        assert _request_lines(request_log) == [("GET", "/health", 503)]
        assert answer.json()["error"]["code"] == "UNAVAILABLE"
        assert answer.headers["x-request-id"]
        assert "cassandra" not in answer.text and "Traceback" not in answer.text
        monkeypatch.setenv("RUNS_BACKEND", "in_memory")
        assert client.get("/health").status_code == 200


@pytest.mark.parametrize("function", ["buffered", "streaming"])
def test_a_function_that_cannot_start_counts_its_503_as_an_error_under_the_clients_id(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request_log: pytest.CaptureFixture[str],
    function: str,
) -> None:
    # Its 503 wrote no Errors metric, and the buffered function's request line left out the
    # id the client sent, the streaming function's its X-Ray trace id.
    monkeypatch.setenv("AUTH_KEYS_BACKEND", "file")
    monkeypatch.setenv("AUTH_KEYS_FILE", str(tmp_path / "keys.json"))
    monkeypatch.setenv("METRICS_NAMESPACE", "Tests")
    monkeypatch.setenv("RUNS_BACKEND", "cassandra")  # a setting that stops the start
    xray = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    headers = {"X-Request-Id": "client-5", "X-Amzn-Trace-Id": xray}
    request_log.readouterr()
    if function == "buffered":
        monkeypatch.setenv("_X_AMZN_TRACE_ID", xray)
        event = function_url_event("GET", "/health", headers=headers)
        answer = make_handler(["sessions", "runs"])(event, LambdaContext(60, "invocation-5"))
        assert answer["statusCode"] == 503
    else:
        # As the Web Adapter forwards an invocation, with what the client sent.
        invocation = {"request_id": "invocation-5", "deadline": int((time.time() + 60) * 1000)}
        headers["x-amzn-lambda-context"] = json.dumps(invocation)
        with TestClient(build_web_adapter_app(["sessions", "runs"])) as client:
            assert client.get("/health", headers=headers).status_code == 503
    lines = _lines(request_log)
    (request,) = [line for line in lines if line.get("message") == "request"]
    assert request["client_request_id"] == "client-5"
    assert request["xray_trace_id"] == "1-5759e988-bd862e3fe1be46a994272793"
    (metric,) = [line for line in lines if "_aws" in line]
    assert (metric["Errors"], metric["Code"]) == (1, "UNAVAILABLE")


@pytest.mark.parametrize("function", ["buffered", "streaming"])
def test_a_function_that_cannot_start_for_a_setting_logs_it_in_one_line_without_a_traceback(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request_log: pytest.CaptureFixture[str],
    function: str,
) -> None:
    # Logged with its traceback, the cause was only the traceback's last line.
    monkeypatch.setenv("AUTH_KEYS_BACKEND", "file")
    monkeypatch.setenv("AUTH_KEYS_FILE", str(tmp_path / "keys.json"))
    monkeypatch.setenv("MAX_REQUEST_BYTES", "1GB")
    request_log.readouterr()
    if function == "buffered":
        answer = make_handler(["sessions"])(function_url_event("GET", "/health"), None)
        assert answer["statusCode"] == 503
    else:
        with TestClient(build_web_adapter_app(["sessions"])) as client:
            assert client.get("/health").status_code == 503
    failures = [line for line in _lines(request_log) if line["level"] == "ERROR"]
    assert failures, "nothing logged"
    for line in failures:
        assert line["message"] == (
            "the function could not start: invalid settings: MAX_REQUEST_BYTES: Input should "
            "be a valid integer, unable to parse string as an integer"
        )
        assert "exception" not in line, line


def test_a_function_that_cannot_start_for_an_unexpected_error_logs_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request_log: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AUTH_KEYS_BACKEND", "file")
    monkeypatch.setenv("AUTH_KEYS_FILE", str(tmp_path / "keys.json"))
    # A Secrets Manager that does not answer: no setting is wrong.
    monkeypatch.setenv("SECRETS_ARN", "arn:aws:secretsmanager:us-east-1:123456789012:secret:s")
    monkeypatch.setenv("SECRETS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    request_log.readouterr()
    answer = make_handler(["sessions"])(function_url_event("GET", "/health"), None)
    assert answer["statusCode"] == 503
    (line,) = [line for line in _lines(request_log) if line["level"] == "ERROR"]
    assert line["message"] == "the function could not start"
    assert line["exception"].startswith("Traceback"), line


def test_following_a_run_ends_before_the_functions_time_limit(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    handler, key = sessions_handler
    headers = {"authorization": f"Bearer {key}"}
    # A run another instance executes: stored, in progress, its next event not come yet.
    app = handler._app  # type: ignore[attr-defined]
    runs = app.state.context.runs
    record = RunRecord(id="run-elsewhere", user_id="event-user", session_id="s")
    handler._loop.run_until_complete(runs.create_run(record))  # type: ignore[attr-defined]
    handler._loop.run_until_complete(  # type: ignore[attr-defined]
        runs.append_events("event-user", "run-elsewhere", [(0, '{"sequence_number":0}')])
    )
    started = time.monotonic()
    # An invocation with 2 s left: TIME_LIMIT_MARGIN_SECONDS (5) is more, so the follower
    # has half of them, and stops after 1 s with what was stored.
    answer = handler(
        function_url_event("GET", "/runs/run-elsewhere/events", headers=headers),
        LambdaContext(2.0),
    )
    assert 0.5 < time.monotonic() - started < 1.9
    assert answer["statusCode"] == 200
    assert answer["body"] == 'id: 0\ndata: {"sequence_number":0}\n\n'  # resume after id 0
    loop = handler._loop  # type: ignore[attr-defined]
    assert not [task for task in asyncio.all_tasks(loop) if not task.done()]


def test_a_stream_failing_midway_keeps_what_was_sent(
    sessions_handler: tuple[LambdaHandler, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    handler, key = sessions_handler
    runs = handler._app.state.context.runs  # type: ignore[attr-defined]
    loop = handler._loop  # type: ignore[attr-defined]
    loop.run_until_complete(runs.create_run(RunRecord(id="run-broken", user_id="event-user")))
    loop.run_until_complete(
        runs.append_events("event-user", "run-broken", [(0, '{"sequence_number":0}')])
    )
    following = runs.follow

    async def follow_then_fail(*args: Any, **kwargs: Any) -> Any:
        async for item in following(*args, **kwargs):
            yield item
            raise ConnectionError("the store went away")

    monkeypatch.setattr(runs, "follow", follow_then_fail)
    event = function_url_event(
        "GET", "/runs/run-broken/events", headers={"authorization": f"Bearer {key}"}
    )
    answer = handler(event, None)
    # As a server cutting the connection: the events sent stay, for the client to resume
    # after (Mangum made it a plain-text 500 of nothing else).
    assert answer["statusCode"] == 200
    assert answer["headers"]["content-type"].startswith("text/event-stream")
    assert answer["body"] == 'id: 0\ndata: {"sequence_number":0}\n\n'


def test_a_head_request_for_health_is_answered_without_a_body(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    """Uptime monitors probe with HEAD (UptimeRobot's default): /health answered it 405,
    which they report as the function down. It answers as GET does, without the body."""
    handler, _ = sessions_handler
    get = handler(function_url_event("GET", "/health"), None)
    head = handler(function_url_event("HEAD", "/health"), None)
    assert head["statusCode"] == get["statusCode"] == 200, head
    assert head["body"] == ""
    assert head["headers"]["content-type"] == "application/json"
    assert head["headers"]["content-length"] == str(len(get["body"].encode()))


def _lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """The JSON lines logged since the last read."""
    out = capsys.readouterr().out
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_a_requests_lines_carry_its_invocations_id_and_the_clients_beside_it(
    sessions_handler: tuple[LambdaHandler, str], request_log: pytest.CaptureFixture[str]
) -> None:
    """A client sending X-Request-Id had its id on every line instead of the invocation's:
    no line could be joined to Lambda's own (START, END, REPORT), and a client could give
    its request another request's id."""
    handler, key = sessions_handler
    request_log.readouterr()
    for sent, client_id in (("client-7", "client-7"), ("bad id\t!", None), (None, None)):
        headers = {"authorization": f"Bearer {key}"}
        if sent is not None:
            headers["x-request-id"] = sent
        event = function_url_event("GET", "/sessions/nowhere", headers=headers)
        answer = handler(event, LambdaContext(60, "invocation-7"))
        assert answer["statusCode"] == 404
        assert answer["headers"]["x-request-id"] == "invocation-7"
        (line,) = [line for line in _lines(request_log) if line["message"] == "request"]
        assert line["request_id"] == "invocation-7"
        assert line.get("client_request_id") == client_id


def test_a_requests_lines_carry_the_xray_trace_id_of_its_invocation(
    sessions_handler: tuple[LambdaHandler, str],
    request_log: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As Powertools' lines: Lambda sets the invocation's X-Ray trace header in the process,
    its Root is ``xray_trace_id``, whatever header the client sent."""
    handler, key = sessions_handler
    root = "1-6759e988-cd862e3fe1be46a994272793"
    monkeypatch.setenv("_X_AMZN_TRACE_ID", f"Root={root};Parent=53995c3f42cd8ad8;Sampled=1")
    request_log.readouterr()
    forged = "Root=1-00000000-000000000000000000000000"
    headers = {"authorization": f"Bearer {key}", "x-amzn-trace-id": forged}
    event = function_url_event("GET", "/sessions/nowhere", headers=headers)
    assert handler(event, LambdaContext(60, "invocation-11"))["statusCode"] == 404
    assert handler({"Records": []}, LambdaContext(60, "invocation-12"))["error"]
    lines = _lines(request_log)
    assert [line["message"] for line in lines] == [
        "request",
        "an event of an unsupported kind was refused",
    ]
    assert all(line["xray_trace_id"] == root for line in lines), lines


def test_a_failed_requests_line_says_its_code_and_caller_in_the_application_or_before(
    sessions_handler: tuple[LambdaHandler, str], request_log: pytest.CaptureFixture[str]
) -> None:
    handler, key = sessions_handler
    request_log.readouterr()
    event = function_url_event(
        "GET", "/sessions/nowhere", headers={"authorization": f"Bearer {key}"}
    )
    assert handler(event, LambdaContext(60))["statusCode"] == 404
    handler(_event(key, "not base64!", base64=True), LambdaContext(60))
    failed = [line for line in _lines(request_log) if line["message"] == "request"]
    assert [(line["status"], line["code"], line.get("user_id")) for line in failed] == [
        (404, "SESSION_NOT_FOUND", "event-user"),
        (400, "BAD_REQUEST", None),  # refused before the application: no caller known
    ]


def test_a_request_refused_before_the_application_logs_the_clients_id_of_an_alb_event(
    sessions_handler: tuple[LambdaHandler, str], request_log: pytest.CaptureFixture[str]
) -> None:
    """An ALB with multi-value headers turned on sends ``multiValueHeaders`` and no
    ``headers``: the line of a request refused before the application (a body not base64)
    left out the ``X-Request-Id`` its client sent."""
    handler, key = sessions_handler
    sent = {"authorization": [f"Bearer {key}"], "x-request-id": ["client-13"]}
    event = _alb_event("POST", "/sessions", sent)
    event.update(body="!!not base64", isBase64Encoded=True)
    request_log.readouterr()
    answer = handler(event, LambdaContext(60, "invocation-13"))
    assert answer["statusCode"] == 400, answer
    (line,) = [line for line in _lines(request_log) if line["message"] == "request"]
    assert (line["request_id"], line["status"]) == ("invocation-13", 400)
    assert line.get("client_request_id") == "client-13"


def test_an_event_refused_as_no_request_is_logged_with_its_invocations_id(
    sessions_handler: tuple[LambdaHandler, str], request_log: pytest.CaptureFixture[str]
) -> None:
    handler, _ = sessions_handler
    handler(function_url_event("GET", "/health"), LambdaContext(60, "invocation-before"))
    request_log.readouterr()
    answer = handler({"Records": []}, LambdaContext(60, "invocation-8"))
    assert answer["error"]["code"] == "UNSUPPORTED_EVENT"
    (line,) = _lines(request_log)
    assert line["message"] == "an event of an unsupported kind was refused"
    assert line["request_id"] == "invocation-8"


def test_the_streaming_functions_lines_carry_the_invocations_id_started_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request_log: pytest.CaptureFixture[str]
) -> None:
    """The streaming function that could not start answered and logged under an id of its
    own, and once started under the id its client sent: neither was the invocation's."""
    monkeypatch.setenv("AUTH_KEYS_BACKEND", "file")
    monkeypatch.setenv("AUTH_KEYS_FILE", str(tmp_path / "keys.json"))
    monkeypatch.setenv("SESSION_HISTORY_BACKEND", "in_memory")
    monkeypatch.setenv("RUNS_BACKEND", "cassandra")  # a setting that stops the start
    app = build_web_adapter_app(["sessions", "runs"])

    def invoked(request_id: str) -> dict[str, str]:
        # As the Web Adapter forwards an invocation, with what the client sent.
        deadline = int((time.time() + 60) * 1000)
        context = json.dumps({"request_id": request_id, "deadline": deadline})
        return {"x-amzn-lambda-context": context, "X-Request-Id": "client-9"}

    with TestClient(app) as client:
        request_log.readouterr()
        answer = client.get("/health", headers=invoked("invocation-9"))
        assert answer.status_code == 503
        assert answer.headers["x-request-id"] == "invocation-9"
        lines = _lines(request_log)
        assert [line["message"].partition(":")[0] for line in lines] == [
            "the function could not start",
            "request",
        ]
        assert all(line["request_id"] == "invocation-9" for line in lines), lines
        assert all(line["client_request_id"] == "client-9" for line in lines), lines
        (request,) = [line for line in lines if line["message"] == "request"]
        assert request["code"] == "UNAVAILABLE"
        monkeypatch.setenv("RUNS_BACKEND", "in_memory")
        answer = client.get("/health", headers=invoked("invocation-10"))
        assert answer.status_code == 200
        assert answer.headers["x-request-id"] == "invocation-10"
        (request,) = _lines(request_log)
        assert request["request_id"] == "invocation-10"
        assert request["client_request_id"] == "client-9"
