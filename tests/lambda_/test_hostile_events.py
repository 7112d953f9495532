"""Function URL and API Gateway events whose request cannot be decoded get a 400 JSON error.

Mangum decodes the body and encodes the headers, path and query string before the
application sees them; a failure there was an invocation error, which a Function URL caller
gets as a 502 without a body. The handler is the one ``functions/sessions/app.py`` builds.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentscope_serverless.auth.file import FileKeyStore
from agentscope_serverless.http.lambda_handler import LambdaHandler, make_handler
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
        handler = make_handler(["sessions"])
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
    error: dict[str, Any] = json.loads(response["body"])["error"]
    assert error["code"] == "BAD_REQUEST"
    return error


def test_a_body_marked_base64_that_is_not_base64_gets_400(
    sessions_handler: tuple[LambdaHandler, str],
) -> None:
    handler, key = sessions_handler
    error = _error(handler(_event(key, "!!not base64", base64=True), None))
    assert "base64" in error["message"]


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
